//! SGLang as a live source of `kvindex serve`: SGLang's own `ZmqEventPublisher` and event
//! structs from its PyPI wheel (tests/python/sglang_peer.py) publish page-size-1 stores (SGLang's
//! default), partial last pages, evictions, a gap that replays and a restart, per pod and
//! central, next to a vLLM pod in the same fleet. After every batch each chain's score is
//! compared with what the publisher's radix cache would serve (whole canonical blocks of held
//! whole pages): never more (no false positive), and exactly that once caught up.

use crate::support::sglang::*;
use crate::support::*;
use serde_json::json;

const MODEL: &str = SGLANG_MODEL;

#[test]
fn service_sglang_per_pod_page_size_1_gap_and_restart_score_as_sglang_serves() {
    let Some(py) = sglang_python() else { return };
    let mut peer = Peer::start_script(&py, "sglang_peer.py");
    let pod = "10.0.0.7:30000";
    let a = peer.cmd(json!({"op": "sgl_start", "name": "a", "pod": pod, "endpoint": "tcp://127.0.0.1:*",
        "replay_endpoint": "tcp://127.0.0.1:*", "bind": true}));
    let server = serve_dialling(&mut peer, "a", pod, &a);

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

/// SGLang's sampled page-hash cross-check in `serve`: each SGLang pod's published page ids are
/// recomputed by the rules of the release and event format configured for it. Salted requests
/// tell releases apart (0.5.19+ seed the chain with the salt; `dynamo` namespaces the ids by
/// it). The right configuration matches; a wrong one mismatches on every id and is reported
/// (metric, `/debug/sources`), and matching is unchanged: scores stay exact either way.
#[test]
fn service_sglang_page_hash_check_matches_the_right_release_and_reports_a_wrong_one() {
    let Some(py) = sglang_python() else { return };
    let mut peer = Peer::start_script(&py, "sglang_peer.py");
    // name, pod id, the `--pod` options past the engine
    let pods = [
        ("right", "10.0.1.1:30000", ""),
        ("old", "10.0.1.2:30000", ",sglang_release=0.5.18"),
        ("dynamo", "10.0.1.3:30000", ",sglang_event_format=dynamo"),
        ("unhashable", "10.0.1.4:30000", ",sglang_release=0.5.5"),
    ];
    // vLLM's check on too (`--hash-seed`): it must leave SGLang's ids alone.
    let mut args: Vec<String> =
        ["--block-size", "16", "--hash-check-every", "1", "--hash-seed", "0"].map(String::from).into();
    for (name, pod, options) in pods {
        let s = peer.cmd(json!({"op": "sgl_start", "name": name, "pod": pod, "endpoint": "tcp://127.0.0.1:*",
            "replay_endpoint": "tcp://127.0.0.1:*", "bind": true}));
        let (pub_ep, replay) = (s["endpoint"].as_str().unwrap(), s["replay_endpoint"].as_str().unwrap());
        args.extend(["--pod".into(), format!("{pod},{MODEL},{pub_ep},{replay},engine=sglang{options}")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&args);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let names: Vec<&str> = pods.iter().map(|(n, _, _)| *n).collect();
    for name in &names {
        subscribed(&mut peer, &server, name);
        // A salted conversation of two turns (a root node, then its continuation), as SGLang
        // 0.5.23 publishes it; page size 1.
        let turn = tokens(21, 40);
        peer.cmd(
            json!({"op": "sgl_store", "name": name, "chain": "salted", "tokens": &turn[..24], "salt": "tenant-a"}),
        );
        peer.cmd(json!({"op": "sgl_store", "name": name, "chain": "salted", "tokens": turn}));
    }
    // Matching is the same on every pod, whatever its check says.
    let r = exact(&mut peer, &server, &names);
    for name in &names {
        assert_eq!(r["scores"][format!("{name}/salted")], json!([2, 2]), "{r}");
    }
    let check = |pod: &str| server.source(pod).unwrap()["page_hash_check"].clone();
    let right = check(pods[0].1);
    assert_eq!((right["release"].clone(), right["format"].clone()), (json!("0.5.23"), json!("default")), "{right}");
    assert_eq!((right["matched"].clone(), right["mismatched"].clone()), (json!(40), json!(0)), "{right}");
    assert_eq!(right["all_mismatched"], false);
    for (_, pod, _) in &pods[1..3] {
        let wrong = check(pod);
        assert_eq!((wrong["matched"].clone(), wrong["all_mismatched"].clone()), (json!(0), json!(true)), "{wrong}");
        assert!(wrong["mismatched"].as_u64().unwrap() >= 24, "every sampled root page mismatches: {wrong}");
        let label = format!("source=\"{pod}\"");
        assert!(server.metric("kvindex_hash_check_mismatches_total", &[&label]) >= 24.0);
        assert_eq!(server.source(pod).unwrap()["hash_check_mismatches"], wrong["mismatched"]);
    }
    let right_label = format!("source=\"{}\"", pods[0].1);
    assert_eq!(server.metric("kvindex_hash_check_blocks_total", &[&right_label]), 40.0);
    assert_eq!(server.metric("kvindex_hash_check_mismatches_total", &[&right_label]), 0.0);
    // Before 0.5.6 SGLang's ids are Python's hash(): no check at all.
    assert!(check(pods[3].1).is_null(), "{}", server.sources());
    let unhashable = format!("source=\"{}\"", pods[3].1);
    assert_eq!(server.metric("kvindex_hash_check_blocks_total", &[&unhashable]), 0.0);
}

/// gRPC `RegisterPod` sets what the pods file and `POST /pods` can: an SGLang pod of page size
/// 16 (and its release) registered through grpcio is keyed by whole 16-token pages; a page
/// size of 0, one that does not tile the block, or an absurd one is `INVALID_ARGUMENT`, counted.
#[test]
fn service_sglang_registered_over_grpc_with_page_size_16() {
    let Some(py) = sglang_python() else { return };
    let server = Server::start(&["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"]);
    let mut peer = Peer::start_script(&py, "sglang_peer.py");
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let refused = server.metric("kvindex_config_errors_total", &["source=\"grpc\""]);
    for (n, (page_size, why)) in
        [(0, "between 1 and"), (24, "block_size (16)"), (1 << 20, "between 1 and")].into_iter().enumerate()
    {
        let r = peer.try_cmd(json!({"op": "register", "pod": format!("p:{n}"), "model": MODEL, "engine": "sglang", "page_size": page_size}));
        assert_eq!((r["ok"].clone(), r["code"].clone()), (json!(false), json!("INVALID_ARGUMENT")), "{r}");
        let details = r["details"].as_str().unwrap();
        assert!(details.contains("page_size") && details.contains(why), "{r}");
    }
    let r = peer.try_cmd(
        json!({"op": "register", "pod": "p:9", "model": MODEL, "engine": "sglang", "sglang_release": "newest"}),
    );
    assert!(r["details"].as_str().unwrap().contains("sglang_release"), "{r}");
    assert_eq!(server.metric("kvindex_config_errors_total", &["source=\"grpc\""]), refused + 4.0);
    assert!(server.sources()["registered_pods"].as_array().unwrap().is_empty());

    let pod = "10.0.2.1:30000";
    let s = peer.cmd(json!({"op": "sgl_start", "name": "s", "pod": pod, "endpoint": server.zmq(),
        "replay_endpoint": "tcp://127.0.0.1:*", "topic": format!("kv@{pod}@{MODEL}"), "page_size": 16}));
    peer.cmd(json!({"op": "register", "pod": pod, "model": MODEL, "replay_endpoint": s["replay_endpoint"],
        "engine": "sglang", "page_size": 16, "sglang_release": "0.5.23"}));
    subscribed(&mut peer, &server, "s");
    // Three whole pages and a 5-token partial one SGLang would not serve.
    peer.cmd(json!({"op": "sgl_store", "name": "s", "chain": "p16", "tokens": tokens(31, 53), "partial": true}));
    let r = exact(&mut peer, &server, &["s"]);
    assert_eq!(r["scores"]["s/p16"], json!([3, 3]), "{r}");
    let source = server.source(pod).unwrap();
    assert_eq!(source["engine"], "sglang");
    // The partial page is hashed alike (it continues the third page): checked, never credited.
    assert_eq!(source["page_hash_check"]["matched"], 4, "{source}");
}

/// `POST /pods` takes an SGLang pod's release and event format (shown in `registered_pods`);
/// one that does not parse, or one on a pod of another engine, is a 400 naming the field.
#[test]
fn service_sglang_release_and_format_registered_over_http() {
    let server = Server::start(&["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"]);
    let body = json!({"pod": "p:1", "model": MODEL, "engine": "sglang", "page_size": 16,
        "sglang_release": "0.5.22.post1", "sglang_event_format": "dynamo"});
    let (status, text) = server.http("POST", "/pods", Some(&body.to_string()));
    assert_eq!(status, 200, "{text}");
    let pods = server.sources()["registered_pods"].clone();
    assert_eq!(
        (
            pods[0]["engine"].clone(),
            pods[0]["page_size"].clone(),
            pods[0]["sglang_release"].clone(),
            pods[0]["sglang_event_format"].clone()
        ),
        (json!("sglang"), json!(16), json!("0.5.22"), json!("dynamo")),
        "{pods}"
    );
    for (body, field) in [
        (
            json!({"pod": "p:2", "model": MODEL, "engine": "sglang", "sglang_release": "latest"}),
            "not an SGLang version",
        ),
        (
            json!({"pod": "p:3", "model": MODEL, "engine": "sglang", "sglang_event_format": "llmd"}),
            "unknown SGLang kv_events format",
        ),
        (json!({"pod": "p:4", "model": MODEL, "engine": "vllm", "sglang_release": "0.5.22"}), "sglang_release"),
        (json!({"pod": "p:5", "model": MODEL, "engine": "sglang", "page_size": 24}), "block_size (16)"),
    ] {
        let (status, text) = server.http("POST", "/pods", Some(&body.to_string()));
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(field), "{body}: {text}");
    }
    assert_eq!(server.sources()["registered_pods"].as_array().unwrap().len(), 1);
}
