//! Shared in-flight load: every router replica reserves its requests on the indexer (in the
//! RecordRoute of each pick) and releases them at the first response byte (their prefill) and
//! at the end, and every replica's cost counts the reservations of all of them.
//!
//! A cold burst of prompts sharing a system prompt, sent through two routers in turn, spreads
//! over four pods; with each router counting only its own requests (`--reservation-ttl-ms 0`,
//! the control that shows the test can fail) the second router sends its prompt to the pod the
//! first one just loaded. Releases are watched in the indexer's own answer (ScoreTokens'
//! `in_flight`, read over gRPC), through the proxy and the ext_proc door; a router killed with
//! requests in flight leaves reservations that end at their TTL; a second indexer holds every
//! reservation too, and with no indexer answering a router places by its own counts. The pods are real `kvindex-sim`
//! engines prefilling slowly, so nothing is answered while the test looks.

use crate::support;

use std::collections::BTreeMap;

use crate::support::ext_proc::{
    body, connect, headers, pick_on, post_headers, response_body, response_headers, PickerProcess, Stream,
};
use crate::support::*;
use bytes::Bytes;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{processing_request, ProcessingRequest, ProtocolConfiguration};
use http_body_util::{BodyExt, Full};
use kvindex_loadtest::kvindex_service::http_with;
use kvindex_proto::kvindex::v1 as pb;
use serde_json::{json, Value};

const MODEL: &str = "sim/model";
/// The system prompt every prompt of the burst starts with: 8 blocks.
const SHARED: u32 = 128;

fn prompt(seed: u32, unique: u32) -> Vec<u32> {
    (0..SHARED).map(|t| 10_000 + t).chain((0..unique).map(|t| 20_000 + 1_000 * seed + t)).collect()
}

/// Each pod's (reserved requests, prefill blocks) as the indexer answers them to any router.
async fn in_flight(indexer: &str) -> BTreeMap<String, (u32, u64)> {
    let mut client = pb::indexer_client::IndexerClient::connect(format!("http://{indexer}")).await.expect("indexer");
    let answer = client
        .score_tokens(pb::ScoreTokensRequest { model: MODEL.into(), ..Default::default() })
        .await
        .expect("ScoreTokens")
        .into_inner();
    let pods = answer.in_flight.expect("reservations are on").pods;
    pods.into_iter().map(|p| (p.pod, (p.requests, p.prefill_blocks))).collect()
}

/// Waits until the indexer answers exactly `expected`.
async fn wait_in_flight(indexer: &str, what: &str, expected: &[(&str, (u32, u64))]) {
    let expected: BTreeMap<String, (u32, u64)> = expected.iter().map(|(p, l)| (p.to_string(), *l)).collect();
    wait_for(what, DEADLINE, || {
        let expected = expected.clone();
        async move { (in_flight(indexer).await == expected).then_some(()) }
    })
    .await;
}

/// Sends `body` through `router` in the background and returns the pod it was sent to, once
/// the router counts it in flight there, its RecordRoute (credit and reservation) has been
/// answered, and `watchers` have all scraped the pod busy.
async fn send(
    router: &RouterProcess,
    watchers: &[&RouterProcess],
    ids: &[String],
    body: Value,
) -> (String, tokio::task::JoinHandle<Reply>) {
    let before: Vec<u64> = {
        let mut v = Vec::new();
        for id in ids {
            v.push(router_pod(&router.http, id).await["load"]["inflight"].as_u64().unwrap_or(0));
        }
        v
    };
    let recorded = metric(&router.http, "kvindex_router_record_route_total", &["outcome=\"ok\""]).await;
    let task = {
        let addr = router.http.clone();
        tokio::spawn(async move { post(&addr, "/v1/completions", &body).await })
    };
    let pod = wait_for("the router to send the request", DEADLINE, || {
        let (addr, before) = (router.http.clone(), before.clone());
        async move {
            for (id, was) in ids.iter().zip(before) {
                if router_pod(&addr, id).await["load"]["inflight"].as_u64() > Some(was) {
                    return Some(id.clone());
                }
            }
            None
        }
    })
    .await;
    wait_for("the pick's RecordRoute", DEADLINE, || async {
        (metric(&router.http, "kvindex_router_record_route_total", &["outcome=\"ok\""]).await > recorded).then_some(())
    })
    .await;
    for watcher in watchers {
        wait_for("the routers to scrape the pod busy", DEADLINE, || {
            let (addr, pod) = (watcher.http.clone(), pod.clone());
            async move { (router_pod(&addr, &pod).await["load"]["running"].as_f64() >= Some(1.0)).then_some(()) }
        })
        .await;
    }
    (pod, task)
}

