//! Overload costs lag, not state: a burst larger than the apply queue waits for
//! room instead of being dropped, in central mode (one reading task for every publisher) and
//! per-pod mode (a dialled socket each), so it leaves no seq gap, clears nothing and every pod
//! ends EXACT, with no replay to fall back on. And the lag is visible: while a replay holds a
//! pod's live batches, `/debug/sources` and `kvindex_source_lag_seconds` show their age, and
//! `kvindex_receive_to_visible_seconds` counts the wait once they apply.
//!
//! Independent peers: pyzmq publishers (SNDHWM 1,000,000, so nothing is lost on their side)
//! with vLLM's frames; the burst is built first and sent back to back, so it reaches the
//! server much faster than a 4-message queue drains.

use crate::support::*;
use serde_json::json;

const MODEL: &str = "m";
const PUBLISHERS: usize = 8;
const CHAINS: u64 = 40;
const BLOCKS: u64 = 32;

/// Sends the burst from every publisher and checks that it all came through, exactly.
fn burst_is_applied_without_loss(server: &Server, peer: &mut Peer, names: &[&str]) {
    let r = peer.cmd(json!({"op": "burst", "names": names, "chains": CHAINS, "blocks": BLOCKS, "model": MODEL,
        "prepared": true}));
    assert_eq!(r["sent"], PUBLISHERS as u64 * CHAINS);
    peer.wait_exact(server, names, MODEL, "EXACT", 60);
    for s in server.sources()["sources"].as_array().unwrap() {
        assert_eq!((s["gaps"].as_u64(), s["clears"].as_u64()), (Some(0), Some(0)), "{s}");
    }
    assert_eq!(server.metric("kvindex_gaps_total", &[]), 0.0);
    assert_eq!(server.metric("kvindex_clears_total", &[]), 0.0);
    assert_eq!(
        server.metric("kvindex_blocks_total", &["op=\"stored\""]),
        (PUBLISHERS as u64 * CHAINS * BLOCKS) as f64,
        "every block of the burst applied"
    );
    assert!(
        server.metric("kvindex_queue_full_total", &[]) > 0.0,
        "the burst filled the queue, and its messages waited for room"
    );
}

#[test]
fn central_a_burst_larger_than_the_queue_waits_instead_of_leaving_gaps() {
    let Some(py) = python() else { return };
    let server = Server::central(&[
        "--queue-capacity",
        "4",
        // Every publisher dials from 127.0.0.1 here.
        "--zmq-max-connections-per-source",
        "64",
    ]);
    let mut peer = Peer::with_grpc(&py, &server);
    let names: Vec<String> = (0..PUBLISHERS).map(|i| format!("p{i}")).collect();
    for name in &names {
        let pod = format!("pod-{name}");
        // No replay socket: a gap could only clear the pod.
        peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(),
            "topic": format!("kv@{pod}@{MODEL}")}));
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": names}))["subscribed"], true);
    burst_is_applied_without_loss(&server, &mut peer, &names);
}

#[test]
fn per_pod_a_burst_larger_than_the_queue_waits_instead_of_leaving_gaps() {
    let Some(py) = python() else { return };
    let server = Server::start(&["--block-size", "16", "--queue-capacity", "4"]);
    let mut peer = Peer::with_grpc(&py, &server);
    let names: Vec<String> = (0..PUBLISHERS).map(|i| format!("p{i}")).collect();
    for name in &names {
        let pod = format!("pod-{name}");
        let p = peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "bind": "tcp://127.0.0.1:0",
            "topic": format!("kv@{pod}@{MODEL}")}));
        // Dialled by the server; no replay endpoint.
        peer.cmd(json!({"op": "register", "pod": pod, "model": MODEL, "endpoint": p["endpoint"]}));
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": names}))["subscribed"], true);
    burst_is_applied_without_loss(&server, &mut peer, &names);
}

/// Samples of `kvindex_receive_to_visible_seconds` above `secs` (to its bucket bounds).
fn visible_after(server: &Server, secs: f64) -> f64 {
    let (_, body) = server.get("/metrics");
    let buckets: Vec<(f64, f64)> = body
        .lines()
        .filter(|l| l.starts_with("kvindex_receive_to_visible_seconds_bucket{"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    let total = buckets.iter().find(|b| b.0.is_infinite()).map_or(0.0, |b| b.1);
    let within = buckets.iter().filter(|b| b.0 <= secs).map(|b| b.1).fold(0.0, f64::max);
    total - within
}

#[test]
fn the_lag_of_batches_held_behind_a_replay_is_shown_and_measured() {
    let Some(py) = python() else { return };
    let server = Server::central(&[]);
    let mut peer = Peer::with_grpc(&py, &server);
    // An engine that takes 1.5 s to answer a replay.
    let p = peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": server.zmq(),
        "replay": "tcp://127.0.0.1:0", "replay_delay_ms": 1500, "topic": format!("kv@pod-a@{MODEL}")}));
    peer.cmd(json!({"op": "register", "pod": "pod-a", "model": MODEL, "replay_endpoint": p["replay_endpoint"]}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c0", "tokens": chain(0, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    let lag_ms = |server: &Server| server.source("pod-a").and_then(|s| s["lag_ms"].as_f64());
    assert_eq!(lag_ms(&server), Some(0.0), "nothing waits");
    // Lost, then two more: the gap's replay holds them until the engine answers.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c1", "tokens": chain(1, 4), "drop": true}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c2", "tokens": chain(2, 4)}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c3", "tokens": chain(3, 4)}));
    let (shown, gauge) = wait_until("the held batches' age shown", 10, || {
        let shown = lag_ms(&server)?;
        let gauge = server.metric("kvindex_source_lag_seconds", &[]);
        (shown >= 400.0 && gauge >= 0.4).then_some((shown, gauge))
    });
    assert!(shown < 10_000.0 && gauge < 10.0, "{shown} ms, {gauge} s: no older than the test");
    assert_eq!(server.source("pod-a").unwrap()["state"], "REPLAYING");
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    wait_until("the lag back to 0 once they are visible", 10, || {
        (lag_ms(&server) == Some(0.0) && server.metric("kvindex_source_lag_seconds", &[]) == 0.0).then_some(())
    });
    assert!(
        visible_after(&server, 0.4) >= 2.0,
        "both held batches counted in receive-to-visible with their wait behind the replay"
    );
}
