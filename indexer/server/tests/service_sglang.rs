//! SGLang as a live source of `kvindex serve`: SGLang's own `ZmqEventPublisher` and event
//! structs from its PyPI wheel (tests/python/sglang_peer.py) publish page-size-1 stores (SGLang's
//! default), partial last pages, evictions, a gap that replays and a restart, per pod and
//! central, next to a vLLM pod in the same fleet. After every batch each chain's score is
//! compared with what the publisher's radix cache would serve (whole canonical blocks of held
//! whole pages): never more (no false positive), and exactly that once caught up.

mod support;

use serde_json::json;
use support::sglang::*;
use support::*;

const MODEL: &str = SGLANG_MODEL;

#[test]
fn service_sglang_per_pod_page_size_1_gap_and_restart_score_as_sglang_serves() {
    let Some(py) = sglang_python() else { return };
    let mut peer = Peer::start_script(&py, "sglang_peer.py");
    let pod = "10.0.0.7:30000";
    let a = peer.cmd(json!({"op": "sgl_start", "name": "a", "pod": pod, "endpoint": "tcp://127.0.0.1:*",
        "replay_endpoint": "tcp://127.0.0.1:*", "bind": true}));
    let flag = format!(
        "{pod},{MODEL},{},{},engine=sglang",
        a["endpoint"].as_str().unwrap(),
        a["replay_endpoint"].as_str().unwrap()
    );
    let server = Server::start(&["--block-size", "16", "--pod", &flag]);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    subscribed(&mut peer, &server, "a");

    // Page size 1: 40 pages are 2 canonical blocks and 8 pages at the chain's end ...
    let long = tokens(1, 64);
    store(&mut peer, "a", "one", &long[..40]);
    let r = exact(&mut peer, &server, &["a"]);
    assert_eq!(r["scores"]["a/one"], json!([2, 2]), "{r}");
    // ... which the next store of the same radix path completes.
    store(&mut peer, "a", "one", &long);
    assert_eq!(exact(&mut peer, &server, &["a"])["scores"]["a/one"], json!([4, 4]));
    // Leaf-first eviction of 20 pages: the blocks whose last page went are gone.
    peer.cmd(json!({"op": "sgl_evict", "name": "a", "chain": "one", "pages": 20}));
    assert_eq!(exact(&mut peer, &server, &["a"])["scores"]["a/one"], json!([2, 2]));
    store(&mut peer, "a", "two", &tokens(2, 33));
    assert_eq!(exact(&mut peer, &server, &["a"])["scores"]["a/two"], json!([2, 2]));

    // A store lost on the wire: the next one shows the gap and SGLang's replay ROUTER fills it.
    let filled = server.metric("kvindex_replays_total", &["outcome=\"filled\""]);
    peer.cmd(json!({"op": "sgl_drop_next", "name": "a"}));
    store(&mut peer, "a", "lost", &tokens(3, 48));
    store(&mut peer, "a", "after", &tokens(4, 16));
    let r = exact(&mut peer, &server, &["a"]);
    assert_eq!((r["scores"]["a/lost"].clone(), r["scores"]["a/after"].clone()), (json!([3, 3]), json!([1, 1])));
    assert!(server.metric("kvindex_replays_total", &["outcome=\"filled\""]) > filled, "the gap was replayed");

    // A restart: a new SGLang process on the same ports holds nothing, its seq starts at 0.
    let clears = server.metric("kvindex_clears_total", &[]);
    peer.cmd(json!({"op": "sgl_restart", "name": "a"}));
    subscribed(&mut peer, &server, "a");
    store(&mut peer, "a", "new", &tokens(5, 20));
    let r = exact(&mut peer, &server, &["a"]);
    assert_eq!(r["scores"]["a/new"], json!([1, 1]), "{r}");
    assert!(server.metric("kvindex_clears_total", &[]) > clears, "the restart cleared the pod");
    let (old, _) = peer.score_pod(MODEL, &long, pod);
    assert_eq!(old, 0, "nothing of the old process is credited");
    assert_eq!(server.metric("kvindex_skipped_blocks_total", &["reason=\"partial_page\""]), 0.0);
}

#[test]
fn service_sglang_partial_last_pages_never_credit() {
    let Some(py) = sglang_python() else { return };
    let mut peer = Peer::start_script(&py, "sglang_peer.py");
    // Page size 32 over 16-token canonical blocks: a 16-token partial last page is exactly one
    // canonical block long, yet SGLang would not serve it.
    let pod = "10.0.0.7:30001";
    let a = peer.cmd(json!({"op": "sgl_start", "name": "a", "pod": pod, "endpoint": "tcp://127.0.0.1:*",
        "replay_endpoint": "tcp://127.0.0.1:*", "bind": true, "page_size": 32}));
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!(
            "block_size = 16\n[[pods]]\nid = \"{pod}\"\nmodel = \"{MODEL}\"\nendpoint = \"{}\"\nreplay_endpoint = \"{}\"\nengine = \"sglang\"\npage_size = 32\n",
            a["endpoint"].as_str().unwrap(),
            a["replay_endpoint"].as_str().unwrap()
        ),
    )
    .unwrap();
    let server = Server::start(&["--config", config.path().to_str().unwrap()]);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    subscribed(&mut peer, &server, "a");
    peer.cmd(json!({"op": "sgl_store", "name": "a", "chain": "p", "tokens": tokens(7, 80), "partial": true}));
    let r = exact(&mut peer, &server, &["a"]);
    assert_eq!(r["scores"]["a/p"], json!([4, 4]), "two whole pages, not the partial third: {r}");
    assert!(server.metric("kvindex_skipped_blocks_total", &["reason=\"partial_page\""]) >= 1.0);
}

