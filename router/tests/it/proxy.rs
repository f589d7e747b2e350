//! The proxy's transport guarantees: a streamed answer reaches the client byte for byte as the
//! pod sent it, chunk by chunk without waiting for the end; a client that goes away cancels the
//! request upstream; a pod that fails before any response byte is retried on the next pod, and
//! one that fails after is not.

use std::sync::Arc;

use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tokio::sync::Notify;

/// A response recorded from a real `kvindex-sim` pod: the head to replay and the data frames.
async fn record_from_sim(bins: &Bins, body: &serde_json::Value) -> (Vec<u8>, Vec<Vec<u8>>) {
    let sim =
        SimFleet::start(&bins.sim, 1, &["--model", "sim/model", "--http-base-port", "0", "--zmq-bind-base-port", "0"])
            .expect("kvindex-sim");
    let request = hyper::Request::post(format!("http://{}/v1/completions", sim.pods[0].http))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client().request(request).await.expect("direct request");
    let mut head = format!("HTTP/1.1 {}\r\n", response.status()).into_bytes();
    for (name, value) in response.headers() {
        if !matches!(name.as_str(), "transfer-encoding" | "content-length") {
            head.extend_from_slice(format!("{name}: {}\r\n", value.to_str().unwrap()).as_bytes());
        }
    }
    head.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
    let mut body = response.into_body();
    let mut chunks = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            chunks.push(data.to_vec());
        }
    }
    assert!(chunks.len() > 2, "a streamed answer comes in several chunks");
    (head, chunks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_passes_through_byte_for_byte_and_unbuffered() {
    let bins = bins();
    let body = json!({"model": "sim/model", "prompt": (0..40).collect::<Vec<u32>>(), "max_tokens": 12, "stream": true});
    let (head, chunks) = record_from_sim(&bins, &body).await;
    let gate = Arc::new(Notify::new());
    let pod = FakePod::start(Script::Replay { head, chunks: chunks.clone(), gate: Some(gate.clone()) }).await;
    let router = router(&bins, &["--pod".into(), pod.spec()]);

    let request = hyper::Request::post(format!("http://{}/v1/completions", router.http))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client().request(request).await.expect("routed request");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["x-kvindex-pod"].to_str().unwrap(), pod.addr);
    let expected: Vec<u8> = chunks.concat();
    let mut received = Vec::new();
    let mut body_stream = response.into_body();
    // The pod holds everything after its first chunk until the gate opens: whatever arrives
    // now was passed on without waiting for the rest.
    while received.len() < chunks[0].len() {
        let frame = tokio::time::timeout(DEADLINE, body_stream.frame()).await.expect("first chunk in time");
        received.extend_from_slice(&frame.expect("frame").expect("frame").into_data().unwrap());
    }
    assert_eq!(received, chunks[0], "the first chunk arrives alone, before the pod sent the rest");
    gate.notify_one();
    while let Some(frame) = body_stream.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            received.extend_from_slice(&data);
        }
    }
    assert_eq!(String::from_utf8_lossy(&received), String::from_utf8_lossy(&expected));
    let forwarded = pod.posts();
    assert_eq!(forwarded.len(), 1);
    assert_eq!(forwarded[0].body, body.to_string().into_bytes(), "the request body is forwarded unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streamed_answer_passes_through_unchanged() {
    let bins = bins();
    let body = json!({"model": "sim/model", "prompt": "hello there", "max_tokens": 5, "return_token_ids": true});
    let sim =
        SimFleet::start(&bins.sim, 1, &["--model", "sim/model", "--http-base-port", "0", "--zmq-bind-base-port", "0"])
            .expect("kvindex-sim");
    let direct = post(&sim.pods[0].http, "/v1/completions", &body).await;
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-upstream: kept\r\ntransfer-encoding: chunked\r\n\r\n";
    let pod = FakePod::start(Script::Replay {
        head: head.as_bytes().to_vec(),
        chunks: vec![direct.body.to_vec()],
        gate: None,
    })
    .await;
    let router = router(&bins, &["--pod".into(), pod.spec()]);
    let routed = post(&router.http, "/v1/completions", &body).await;
    assert_eq!(routed.status, 200);
    assert_eq!(routed.body, direct.body);
    assert_eq!(routed.header("x-upstream"), Some("kept"), "the pod's own headers pass through");
    assert_eq!(routed.header("x-kvindex-score"), Some("no_tokenizer"), "text without a tokenizer is placed by load");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_the_upstream_request() {
    let bins = bins();
    let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    let streaming = FakePod::start(Script::Replay {
        head,
        chunks: vec![b"data: {}\n\n".to_vec(), b"data: [DONE]\n\n".to_vec()],
        gate: Some(Arc::new(Notify::new())),
    })
    .await;
    let router = router(&bins, &["--pod".into(), streaming.spec()]);
    let body = json!({"model": "m", "prompt": "x", "stream": true});

    // Streaming: the client reads the first chunk and leaves.
    let request = hyper::Request::post(format!("http://{}/v1/completions", router.http))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client().request(request).await.expect("routed request");
    let mut stream = response.into_body();
    let first = tokio::time::timeout(DEADLINE, stream.frame()).await.expect("first chunk");
    assert!(first.is_some());
    drop(stream);
    tokio::time::timeout(DEADLINE, streaming.closed.notified())
        .await
        .expect("the pod saw its connection closed mid-stream");
    wait_for("the in-flight count to return to 0", DEADLINE, || async {
        (router_pod(&router.http, &streaming.addr).await["load"]["inflight"] == 0).then_some(())
    })
    .await;
    assert!(metric(&router.http, "kvindex_router_client_disconnects_total", &[]).await >= 1.0);

    // Waiting for the head: the client gives up before the pod answers.
    *streaming.script.lock() = Script::Hang;
    let addr = router.http.clone();
    let pending = tokio::spawn(async move { post(&addr, "/v1/completions", &body).await });
    wait_for("the request to reach the pod", DEADLINE, || async { (streaming.posts().len() == 2).then_some(()) }).await;
    pending.abort();
    tokio::time::timeout(DEADLINE, streaming.closed.notified()).await.expect("the pod saw the request cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_failing_before_any_byte_is_retried_on_the_next_but_never_after_a_byte() {
    let bins = bins();
    let failing = FakePod::start(Script::Close).await;
    let healthy = FakePod::start(Script::Echo("healthy".into())).await;
    let router = router(&bins, &["--pod".into(), failing.spec(), "--pod".into(), healthy.spec()]);
    // Equal costs: rendezvous on each prompt decides who is first; send prompts until the
    // failing pod has been first a few times.
    let mut prompt = 0u32;
    while failing.posts().len() < 3 {
        prompt += 1;
        assert!(prompt < 200, "the failing pod is never ranked first");
        let reply = post(&router.http, "/v1/completions", &json!({"model": "m", "prompt": vec![prompt; 20]})).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(reply.json()["pod"], "healthy");
        assert_eq!(reply.pod(), healthy.addr, "the header names the pod that served");
    }
    assert!(metric(&router.http, "kvindex_router_upstream_retries_total", &[]).await >= 3.0);

    // Dying after the first chunk: the client gets a broken stream, and nobody else the request.
    *failing.script.lock() = Script::Partial {
        head: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
        chunk: b"data: {}\n\n".to_vec(),
    };
    let before = (failing.posts().len(), healthy.posts().len());
    let mut served_by_healthy = 0;
    loop {
        prompt += 1;
        assert!(prompt < 400, "the failing pod is never ranked first");
        let request = hyper::Request::post(format!("http://{}/v1/completions", router.http))
            .body(Full::new(Bytes::from(json!({"model": "m", "prompt": vec![prompt; 20], "stream": true}).to_string())))
            .unwrap();
        let response = client().request(request).await.expect("head");
        if response.headers()["x-kvindex-pod"] == healthy.addr.as_str() {
            served_by_healthy += 1;
            let _ = response.into_body().collect().await;
            continue;
        }
        let body = response.into_body().collect().await;
        assert!(body.is_err(), "a stream cut by the pod reaches the client as cut");
        break;
    }
    assert_eq!(failing.posts().len() - before.0, 1);
    assert_eq!(healthy.posts().len() - before.1, served_by_healthy, "no retry after the first byte");
}
