//! The Gateway API endpoint picker (Envoy ext_proc) against real `kvindex serve` and
//! `kvindex-sim` pods: an independent Python gateway built on Envoy's published protos
//! (`tests/python/epp_gateway.py`, PyPI `envoy-data-plane` over grpcio) checks the protocol end
//! to end, in both modes; Rust streams check that malformed streams fail alone.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::processing_response;
use serde_json::json;
use support::ext_proc::*;
use support::fake_pod::{FakePod, Script};
use support::*;

const MODEL: &str = PICKER_MODEL;

/// The venv's Python with grpcio and envoy-data-plane, or `None` (skipped; failed under CI).
fn python() -> Option<PathBuf> {
    kvindex_testkit::env::python_with(&["grpc", "grpc_tools", "betterproto2", "envoy_data_plane"])
}

fn gateway(py: &PathBuf, checks: &str, config: &serde_json::Value) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/epp_gateway.py");
    let out = Command::new(py).arg(script).arg(checks).arg(config.to_string()).output().expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(out.status.success(), "the Python gateway failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for check in checks.split(',') {
        assert!(stdout.lines().any(|l| l.starts_with(&format!("ok {check}"))), "{check} did not report ok");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_gateway_drives_the_picker_and_the_prefilter() {
    let bins = bins();
    let Some(py) = python() else { return };
    let Some((stack, dir)) = tokenized_stack(&bins, 3, "5").await else { return };
    let pods: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();

    let epp = picker(&bins, &stack, &dir, &["--ext-proc-health-addr", "127.0.0.1:0"]);
    wait_scraped(&epp.http, &pods).await;
    let config = json!({"ext_proc": epp.ext_proc, "health": epp.health, "router_http": epp.http, "pods": pods,
                        "model": MODEL, "chat_model": MODEL});
    gateway(&py, "health,pick,big_body,subset,response_path,conversation", &config);
    // The two streams whose response ran to its end (the SSE one, the one ending on trailers).
    wait_for("the completed streams to be counted", DEADLINE, || async {
        let completed = metric(&epp.http, "kvindex_router_extproc_streams_total", &["outcome=\"completed\""]).await;
        (completed >= 2.0).then_some(())
    })
    .await;
    drop(epp);

    let prefilter = picker(&bins, &stack, &dir, &["--ext-proc-mode", "prefilter"]);
    wait_scraped(&prefilter.http, &pods).await;
    let config = json!({"ext_proc": prefilter.ext_proc, "router_http": prefilter.http, "pods": pods,
                        "model": MODEL, "chat_model": MODEL});
    gateway(&py, "prefilter", &config);
    assert!(metric(&prefilter.http, "kvindex_router_prefilter_total", &["outcome=\"hint\""]).await >= 1.0);
    assert!(metric(&prefilter.http, "kvindex_router_prefilter_total", &["outcome=\"miss\""]).await >= 1.0);
}

fn completion(seed: u32, tokens: u32) -> Vec<u8> {
    json!({"model": MODEL, "prompt": (0..tokens).map(|i| seed * 100_000 + i).collect::<Vec<u32>>(), "max_tokens": 1})
        .to_string()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_streams_fail_alone_and_the_picker_keeps_serving() {
    let bins = bins();
    let Some((stack, dir)) = tokenized_stack(&bins, 3, "5").await else { return };
    let epp = picker(&bins, &stack, &dir, &["--max-body-bytes", "65536"]);
    let mut client = connect(&epp.ext_proc).await;

    // A stream left open mid-body while the others misbehave; it completes at the end.
    let mut patient = Stream::open(&mut client).await;
    patient.send(post_headers("/v1/completions")).await;
    let whole = completion(1, 64);
    patient.send(body(&whole[..10], false)).await;

    // Out of order: a body chunk before any headers.
    let mut stream = Stream::open(&mut client).await;
    stream.send(body(b"{}", true)).await;
    let status = stream.recv().await.expect_err("an error on that stream");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("request body"), "{status:?}");

    // Out of order: response headers before the request was answered.
    let mut stream = Stream::open(&mut client).await;
    stream.send(post_headers("/v1/completions")).await;
    stream.send(response_headers("200")).await;
    assert_eq!(stream.recv().await.expect_err("out of order").code(), tonic::Code::InvalidArgument);

    // A body past --max-body-bytes, streamed without a declared length: 413 on that stream.
    let mut stream = Stream::open(&mut client).await;
    stream.send(post_headers("/v1/completions")).await;
    for _ in 0..3 {
        stream.send(body(&[b' '; 30_000], false)).await;
    }
    let answer = stream.recv().await.unwrap().expect("an answer");
    assert_eq!(immediate_status(&answer), Some(413));
    // A declared length past the limit is refused at the headers.
    let mut stream = Stream::open(&mut client).await;
    stream
        .send(headers(&[(":method", "POST"), (":path", "/v1/completions"), ("content-length", "70000")], false))
        .await;
    assert_eq!(immediate_status(&stream.recv().await.unwrap().unwrap()), Some(413));

    // Cut midway: headers and half a body, then the gateway goes away.
    for _ in 0..3 {
        let mut cut = Stream::open(&mut client).await;
        cut.send(post_headers("/v1/completions")).await;
        cut.send(body(&whole[..20], false)).await;
        cut.tx = None;
        drop(cut);
    }

    // Bad JSON is the client's error, answered as the proxy would (400), on that stream only.
    let answers = pick(&mut client, "/v1/completions", b"{not json").await;
    assert_eq!(immediate_status(&answers[0]), Some(400));

    // The patient stream finishes normally, and a fresh one too.
    patient.send(body(&whole[10..], true)).await;
    let first = patient.recv().await.unwrap().expect("the pick");
    let picked = destination(&first).expect("a destination");
    let pods: Vec<&str> = stack.sim.pods.iter().map(|p| p.pod_id.as_str()).collect();
    assert!(pods.contains(&picked.as_str()), "the header names one known pod: {picked}");
    let answers = pick(&mut client, "/v1/completions", &completion(2, 64)).await;
    assert!(destination(&answers[0]).is_some());
    assert!(matches!(answers.last().unwrap().response, Some(processing_response::Response::RequestBody(_))));

    // Counted, and the half-read streams gave their buffer back (a full-limit body still fits).
    let errors = metric(&epp.http, "kvindex_router_extproc_protocol_errors_total", &["reason=\"out_of_order\""]).await;
    assert_eq!(errors, 2.0);
    wait_for("the cut streams to be counted", DEADLINE, || async {
        (metric(&epp.http, "kvindex_router_extproc_streams_total", &["outcome=\"closed\""]).await >= 3.0).then_some(())
    })
    .await;
    assert!(metric(&epp.http, "kvindex_router_request_errors_total", &["reason=\"request_too_large\""]).await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bodiless_request_is_placed_by_load_and_the_subset_still_binds() {
    let bins = bins();
    let Some((stack, dir)) = tokenized_stack(&bins, 3, "5").await else { return };
    let epp = picker(&bins, &stack, &dir, &[]);
    let mut client = connect(&epp.ext_proc).await;
    let target = stack.sim.pods[2].pod_id.clone();
    let mut stream = Stream::open(&mut client).await;
    stream.send(with_subset(headers(&[(":method", "GET"), (":path", "/v1/models")], true), &[&target])).await;
    let answer = stream.recv().await.unwrap().expect("an answer");
    assert_eq!(destination(&answer).as_deref(), Some(target.as_str()));
    let mut stream = Stream::open(&mut client).await;
    stream.send(with_subset(headers(&[(":method", "GET"), (":path", "/v1/models")], true), &[])).await;
    assert_eq!(immediate_status(&stream.recv().await.unwrap().unwrap()), Some(503));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_ending_on_trailers_is_answered_before_its_trailers() {
    let bins = bins();
    let Some((stack, dir)) = tokenized_stack(&bins, 3, "5").await else { return };
    let epp = picker(&bins, &stack, &dir, &[]);
    let mut client = connect(&epp.ext_proc).await;
    let mut stream = Stream::open(&mut client).await;
    stream.send(post_headers("/v1/completions")).await;
    let whole = completion(3, 32);
    stream.send(body(&whole, false)).await;
    stream.send(trailers()).await;
    let answer = stream.recv().await.unwrap().expect("headers answer");
    assert!(destination(&answer).is_some());
    let Some(processing_response::Response::RequestBody(chunk)) = stream.recv().await.unwrap().unwrap().response else {
        panic!("the body next")
    };
    let mutation = chunk.response.unwrap().body_mutation.unwrap().mutation.unwrap();
    let envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation::StreamedResponse(streamed) = mutation
    else {
        panic!("streamed")
    };
    assert_eq!(streamed.body, whole);
    assert!(!streamed.end_of_stream, "the trailers end the request, not the body");
    let last = stream.recv().await.unwrap().unwrap();
    assert!(matches!(last.response, Some(processing_response::Response::RequestTrailers(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_indexer_gone_the_picker_still_picks_by_load() {
    let bins = bins();
    let Some((mut stack, dir)) = tokenized_stack(&bins, 3, "5").await else { return };
    let epp = picker(&bins, &stack, &dir, &[]);
    let mut client = connect(&epp.ext_proc).await;
    stack.kv.process.kill();
    for seed in 10..14 {
        let answers = pick(&mut client, "/v1/completions", &completion(seed, 64)).await;
        assert!(destination(&answers[0]).is_some(), "fail open: a pick without the index");
    }
    assert!(metric(&epp.http, "kvindex_router_fail_open_total", &[]).await >= 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_stops_before_its_request_ends_is_answered_408_in_time() {
    let bins = bins();
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let args = ["--pod", &pod.spec(), "--model", "m", "--ext-proc-request-timeout-ms", "500"].map(String::from);
    let epp = PickerProcess::start(&bins, &args);
    let mut client = connect(&epp.ext_proc).await;
    let opened = Instant::now();
    let mut headers_only = Stream::open(&mut client).await;
    headers_only.send(post_headers("/v1/completions")).await;
    let mut half_body = Stream::open(&mut client).await;
    half_body.send(post_headers("/v1/completions")).await;
    half_body.send(body(br#"{"model": "m", "prompt": [1, "#, false)).await;
    // Meanwhile a whole request is answered at once.
    let answers = pick(&mut client, "/v1/completions", br#"{"model": "m", "prompt": [1, 2, 3]}"#).await;
    assert!(destination(&answers[0]).is_some(), "{answers:?}");
    for stream in [&mut headers_only, &mut half_body] {
        let answer = stream.recv().await.unwrap().expect("an answer");
        assert_eq!(immediate_status(&answer), Some(408), "{answer:?}");
        assert!(opened.elapsed() >= Duration::from_millis(500), "answered before the timeout");
        assert!(stream.recv().await.unwrap().is_none(), "the stream ends after the 408");
    }
    assert!(opened.elapsed() < Duration::from_secs(10), "took {:?}", opened.elapsed());
    assert_eq!(metric(&epp.http, "kvindex_router_request_errors_total", &["reason=\"request_timeout\""]).await, 2.0);
    assert_eq!(metric(&epp.http, "kvindex_router_extproc_streams_total", &["outcome=\"timeout\""]).await, 2.0);
}
