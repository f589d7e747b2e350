//! Shared in-flight load: every router replica reserves its requests on the indexer (in the
//! RecordRoute of each pick) and releases them at the first response byte (their prefill) and
//! at the end, and every replica's cost counts the reservations of all of them.
//!
//! A cold burst of prompts sharing a system prompt, sent through two routers in turn, spreads
//! over four pods; with each router counting only its own requests (`--reservation-ttl-ms 0`,
//! the control that shows the test can fail) the second router sends its prompt to the pod the
//! first one just loaded. Releases are watched in the indexer's own answer (ScoreTokens'
//! `in_flight`, read over gRPC), through the proxy and the ext_proc door; a router killed with
//! requests in flight leaves reservations that end at their TTL. The pods are real `kvindex-sim`
//! engines prefilling slowly, so nothing is answered while the test looks.

mod support;

use std::collections::BTreeMap;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use kvindex_proto::kvindex::v1 as pb;
use serde_json::{json, Value};
use support::ext_proc::{connect, pick_on, response_body, response_headers, PickerProcess, Stream};
use support::*;

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
