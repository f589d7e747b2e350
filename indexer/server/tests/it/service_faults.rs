//! Fault scenarios against the real `kvindex serve`, with independent pyzmq/msgspec
//! publishers (vLLM 0.33 struct shapes) and a grpcio client. After every scenario the
//! property is checked: no pod is credited with a block its publisher does not hold, and an
//! EXACT pod is credited with exactly what it holds.

use crate::support::*;
use serde_json::json;

const MODEL: &str = "m";

/// Central-mode server, a peer, and publisher `name` (pod `pod`) dialling it, with a replay
/// ROUTER registered through gRPC when `replay`.
fn central(extra: &[&str], pubs: &[(&str, &str)], replay: bool, buffer_steps: u64) -> Option<(Server, Peer)> {
    let py = python()?;
    let mut args = vec!["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"];
    args.extend_from_slice(extra);
    let server = Server::start(&args);
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    for (name, pod) in pubs {
        let mut cfg = json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(),
            "topic": format!("kv@{pod}@{MODEL}"), "buffer_steps": buffer_steps});
        if replay {
            cfg["replay"] = json!("tcp://127.0.0.1:0");
        }
        let p = peer.cmd(cfg);
        if replay {
            peer.cmd(json!({"op": "register", "pod": pod, "model": MODEL, "replay_endpoint": p["replay_endpoint"]}));
        }
    }
    let names: Vec<&str> = pubs.iter().map(|p| p.0).collect();
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": names}))["subscribed"], true);
    Some((server, peer))
}

#[test]
fn service_dropped_frame_is_recovered_by_replay() {
    let Some((server, mut peer)) = central(&[], &[("a", "pod-a")], true, 10_000) else { return };
    for k in 0..3 {
        peer.cmd(json!({"op": "store", "name": "a", "chain": format!("c{k}"), "tokens": chain(k, 8)}));
    }
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    // Seq 3 is published but lost on the way; seq 4 reveals the gap.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "lost", "tokens": chain(10, 4), "drop": true}));
    peer.cmd(json!({"op": "remove", "name": "a", "tokens": chain(0, 8), "blocks": [6, 7], "drop": true}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "after", "tokens": chain(11, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert_eq!(peer.score_pod(MODEL, &chain(10, 4), "pod-a").0, 4, "the dropped store came back through replay");
    assert_eq!(peer.score_pod(MODEL, &chain(0, 8), "pod-a").0, 6, "the dropped removal came back through replay");
    let s = server.source("pod-a").unwrap();
    assert_eq!(s["gaps"], 1, "{s}");
    assert_eq!(s["replays_filled"], 1, "{s}");
    assert!(server.metric("kvindex_gaps_total", &["source=\"pod-a\""]) >= 1.0);
}

#[test]
fn service_drop_outside_replay_buffer_degrades_without_false_positive() {
    let Some((server, mut peer)) = central(&[], &[("a", "pod-a")], true, 2) else { return };
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c0", "tokens": chain(0, 8)}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c1", "tokens": chain(1, 8)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    // Lost: a removal (the index would over-report if it were guessed) and more, beyond the
    // 2-batch replay buffer.
    peer.cmd(json!({"op": "remove", "name": "a", "tokens": chain(0, 8), "blocks": [2], "drop": true}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c2", "tokens": chain(2, 4), "drop": true}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c3", "tokens": chain(3, 4), "drop": true}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c4", "tokens": chain(4, 4)}));
    peer.settle(&server, &["a"]);
    let r = peer.check(&["a"], MODEL);
    assert_eq!(r["states"]["pod-a"], "DEGRADED", "{r}");
    // Blocks stored before the loss are dropped; stores replayed or seen after it are known.
    assert_eq!(peer.score_pod(MODEL, &chain(0, 8), "pod-a"), (0, "DEGRADED".to_string()));
    assert_eq!(peer.score_pod(MODEL, &chain(4, 4), "pod-a").0, 4);
    // New stores keep being applied while DEGRADED.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c5", "tokens": chain(5, 4)}));
    peer.settle(&server, &["a"]);
    assert_eq!(peer.score_pod(MODEL, &chain(5, 4), "pod-a").0, 4);
    peer.check(&["a"], MODEL);
    assert!(server.metric("kvindex_replays_total", &["outcome=\"not_covered\""]) >= 1.0);
    assert!(server.metric("kvindex_clears_total", &["reason=\"replay_not_covered\""]) >= 1.0);
}

#[test]
fn service_drop_without_replay_endpoint_degrades() {
    let Some((server, mut peer)) = central(&[], &[("a", "pod-a")], false, 10) else { return };
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c0", "tokens": chain(0, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    peer.cmd(json!({"op": "clear", "name": "a", "drop": true}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c1", "tokens": chain(1, 4)}));
    peer.settle(&server, &["a"]);
    assert_eq!(server.source("pod-a").unwrap()["state"], "DEGRADED");
    peer.check(&["a"], MODEL);
    assert_eq!(
        peer.score_pod(MODEL, &chain(0, 4), "pod-a").0,
        0,
        "a lost AllBlocksCleared must not leave blocks credited"
    );
    assert!(server.metric("kvindex_clears_total", &["reason=\"replay_unavailable\""]) >= 1.0);
}

#[test]
fn service_publisher_restart_clears_and_recovers() {
    let Some((server, mut peer)) = central(&[], &[("a", "pod-a")], true, 10_000) else { return };
    for k in 0..4 {
        peer.cmd(json!({"op": "store", "name": "a", "chain": format!("old{k}"), "tokens": chain(k, 4)}));
    }
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    // New process: seq restarts at 0, holds nothing, never sends AllBlocksCleared.
    let p = peer.cmd(json!({"op": "restart", "name": "a"}));
    peer.cmd(json!({"op": "register", "pod": "pod-a", "model": MODEL, "replay_endpoint": p["replay_endpoint"]}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "new0", "tokens": chain(20, 4)}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "new1", "tokens": chain(21, 4)}));
    // The old connection's close clears the pod (a disconnect), unless the new connection's
    // seq 0 is seen first (a restart): either way, once.
    wait_until("restart seen", 20, || {
        let s = server.source("pod-a")?;
        (s["restarts"].as_u64()? + s["disconnects"].as_u64()? == 1).then_some(())
    });
    let r = peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert_eq!(r["violations"], json!([]));
    for k in 0..4 {
        assert_eq!(peer.score_pod(MODEL, &chain(k, 4), "pod-a").0, 0, "blocks of the old process must be gone");
    }
    assert_eq!(peer.score_pod(MODEL, &chain(21, 4), "pod-a").0, 4);
    let cleared = server.metric("kvindex_clears_total", &["reason=\"restart\""])
        + server.metric("kvindex_clears_total", &["reason=\"disconnect\""]);
    assert!(cleared >= 1.0);
}

