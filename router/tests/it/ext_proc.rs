//! The Gateway API endpoint picker (Envoy ext_proc) against real `kvindex serve` and
//! `kvindex-sim` pods: an independent Python gateway built on Envoy's published protos
//! (`tests/python/epp_gateway.py`, PyPI `envoy-data-plane` over grpcio) checks the protocol end
//! to end, in both modes; Rust streams check that malformed streams fail alone.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::ext_proc::*;
use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{processing_request, processing_response, ProtocolConfiguration};
use serde_json::json;

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

    // Out of order: a second request head on one stream.
    let mut stream = Stream::open(&mut client).await;
    stream.send(post_headers("/v1/completions")).await;
    stream.send(post_headers("/v1/completions")).await;
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

/// The gateway's reply (`status`, then `text` as its body) through a full-duplex stream: each
/// answered, the body echoed.
async fn reply_through(stream: &mut Stream, status: &str, text: &[u8]) {
    stream.send(response_headers(status)).await;
    let answer = stream.recv().await.expect("no stream error").expect("an answer");
    assert!(matches!(answer.response, Some(processing_response::Response::ResponseHeaders(_))), "{answer:?}");
    let mut reply_body = body(text, true);
    if let Some(processing_request::Request::RequestBody(b)) = reply_body.request.take() {
        reply_body.request = Some(processing_request::Request::ResponseBody(b));
    }
    stream.send(reply_body).await;
    let echoed = stream.recv().await.expect("no stream error").expect("the body echoed");
    assert!(matches!(echoed.response, Some(processing_response::Response::ResponseBody(_))), "{echoed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_the_gateway_makes_itself_is_answered_in_every_request_phase() {
    let bins = bins();
    let pod = FakePod::start(Script::Echo("a".into())).await;
    // A buffer bound of one body: a request dropped mid-body must give its bytes back.
    let args =
        ["--pod", &pod.spec(), "--model", "m", "--max-body-bytes", "65536", "--ext-proc-max-buffered-bytes", "65536"];
    let epp = PickerProcess::start(&bins, &args.map(String::from));
    let mut client = connect(&epp.ext_proc).await;
    let whole = json!({"model": "m", "prompt": (0..9_000).collect::<Vec<u32>>()}).to_string().into_bytes();

    // Before the request headers (Envoy refused them: too large, malformed): the reply's headers
    // are the stream's first message.
    let mut first = Stream::open(&mut client).await;
    reply_through(&mut first, "431", b"Request Header Fields Too Large").await;
    // Mid-body, streamed (full duplex, GIE's mode).
    let mut streamed = Stream::open(&mut client).await;
    streamed.send(post_headers("/v1/completions")).await;
    streamed.send(body(&whole[..40_000], false)).await;
    reply_through(&mut streamed, "408", b"request timeout").await;
    // Mid-body, buffered, with no response body sent (the shipped configs: Envoy's own 413 past
    // request_body_buffer_limit).
    let mut buffered = Stream::open(&mut client).await;
    let mut head = post_headers("/v1/completions");
    head.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: BodySendMode::Buffered as i32,
        response_body_mode: BodySendMode::None as i32,
        ..Default::default()
    });
    buffered.send(head).await;
    assert!(buffered.recv().await.expect("no stream error").is_some(), "the headers go on to be buffered");
    buffered.send(response_headers("413")).await;
    let answer = buffered.recv().await.expect("no stream error").expect("an answer");
    assert!(matches!(answer.response, Some(processing_response::Response::ResponseHeaders(_))), "{answer:?}");

    // The streamed request's 40,000 bytes were given back at the reply, its stream still open:
    // a whole body fits the bound beside it.
    let answers = pick(&mut client, "/v1/completions", &whole).await;
    assert!(destination(&answers[0]).is_some(), "{:?}", answers[0]);

    // Each ends as the gateway's reply once the gateway closes it; none broke the protocol.
    for mut stream in [first, streamed, buffered] {
        stream.tx = None;
        assert!(stream.recv().await.expect("no stream error").is_none(), "the picker ends the stream too");
    }
    wait_for("the three gateway replies to be counted", DEADLINE, || async {
        let replied = metric(&epp.http, "kvindex_router_extproc_streams_total", &["outcome=\"gateway_reply\""]).await;
        (replied == 3.0).then_some(())
    })
    .await;
    assert_eq!(metric(&epp.http, "kvindex_router_extproc_protocol_errors_total", &[]).await, 0.0);
}
