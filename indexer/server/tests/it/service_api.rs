//! The service's interfaces: gRPC ScoreTokens contract and limits, registration (gRPC and
//! HTTP), the watched pods file, topic mapping, readiness after the initial replay, STALE,
//! health and reflection. The server runs in process; `cli_serve.rs` tests the binary.

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "m";

#[test]
fn service_score_contract_and_limits() {
    let Some(py) = python() else { return };
    let server = Server::central(&["--max-tokens", "1000"]);
    let mut peer = Peer::with_grpc(&py, &server);
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "10.0.0.1:8000", "connect": server.zmq(), "topic": format!("kv@10.0.0.1:8000@{MODEL}")}));
    peer.cmd(json!({"op": "pub_start", "name": "b", "pod": "10.0.0.2:8000", "connect": server.zmq(), "topic": format!("kv@10.0.0.2:8000@{MODEL}")}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a", "b"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(0, 6)}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "c", "tokens": chain(0, 3)}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "cpu", "tokens": chain(1, 2), "medium": "CPU"}));
    peer.wait_exact(&server, &["a", "b"], MODEL, "EXACT", 20);

    // No filter: only pods with a match, best first; prompt with a partial trailing block.
    let mut prompt = chain(0, 6);
    prompt.extend([1, 2, 3]);
    let r = peer.score(MODEL, &prompt, &[]);
    assert_eq!(r["total_blocks"], 6);
    assert_eq!(r["block_size"], 16);
    let pods: Vec<&str> = r["scores"].as_array().unwrap().iter().map(|s| s["pod"].as_str().unwrap()).collect();
    assert_eq!(pods, ["10.0.0.1:8000", "10.0.0.2:8000"]);
    assert_eq!(r["scores"][1]["matched_blocks"], 3);
    assert_eq!(r["scores"][0]["matched_by_tier"], json!({"GPU": 6}));
    // Tier weights: CPU 0.8 by default.
    let r = peer.score(MODEL, &chain(1, 2), &[]);
    assert_eq!(r["scores"][0]["matched_by_tier"], json!({"CPU": 2}));
    assert!((r["scores"][0]["weighted_score"].as_f64().unwrap() - 1.6).abs() < 1e-9, "{r}");
    // Filter: every filtered pod comes back, unknown ones with 0 and no state.
    let r = peer.score(MODEL, &chain(0, 6), &["10.0.0.2:8000", "nope:1"]);
    assert_eq!(r["scores"][0]["matched_blocks"], 3);
    assert_eq!(r["scores"][0]["state"], "EXACT");
    assert_eq!(
        r["scores"][1],
        json!({"pod": "nope:1", "matched_blocks": 0, "weighted_score": 0.0, "matched_by_tier": {}, "state": "SOURCE_STATE_UNSPECIFIED", "speculative_blocks": 0})
    );
    // Unknown model: an empty answer, not an error.
    let r = peer.score("other-model", &chain(0, 6), &[]);
    assert_eq!(r["scores"], json!([]));
    // Limits: INVALID_ARGUMENT with a message that says what was wrong.
    let r = peer.try_cmd(json!({"op": "score_raw", "model": MODEL, "n_tokens": 1001}));
    assert_eq!(r["code"], "INVALID_ARGUMENT", "{r}");
    assert!(r["details"].as_str().unwrap().contains("max_tokens"), "{r}");
    let r = peer.try_cmd(json!({"op": "score", "model": MODEL, "tokens": [1], "pods": [""]}));
    assert_eq!(r["code"], "INVALID_ARGUMENT", "{r}");
    assert!(server.metric("kvindex_score_requests_total", &["outcome=\"invalid\""]) >= 2.0);
    assert!(server.metric("kvindex_score_latency_seconds_count", &[]) >= 4.0);
    // Health and reflection.
    assert_eq!(peer.cmd(json!({"op": "health"}))["serving"], true);
    let raw = peer.cmd(json!({"op": "reflect"}))["raw"].as_str().unwrap().to_string();
    assert!(raw.contains("kvindex.v1.Indexer") && raw.contains("grpc.health.v1.Health"), "{raw}");
}

#[test]
fn service_registration_grpc_and_http_unregister_clears() {
    let Some(py) = python() else { return };
    let server = Server::start(&["--block-size", "16"]);
    let mut peer = Peer::with_grpc(&py, &server);
    let a = peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pa:1", "bind": "tcp://127.0.0.1:0", "replay": "tcp://127.0.0.1:0", "topic": "kv@x@m"}));
    let b = peer
        .cmd(json!({"op": "pub_start", "name": "b", "pod": "pb:1", "bind": "tcp://127.0.0.1:0", "topic": "kv@y@m"}));
    peer.cmd(json!({"op": "register", "pod": "pa:1", "model": MODEL, "endpoint": a["endpoint"], "replay_endpoint": a["replay_endpoint"]}));
    let body = json!({"pod": "pb:1", "model": MODEL, "endpoint": b["endpoint"]}).to_string();
    let (status, resp) = server.http("POST", "/pods", Some(&body));
    assert_eq!(status, 200, "{resp}");
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a", "b"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(0, 4)}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "c", "tokens": chain(0, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    // b has no replay: its subscription may have missed nothing (it waited) -> EXACT too.
    peer.wait_exact(&server, &["b"], MODEL, "EXACT", 20);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pb:1").0, 4);
    // The same endpoint registered as another engine: read by other rules, so what the old ones
    // keyed is cleared (before, the entry changed in place and the old dialer went on).
    let body = json!({"pod": "pb:1", "model": MODEL, "endpoint": b["endpoint"], "engine": "sglang"}).to_string();
    let (status, resp) = server.http("POST", "/pods", Some(&body));
    assert_eq!(status, 200, "{resp}");
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pb:1").0, 0, "cleared on the engine change");
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pa:1").0, 4, "the other pod keeps its blocks");
    // Bad registrations: clear errors, counted.
    let r = peer.try_cmd(json!({"op": "register", "pod": "", "model": MODEL}));
    assert_eq!(r["code"], "INVALID_ARGUMENT", "{r}");
    let (status, resp) = server.http("POST", "/pods", Some("{\"pod\": 1}"));
    assert_eq!(status, 400, "{resp}");
    let (status, resp) =
        server.http("POST", "/pods", Some(&json!({"pod": "x", "model": "m", "endpoint": "udp://1"}).to_string()));
    assert_eq!(status, 400, "{resp}");
    assert!(resp.contains("endpoint"), "{resp}");
    assert!(server.metric("kvindex_http_invalid_requests_total", &[]) >= 2.0);
    // Unregister clears, over both APIs.
    assert_eq!(peer.cmd(json!({"op": "unregister", "pod": "pa:1"}))["existed"], true);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pa:1").0, 0);
    let (status, resp) = server.http("DELETE", "/pods/pb:1", None);
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&resp).unwrap()["existed"], true);
    assert_eq!(peer.score(MODEL, &chain(0, 4), &[])["scores"], json!([]));
    assert_eq!(peer.cmd(json!({"op": "unregister", "pod": "never"}))["existed"], false);
}