#[test]
fn service_malformed_frames_are_counted_and_ignored() {
    let Some((server, mut peer)) = central(&[], &[("a", "pod-a"), ("b", "pod-b")], true, 10_000) else { return };
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c0", "tokens": chain(0, 4)}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "b0", "tokens": chain(5, 4)}));
    peer.wait_exact(&server, &["a", "b"], MODEL, "EXACT", 20);
    // Bad framing (no usable seq): counted, nothing changes.
    peer.cmd(json!({"op": "bad_frames", "name": "a"}));
    wait_until("frame errors counted", 20, || {
        (server.metric("kvindex_decode_errors_total", &["reason=\"frame_count\""]) >= 1.0
            && server.metric("kvindex_decode_errors_total", &["reason=\"seq_length\""]) >= 1.0)
            .then_some(())
    });
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 5);
    // A payload that cannot be decoded consumes a seq: its content is lost, so the pod is
    // cleared and DEGRADED (replay would return the same bytes); other pods are untouched.
    peer.cmd(json!({"op": "malformed", "name": "a"}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c1", "tokens": chain(1, 4)}));
    peer.settle(&server, &["a"]);
    assert_eq!(server.source("pod-a").unwrap()["state"], "DEGRADED");
    assert!(server.metric("kvindex_decode_errors_total", &["reason=\"invalid\""]) >= 1.0);
    peer.check(&["a", "b"], MODEL);
    peer.settle(&server, &["a"]);
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), "pod-a").0, 4, "stores after the bad payload still apply");
    peer.wait_exact(&server, &["b"], MODEL, "EXACT", 5);
    // The server is alive and answers.
    assert_eq!(server.get("/healthz").0, 200);
}

#[test]
fn service_engine_connecting_late_central() {
    let Some((server, mut peer)) = central(&[], &[], false, 0) else { return };
    assert!(server.sources()["sources"].as_array().unwrap().is_empty());
    peer.cmd(json!({"op": "pub_start", "name": "late", "pod": "late:8000", "connect": server.zmq(), "topic": format!("kv@late:8000@{MODEL}")}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["late"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "late", "chain": "c0", "tokens": chain(0, 6)}));
    peer.wait_exact(&server, &["late"], MODEL, "EXACT", 20);
}

#[test]
fn service_engine_connecting_late_per_pod() {
    let Some(py) = python() else { return };
    let (pub_port, replay_port) = (free_port(), free_port());
    let pod = format!("tcp://127.0.0.1:{pub_port}");
    let replay = format!("tcp://127.0.0.1:{replay_port}");
    let flag = format!("late:8000,{MODEL},{pod},{replay}");
    // The engine is not up yet: the initial replay fails (the service still becomes ready).
    let server = Server::start(&[
        "--block-size",
        "16",
        "--pod",
        &flag,
        "--replay-timeout-ms",
        "1000",
        "--replay-cooldown-ms",
        "100",
    ]);
    wait_until("ready", 20, || (server.get("/readyz").0 == 200).then_some(()));
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    peer.cmd(json!({"op": "pub_start", "name": "late", "pod": "late:8000", "bind": pod, "replay": replay, "topic": format!("kv@late:8000@{MODEL}")}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["late"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "late", "chain": "c0", "tokens": chain(0, 6)}));
    peer.cmd(json!({"op": "store", "name": "late", "chain": "c1", "tokens": chain(1, 6)}));
    peer.wait_exact(&server, &["late"], MODEL, "EXACT", 30);
    let s = server.source("late:8000").unwrap();
    assert_eq!(s["mode"], "per-pod");
}