#[test]
fn service_sglang_central_mixed_fleet_with_a_vllm_pod() {
    let Some(py) = sglang_python() else { return };
    // vLLM is the default engine; the SGLang pod's registration names its engine.
    let server = Server::start(&["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"]);
    let mut peer = Peer::start_script(&py, "sglang_peer.py");
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let sgl_pod = "10.0.0.8:30000";
    let s = peer.cmd(json!({"op": "sgl_start", "name": "s", "pod": sgl_pod, "endpoint": server.zmq(),
        "replay_endpoint": "tcp://127.0.0.1:*", "topic": format!("kv@{sgl_pod}@{MODEL}")}));
    peer.cmd(json!({"op": "register", "pod": sgl_pod, "model": MODEL, "replay_endpoint": s["replay_endpoint"], "engine": "sglang"}));
    let vllm_pod = "10.0.0.9:8000";
    peer.cmd(json!({"op": "pub_start", "name": "v", "pod": vllm_pod, "connect": server.zmq(), "topic": format!("kv@{vllm_pod}@{MODEL}")}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["v"]}))["subscribed"], true);
    subscribed(&mut peer, &server, "s");

    // The same prompt on both pods, each in its engine's encoding.
    let shared = tokens(11, 48);
    store(&mut peer, "s", "shared", &shared);
    peer.cmd(json!({"op": "store", "name": "v", "chain": "shared", "tokens": shared}));
    let r = exact(&mut peer, &server, &["s"]);
    assert_eq!(r["scores"]["s/shared"], json!([3, 3]));
    assert_eq!(server.source(sgl_pod).unwrap()["engine"], "sglang");
    peer.wait_exact(&server, &["v"], MODEL, "EXACT", 30);
    assert_eq!(server.source(vllm_pod).unwrap()["engine"], "vllm", "the default engine");
    let both = peer.score(MODEL, &shared, &[sgl_pod, vllm_pod]);
    let matched: Vec<u64> =
        both["scores"].as_array().unwrap().iter().map(|s| s["matched_blocks"].as_u64().unwrap()).collect();
    assert_eq!(matched, [3, 3], "{both}");

    // A gap on the SGLang pod replays through its registered ROUTER; the vLLM pod is untouched.
    peer.cmd(json!({"op": "sgl_drop_next", "name": "s"}));
    store(&mut peer, "s", "lost", &tokens(12, 35));
    store(&mut peer, "s", "after", &tokens(13, 16));
    let r = exact(&mut peer, &server, &["s"]);
    assert_eq!((r["scores"]["s/lost"].clone(), r["scores"]["s/after"].clone()), (json!([2, 2]), json!([1, 1])));
    peer.wait_exact(&server, &["v"], MODEL, "EXACT", 30);

    // A restart of the SGLang engine (a new process connecting again) clears its pod only.
    peer.cmd(json!({"op": "sgl_restart", "name": "s"}));
    subscribed(&mut peer, &server, "s");
    let (old, _) = peer.score_pod(MODEL, &shared, sgl_pod);
    assert_eq!(old, 0, "nothing of the old SGLang process is credited");
    let (kept, _) = peer.score_pod(MODEL, &shared, vllm_pod);
    assert_eq!(kept, 3, "the vLLM pod keeps its blocks");
    store(&mut peer, "s", "new", &tokens(14, 32));
    assert_eq!(exact(&mut peer, &server, &["s"])["scores"]["s/new"], json!([2, 2]));
}

#[test]
fn service_registration_refuses_an_unknown_engine_with_a_clear_error() {
    let Some(py) = sglang_python() else { return };
    let server = Server::start(&["--zmq-bind", "tcp://127.0.0.1:0"]);
    let mut peer = Peer::start_script(&py, "sglang_peer.py");
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let r = peer.try_cmd(json!({"op": "register", "pod": "p:1", "model": MODEL, "engine": "tgi"}));
    assert_eq!((r["ok"].clone(), r["code"].clone()), (json!(false), json!("INVALID_ARGUMENT")), "{r}");
    assert!(r["details"].as_str().unwrap().contains("unknown engine \"tgi\""), "{r}");
    let body = json!({"pod": "p:2", "model": MODEL, "engine": "tgi"}).to_string();
    let (status, text) = server.http("POST", "/pods", Some(&body));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("unknown engine"), "{text}");
    let body = json!({"pod": "p:3", "model": MODEL, "engine": "sglang", "page_size": 0}).to_string();
    let (status, text) = server.http("POST", "/pods", Some(&body));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("page_size"), "{text}");
    assert!(server.sources()["registered_pods"].as_array().unwrap().is_empty());
}