/// Four cold prompts sharing the system prompt, sent through routers a, b, a, b, each after the
/// previous one is in flight and seen by both; returns the pods they went to and b's
/// explanation for the second.
async fn burst(bins: &Bins, extra: &[&str]) -> (Vec<String>, Value) {
    // 20 prompt tokens per second: each prompt takes 19 s to prefill, longer than the test looks.
    let stack = Stack::start(bins, 4, &["--model", MODEL, "--prefill-tokens-per-s", "20"]).await;
    // Every pod publishes once (a one-block prompt of its own), so the indexer has its source
    // and credits picks of it.
    for (i, pod) in stack.sim.pods.iter().enumerate() {
        let prompt: Vec<u32> = (0..16).map(|t| 900_000 + 100 * i as u32 + t).collect();
        let reply =
            post(&pod.http, "/v1/completions", &json!({"model": MODEL, "prompt": prompt, "max_tokens": 1})).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
    }
    stack.settle().await;
    let mut args = stack.router_args();
    args.extend(["--scrape-interval-ms", "20", "--score-deadline-ms", "500"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    let (a, b) = (router(bins, &args), router(bins, &args));
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&a.http, &ids).await;
    wait_scraped(&b.http, &ids).await;
    // Two tokens at least: the sim's step that prefills a one-token request also ends it, so
    // its scrapes would never show it running.
    let body = |seed| json!({"model": MODEL, "prompt": prompt(seed, 256), "max_tokens": 4});
    let mut pods = Vec::new();
    let mut tasks = Vec::new();
    let mut explained = Value::Null;
    for seed in 0..4 {
        let (through, other) = if seed % 2 == 0 { (&a, &b) } else { (&b, &a) };
        if seed == 1 {
            explained = post(&b.http, "/route/v1/completions", &body(seed)).await.json();
        }
        let (pod, task) = send(through, &[through, other], &ids, body(seed)).await;
        pods.push(pod);
        tasks.push(task);
    }
    for task in tasks {
        task.abort();
    }
    (pods, explained)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routers_see_each_others_requests_and_spread_a_cold_burst() {
    let (pods, explained) = burst(&bins(), &[]).await;
    let distinct: std::collections::BTreeSet<&String> = pods.iter().collect();
    assert_eq!(distinct.len(), 4, "each prompt on a pod of its own: {pods:?}");
    // Router b, placing the second prompt, saw router a's first one on its pod: one request
    // with its 24 blocks still to prefill (every block: nothing was cached).
    let first = explained["ranked"].as_array().unwrap().iter().find(|c| c["pod"] == pods[0].as_str()).unwrap();
    assert_eq!(first["shared"], json!({"requests": 1, "prefill_blocks": 24}), "{explained}");
    assert_ne!(explained["ranked"][0]["pod"], pods[0].as_str(), "{explained}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_own_counts_only_the_second_router_piles_onto_the_first_routers_pod() {
    let (pods, explained) = burst(&bins(), &["--reservation-ttl-ms", "0"]).await;
    assert_eq!(pods[1], pods[0], "b saw nothing of a's request but its credit: {pods:?}");
    assert!(explained["ranked"][0]["shared"].is_null(), "{explained}");
}

/// A streamed request through the proxy, its events reported on `events` as they happen:
/// `head`, then `chunk` for each non-empty body frame, then `end`.
fn stream(router: &str, body: Value, events: tokio::sync::mpsc::UnboundedSender<&'static str>) {
    let request = hyper::Request::post(format!("http://{router}/v1/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    tokio::spawn(async move {
        let response = client().request(request).await.expect("routed request");
        assert_eq!(response.status(), 200);
        let _ = events.send("head");
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            if frame.expect("frame").data_ref().is_some_and(|d| !d.is_empty()) {
                let _ = events.send("chunk");
            }
        }
        let _ = events.send("end");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_releases_the_prefill_at_the_first_byte_and_the_request_at_its_end() {
    let bins = bins();
    // 32 tokens a second: the 8-block prompt's first byte comes after 4 s; then 6 tokens, 400 ms each.
    let stack =
        Stack::start(&bins, 1, &["--model", MODEL, "--prefill-tokens-per-s", "32", "--decode-ms-per-token", "400"])
            .await;
    let pod = stack.sim.pods[0].pod_id.clone();
    let router = router(&bins, &stack.router_args());
    wait_scraped(&router.http, std::slice::from_ref(&pod)).await;
    let indexer = stack.kv.grpc_addr.clone();
    assert_eq!(in_flight(&indexer).await, BTreeMap::new());

    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let body = json!({"model": MODEL, "prompt": (0..128).map(|t| 3_000 + t).collect::<Vec<u32>>(), "max_tokens": 6, "stream": true});
    stream(&router.http, body, tx);
    wait_in_flight(&indexer, "the request reserved with its 8 blocks", &[(&pod, (1, 8))]).await;
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    assert!(!seen.contains(&"chunk"), "reserved with its prefill before its first byte: {seen:?}");
    while seen.last() != Some(&"chunk") {
        seen.push(tokio::time::timeout(DEADLINE, events.recv()).await.expect("the first chunk in time").unwrap());
    }
    wait_in_flight(&indexer, "the prefill released at the first byte", &[(&pod, (1, 0))]).await;
    assert_ne!(events.try_recv(), Ok("end"), "the request was still streaming");
    while seen.last() != Some(&"end") {
        seen.push(tokio::time::timeout(DEADLINE, events.recv()).await.expect("the end in time").unwrap());
    }
    wait_in_flight(&indexer, "the request released at its end", &[]).await;
    assert!(metric(&router.http, "kvindex_router_releases_total", &["outcome=\"released\""]).await >= 2.0);
    assert!(metric(&stack.kv.http_addr, "kvindex_reservations_total", &["result=\"reserved\""]).await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_dies_leaves_reservations_that_end_at_their_ttl() {
    let bins = bins();
    let stack = Stack::start(&bins, 2, &["--model", MODEL, "--prefill-tokens-per-s", "20"]).await;
    let mut args = stack.router_args();
    args.extend(["--reservation-ttl-ms", "8000", "--score-deadline-ms", "500"].map(String::from));
    let mut router = router(&bins, &args);
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&router.http, &ids).await;
    let indexer = stack.kv.grpc_addr.clone();
    for seed in 0..2 {
        let (addr, body) = (router.http.clone(), json!({"model": MODEL, "prompt": prompt(seed, 256), "max_tokens": 4}));
        tokio::spawn(async move { post(&addr, "/v1/completions", &body).await });
    }
    wait_for("both requests reserved", DEADLINE, || async {
        (in_flight(&indexer).await.values().map(|l| l.0).sum::<u32>() == 2).then_some(())
    })
    .await;
    router.process.kill();
    // Nobody releases them now: they stay until their TTL.
    assert_eq!(in_flight(&indexer).await.values().map(|l| l.0).sum::<u32>(), 2, "not released by anyone");
    wait_in_flight(&indexer, "the dead router's reservations to expire", &[]).await;
    assert_eq!(metric(&stack.kv.http_addr, "kvindex_reservations_expired_total", &[]).await, 2.0);
    assert_eq!(metric(&stack.kv.http_addr, "kvindex_reservation_releases_total", &[]).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_picker_releases_on_the_response_envoy_shows_it() {
    let bins = bins();
    let stack = Stack::start(&bins, 2, &["--model", MODEL]).await;
    let mut args = stack.router_args();
    args.extend(["--scrape-interval-ms", "20", "--score-deadline-ms", "500"].map(String::from));
    let picker = PickerProcess::start(&bins, &args);
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&picker.http, &ids).await;
    let indexer = stack.kv.grpc_addr.clone();
    let mut client = connect(&picker.ext_proc).await;
    // 12 blocks of their own each: no credit of the first makes the second cheaper anywhere.
    let request = |seed: u32| {
        json!({"model": MODEL, "prompt": (0..192).map(|t| 50_000 * seed + t).collect::<Vec<u32>>(), "max_tokens": 4})
            .to_string()
    };

    // Full duplex (no protocol_config): the prefill ends at the response body's first bytes,
    // the request at its end.
    let mut stream = Stream::open(&mut client).await;
    let answers = pick_on(&mut stream, "/v1/completions", request(1).as_bytes()).await;
    let pod = support::ext_proc::destination(&answers[0]).expect("a pick");
    wait_in_flight(&indexer, "the pick reserved with its 12 blocks", &[(&pod, (1, 12))]).await;
    stream.send(response_headers("200")).await;
    stream.recv().await.unwrap().expect("headers answer");
    wait_in_flight(&indexer, "nothing released at the head (a body follows)", &[(&pod, (1, 12))]).await;
    stream.send(response_body(b"data: {}\n\n", false)).await;
    stream.recv().await.unwrap().expect("body answer");
    wait_in_flight(&indexer, "the prefill released at the first body bytes", &[(&pod, (1, 0))]).await;
    stream.send(response_body(b"data: [DONE]\n\n", true)).await;
    stream.recv().await.unwrap().expect("last body answer");
    wait_in_flight(&indexer, "the request released at the end of the response", &[]).await;

    // A gateway stream that goes away before its response: the request is released with it.
    let mut stream = Stream::open(&mut client).await;
    let answers = pick_on(&mut stream, "/v1/completions", request(2).as_bytes()).await;
    let pod = support::ext_proc::destination(&answers[0]).expect("a pick");
    wait_in_flight(&indexer, "the second pick reserved", &[(&pod, (1, 12))]).await;
    drop(stream);
    wait_in_flight(&indexer, "the abandoned request released", &[]).await;
}

/// A second `kvindex serve` beside `stack`'s, taking the same admin token (a router sends one
/// token to every indexer) and with the stack's pods registered: it has no source of theirs, but
/// knows them, so it keeps their reservations. Returns the process and its gRPC address.
async fn sibling_indexer(bins: &Bins, stack: &Stack) -> (Serving, String) {
    let token_file = stack.kv.admin_token_file();
    let sibling = Serve::new(&bins.kvindex)
        .loopback()
        .args(["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", &BLOCK.to_string()])
        .arg("--admin-token-file")
        .arg(token_file)
        .start()
        .expect("a second kvindex serve");
    let bearer = format!("Bearer {}", std::fs::read_to_string(token_file).expect("the token").trim());
    for pod in &stack.sim.pods {
        let body = json!({"pod": pod.pod_id, "model": MODEL}).to_string();
        let (status, text) = http_with(&sibling.http, "POST", "/pods", Some(&body), &[("Authorization", &bearer)])
            .await
            .expect("POST /pods");
        assert_eq!(status, 200, "{text}");
    }
    let grpc = sibling.grpc.clone();
    (sibling, grpc)
}

/// Each pod's `shared` load in `router`'s explanation of a placement of `body` (nothing is sent).
async fn explained_shared(router: &str, body: &Value) -> BTreeMap<String, Value> {
    let explained = post(router, "/route/v1/completions", body).await.json();
    let ranked = explained["ranked"].as_array().cloned().unwrap_or_default();
    ranked.into_iter().map(|c| (c["pod"].as_str().unwrap_or_default().to_string(), c["shared"].clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_indexer_holds_the_reservations_and_without_any_the_routers_keep_their_own_counts() {
    let bins = bins();
    let mut stack = Stack::start(&bins, 3, &["--model", MODEL, "--prefill-tokens-per-s", "20"]).await;
    let (mut second, second_grpc) = sibling_indexer(&bins, &stack).await;
    let first_grpc = stack.kv.grpc_addr.clone();
    let mut args = stack.router_args();
    args.extend(
        ["--indexer", &second_grpc, "--scrape-interval-ms", "20", "--score-deadline-ms", "500"].map(String::from),
    );
    let (a, b) = (router(&bins, &args), router(&bins, &args));
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&a.http, &ids).await;
    wait_scraped(&b.http, &ids).await;
    let body = |seed| json!({"model": MODEL, "prompt": prompt(seed, 256), "max_tokens": 4});

    // Router a's request is reserved on both indexers, with its 24 blocks to prefill.
    let (pod, first) = send(&a, &[&b], &ids, body(0)).await;
    for indexer in [&first_grpc, &second_grpc] {
        wait_in_flight(indexer, "a's request reserved on every indexer", &[(&pod, (1, 24))]).await;
    }
    // The first indexer dies: router b still sees a's request, through the second one.
    stack.kv.process.kill();
    let seen = json!({"requests": 1, "prefill_blocks": 24});
    wait_for("router b to see a's request through the second indexer", DEADLINE, || async {
        (explained_shared(&b.http, &body(1)).await.get(&pod) == Some(&seen)).then_some(())
    })
    .await;

    // No indexer answers: b places by its own counts (and the scrapes), and still places.
    second.process.kill();
    let own = metric(&b.http, "kvindex_router_load_view_total", &["view=\"own\""]).await;
    wait_for("router b to place without any indexer's view", DEADLINE, || async {
        let shared = explained_shared(&b.http, &body(1)).await;
        (shared.len() == ids.len() && shared.values().all(Value::is_null)).then_some(())
    })
    .await;
    assert!(metric(&b.http, "kvindex_router_load_view_total", &["view=\"own\""]).await > own);
    // (Not `send`: nothing is recorded without an indexer.)
    let second_request = {
        let (addr, body) = (b.http.clone(), body(1));
        tokio::spawn(async move { post(&addr, "/v1/completions", &body).await })
    };
    let mine = wait_for("router b to send its request", DEADLINE, || async {
        for id in &ids {
            if router_pod(&b.http, id).await["load"]["inflight"].as_u64() == Some(1) {
                return Some(id.clone());
            }
        }
        None
    })
    .await;
    assert_ne!(mine, pod, "a's request is running there (b scraped it busy)");
    let explained = post(&b.http, "/route/v1/completions", &body(2)).await.json();
    let ranked = explained["ranked"].as_array().unwrap();
    let on_mine = ranked.iter().find(|c| c["pod"] == mine.as_str()).unwrap();
    assert_eq!(on_mine["load"]["inflight"], 1, "b's own request counts: {explained}");
    assert!(on_mine["shared"].is_null(), "{explained}");
    assert!(ranked[0]["pod"] != mine.as_str() && ranked[0]["pod"] != pod.as_str(), "the idle pod: {explained}");
    first.abort();
    second_request.abort();
}

/// `headers` as the response's (`:status`), ending the stream or not.
fn response_head(status: &str, end_of_stream: bool) -> processing_request::Request {
    match headers(&[(":status", status)], end_of_stream).request {
        Some(processing_request::Request::RequestHeaders(h)) => processing_request::Request::ResponseHeaders(h),
        other => panic!("headers are headers: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_response_body_the_endpoint_picker_releases_the_prefill_at_the_head() {
    let bins = bins();
    let stack = Stack::start(&bins, 1, &["--model", MODEL]).await;
    let pod = stack.sim.pods[0].pod_id.clone();
    let picker = PickerProcess::start(&bins, &stack.router_args());
    wait_scraped(&picker.http, std::slice::from_ref(&pod)).await;
    let indexer = stack.kv.grpc_addr.clone();
    let client = connect(&picker.ext_proc).await;
    let request = |seed: u32| {
        json!({"model": MODEL, "prompt": (0..192).map(|t| 50_000 * seed + t).collect::<Vec<u32>>(), "max_tokens": 4})
            .to_string()
    };
    // The shipped configs' mode: the request buffered, no response body shown to the picker.
    let open = |seed: u32| {
        let mut client = client.clone();
        async move {
            let mut stream = Stream::open(&mut client).await;
            let mut head = post_headers("/v1/completions");
            head.protocol_config = Some(ProtocolConfiguration {
                request_body_mode: BodySendMode::Buffered as i32,
                response_body_mode: BodySendMode::None as i32,
                ..Default::default()
            });
            stream.send(head).await;
            stream.recv().await.unwrap().expect("headers answer");
            stream.send(body(request(seed).as_bytes(), true)).await;
            stream.recv().await.unwrap().expect("the buffered body's answer, with the pick");
            stream
        }
    };

    let mut stream = open(1).await;
    wait_in_flight(&indexer, "the pick reserved with its 12 blocks", &[(&pod, (1, 12))]).await;
    stream.send(ProcessingRequest { request: Some(response_head("200", false)), ..Default::default() }).await;
    stream.recv().await.unwrap().expect("headers answer");
    wait_in_flight(&indexer, "the prefill released at the head: no body follows for the picker", &[(&pod, (1, 0))])
        .await;
    stream.tx = None;
    assert!(stream.recv().await.unwrap().is_none(), "the picker ends the stream too");
    wait_in_flight(&indexer, "the request released at the stream's end", &[]).await;

    // A reply without a body (its head ends the stream): released whole at the head.
    let mut stream = open(2).await;
    wait_in_flight(&indexer, "the second pick reserved", &[(&pod, (1, 12))]).await;
    stream.send(ProcessingRequest { request: Some(response_head("503", true)), ..Default::default() }).await;
    stream.recv().await.unwrap().expect("headers answer");
    wait_in_flight(&indexer, "the request released at a head that ends the response", &[]).await;
    drop(stream);
}