#[test]
fn service_64_publishers_concurrently() {
    let names: Vec<String> = (0..64).map(|i| format!("p{i}")).collect();
    let pods: Vec<String> = (0..64).map(|i| format!("10.0.1.{i}:8000")).collect();
    let pubs: Vec<(&str, &str)> = names.iter().map(String::as_str).zip(pods.iter().map(String::as_str)).collect();
    // Every publisher dials from 127.0.0.1 here; in a fleet each engine has its own address.
    let per_source = ["--zmq-max-connections-per-source", "64"];
    let Some((server, mut peer)) = central(&per_source, &pubs, true, 10_000) else { return };
    let names: Vec<&str> = pubs.iter().map(|p| p.0).collect();
    let r = peer.cmd(json!({"op": "burst", "names": names, "chains": 40, "blocks": 8, "model": MODEL}));
    assert_eq!(r["sent"], 64 * 40);
    wait_until("every publisher's last batch applied", 60, || {
        let src = server.sources();
        let s = src["sources"].as_array()?;
        let done = s.iter().filter(|x| x["last_seq"] == 39).count();
        (s.len() == 64 && done == 64).then_some(())
    });
    peer.wait_exact(&server, &names, MODEL, "EXACT", 30);
    assert_eq!(server.metric("kvindex_blocks_total", &["op=\"stored\""]), (64 * 40 * 8) as f64);
}

#[test]
fn service_queue_overflow_waits_instead_of_dropping() {
    // A 4-message queue: bursts fill it; their messages wait for room (the sockets stop reading
    // meanwhile) instead of being dropped, so no seq gap is left to replay.
    let names: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    let pods: Vec<String> = (0..8).map(|i| format!("10.0.2.{i}:8000")).collect();
    let pubs: Vec<(&str, &str)> = names.iter().map(String::as_str).zip(pods.iter().map(String::as_str)).collect();
    let Some((server, mut peer)) =
        central(&["--queue-capacity", "4", "--replay-cooldown-ms", "0"], &pubs, true, 10_000)
    else {
        return;
    };
    let names: Vec<&str> = pubs.iter().map(|p| p.0).collect();
    peer.cmd(json!({"op": "burst", "names": names, "chains": 50, "blocks": 8, "model": MODEL}));
    peer.wait_exact(&server, &names, MODEL, "EXACT", 60);
    assert_eq!(server.metric("kvindex_gaps_total", &[]), 0.0);
    assert_eq!(server.metric("kvindex_replays_total", &[]), 0.0, "nothing to replay");
}

#[test]
fn service_restart_already_past_the_old_seq_is_resynced() {
    // The new process publishes more batches before our subscription reaches it than the old
    // one ever did: its first seq we see is *above* the old cursor. Only the new connection
    // tells; the pod must be cleared and resynced from seq 0, never continued.
    let Some((server, mut peer)) = central(&[], &[("a", "pod-a")], true, 10_000) else { return };
    for k in 0..3 {
        peer.cmd(json!({"op": "store", "name": "a", "chain": format!("old{k}"), "tokens": chain(k, 4)}));
    }
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    let p = peer.cmd(json!({"op": "restart", "name": "a", "connect_later": true}));
    peer.cmd(json!({"op": "register", "pod": "pod-a", "model": MODEL, "replay_endpoint": p["replay_endpoint"]}));
    // Published before the new connection exists: lost on the wire, kept in the replay buffer.
    for k in 0..6 {
        peer.cmd(json!({"op": "store", "name": "a", "chain": format!("new{k}"), "tokens": chain(30 + k, 4)}));
    }
    peer.cmd(json!({"op": "connect", "name": "a"}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "last", "tokens": chain(40, 4)}));
    let r = peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert_eq!(r["violations"], json!([]));
    for k in 0..3 {
        assert_eq!(peer.score_pod(MODEL, &chain(k, 4), "pod-a").0, 0, "blocks of the old process must be gone");
    }
    assert_eq!(peer.score_pod(MODEL, &chain(30, 4), "pod-a").0, 4, "resynced from seq 0");
    // Cleared when the old connection closed, or when the new one's first message came.
    let cleared = server.metric("kvindex_clears_total", &["reason=\"reconnect\""])
        + server.metric("kvindex_clears_total", &["reason=\"disconnect\""]);
    assert!(cleared >= 1.0);
}