#[test]
fn service_ready_after_initial_replay_and_pods_file() {
    let Some(py) = python() else { return };
    let mut peer = Peer::start(&py);
    // The engine has been publishing before the indexer starts.
    let a = peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pa:1", "bind": "tcp://127.0.0.1:0", "replay": "tcp://127.0.0.1:0", "topic": "kv@pa:1@m"}));
    for k in 0..3 {
        peer.cmd(json!({"op": "store", "name": "a", "chain": format!("c{k}"), "tokens": chain(k, 4)}));
    }
    let dir = std::env::temp_dir().join(format!("kvindex-podsfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pods.toml");
    let entry = |id: &str, v: &Value| {
        format!(
            "[[pods]]\nid = \"{id}\"\nmodel = \"{MODEL}\"\nendpoint = \"{}\"\nreplay_endpoint = \"{}\"\n",
            v["endpoint"].as_str().unwrap(),
            v["replay_endpoint"].as_str().unwrap()
        )
    };
    std::fs::write(&file, entry("pa:1", &a)).unwrap();
    let server =
        Server::start(&["--block-size", "16", "--pods-file", file.to_str().unwrap(), "--pods-file-poll-ms", "50"]);
    // Ready only once the initial replay is done; then EXACT without any live message.
    wait_until("ready", 20, || (server.get("/readyz").0 == 200).then_some(()));
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    assert_eq!(server.sources()["ready"], true);
    // The start-up replay, then the dialer's catch-up (asked when its connection opened, run
    // once the start-up replay is done: nothing new).
    let s = wait_until("debug view refreshed, the catch-up done", 20, || {
        server.source("pa:1").filter(|s| s["replays_filled"] == 2 && s["replay_in_flight"].is_null())
    });
    assert_eq!(s["state"], "EXACT", "{s}");
    assert_eq!(s["last_seq"], 2, "{s}");
    peer.check(&["a"], MODEL);
    assert_eq!(peer.score_pod(MODEL, &chain(2, 4), "pa:1"), (4, "EXACT".to_string()));
    // A second pod appears in the file; a bad edit is counted and ignored; removal unregisters.
    let b = peer.cmd(json!({"op": "pub_start", "name": "b", "pod": "pb:1", "bind": "tcp://127.0.0.1:0", "replay": "tcp://127.0.0.1:0", "topic": "kv@pb:1@m"}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "c", "tokens": chain(7, 4)}));
    std::fs::write(&file, format!("{}{}", entry("pa:1", &a), entry("pb:1", &b))).unwrap();
    wait_until("pod b from the pods file", 20, || (peer.score_pod(MODEL, &chain(7, 4), "pb:1").0 == 4).then_some(()));
    std::fs::write(&file, "[[pods]]\nid = 3\n").unwrap();
    wait_until("bad pods file counted", 20, || {
        (server.metric("kvindex_config_errors_total", &["source=\"pods_file\""]) >= 1.0).then_some(())
    });
    assert_eq!(peer.score_pod(MODEL, &chain(7, 4), "pb:1").0, 4, "a bad file keeps the previous pods");
    std::fs::write(&file, entry("pb:1", &b)).unwrap();
    wait_until("pod a removed", 20, || (peer.score_pod(MODEL, &chain(2, 4), "pa:1").0 == 0).then_some(()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn service_topic_map_and_stale() {
    let Some(py) = python() else { return };
    let server = Server::central(&["--topic-map", "10.1.1.1=pod-from-map:8000", "--stale-after-ms", "400"]);
    let mut peer = Peer::with_grpc(&py, &server);
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-from-map:8000", "connect": server.zmq(), "topic": "kv@10.1.1.1@m"}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(0, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    let src = server.sources();
    assert_eq!(src["topic_map"][0], json!({"topic_id": "10.1.1.1", "pod": "pod-from-map:8000", "from": "topic_map"}));
    let s = server.source("pod-from-map:8000").unwrap();
    assert_eq!(s["topic_id"], "10.1.1.1");
    assert_eq!(s["blocks_by_tier"], json!({"GPU": 4}));
    // Silent past stale_after: flagged STALE; back to EXACT on data.
    wait_until("STALE", 20, || {
        (peer.score_pod(MODEL, &chain(0, 4), "pod-from-map:8000") == (4, "STALE".to_string())).then_some(())
    });
    peer.cmd(json!({"op": "store", "name": "a", "chain": "d", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert!(server.metric("kvindex_source_transitions_total", &["to=\"STALE\"", "reason=\"silent\""]) >= 1.0);
}

#[test]
fn service_dp_ranks_are_their_own_pods() {
    let Some(py) = python() else { return };
    let server = Server::central(&[]);
    let mut peer = Peer::with_grpc(&py, &server);
    // One engine, two DP ranks: same topic, one publisher (and seq counter) per rank.
    for (name, rank, pod) in [("r0", 0, "10.0.0.9:8000"), ("r1", 1, "10.0.0.9:8001")] {
        peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(), "topic": "kv@10.0.0.9:8000@m", "dp_rank": rank}));
    }
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["r0", "r1"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "r0", "chain": "a", "tokens": chain(0, 4)}));
    peer.cmd(json!({"op": "store", "name": "r1", "chain": "b", "tokens": chain(1, 4)}));
    peer.cmd(json!({"op": "store", "name": "r1", "chain": "c", "tokens": chain(2, 4)}));
    peer.wait_exact(&server, &["r0", "r1"], MODEL, "EXACT", 20);
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), "10.0.0.9:8000").0, 0);
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), "10.0.0.9:8001").0, 4);
    let s = server.source("10.0.0.9:8001").unwrap();
    assert_eq!(
        (s["dp_rank"].clone(), s["base_pod"].clone(), s["last_seq"].clone()),
        (json!(1), json!("10.0.0.9:8000"), json!(1))
    );
}

#[test]
fn service_dp_naming_topic_keeps_a_per_rank_topic_id() {
    let Some(py) = python() else { return };
    let server = Server::central(&["--dp-naming", "topic"]);
    let mut peer = Peer::with_grpc(&py, &server);
    // Engines started one per rank, each with its own topic (as in the vLLM captures' DP run).
    for (name, rank, pod) in [("r0", 0, "10.0.0.9:8000"), ("r1", 1, "10.0.0.9:8001")] {
        peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(), "topic": format!("kv@{pod}@m"), "dp_rank": rank}));
    }
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["r0", "r1"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "r1", "chain": "b", "tokens": chain(1, 4)}));
    peer.cmd(json!({"op": "store", "name": "r0", "chain": "a", "tokens": chain(0, 4)}));
    peer.wait_exact(&server, &["r0", "r1"], MODEL, "EXACT", 20);
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), "10.0.0.9:8001").0, 4, "not 10.0.0.9:8002");
    assert!(server.source("10.0.0.9:8002").is_none());
    assert!(Server::try_start(&["--dp-naming", "sideways"]).is_err(), "a bad value is a config error");
}
