//! Replays queue for their slots instead of failing: with `max_concurrent_replays` 1 and five
//! pods whose gaps all want a replay at once, each from an engine that takes 300 ms to answer,
//! the last one waits longer than the replay timeout (1 s) for its slot. Each is served in
//! turn and every pod ends EXACT with nothing cleared (a burst of gaps asked for more
//! replays than the cap allowed, the waiting ones timed out and their pods were cleared).

use crate::support::*;
use serde_json::json;

const MODEL: &str = "m";

#[test]
fn a_burst_of_gaps_is_replayed_in_turn_not_cleared() {
    let Some(py) = python() else { return };
    let server = Server::central(&["--max-concurrent-replays", "1", "--replay-timeout-ms", "1000"]);
    let mut peer = Peer::with_grpc(&py, &server);
    let names: Vec<String> = (0..5).map(|i| format!("p{i}")).collect();
    for name in &names {
        let pod = format!("pod-{name}");
        let p = peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(),
            "replay": "tcp://127.0.0.1:0", "replay_delay_ms": 300, "topic": format!("kv@{pod}@{MODEL}")}));
        peer.cmd(json!({"op": "register", "pod": pod, "model": MODEL, "replay_endpoint": p["replay_endpoint"]}));
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": refs}))["subscribed"], true);
    for (k, name) in names.iter().enumerate() {
        peer.cmd(json!({"op": "store", "name": name, "chain": "a", "tokens": chain(10 * k as u32, 4)}));
    }
    peer.settle(&server, &refs);
    // Every pod loses a frame, then publishes the next: five gaps at once.
    for (k, name) in names.iter().enumerate() {
        peer.cmd(
            json!({"op": "store", "name": name, "chain": "b", "tokens": chain(10 * k as u32 + 1, 4), "drop": true}),
        );
    }
    for (k, name) in names.iter().enumerate() {
        peer.cmd(json!({"op": "store", "name": name, "chain": "c", "tokens": chain(10 * k as u32 + 2, 4)}));
    }
    peer.wait_exact(&server, &refs, MODEL, "EXACT", 30);
    for name in &names {
        let s = server.source(&format!("pod-{name}")).unwrap();
        assert_eq!((s["gaps"].as_u64(), s["replays_filled"].as_u64()), (Some(1), Some(1)), "{s}");
        assert_eq!((s["replays_failed"].as_u64(), s["clears"].as_u64()), (Some(0), Some(0)), "{s}");
    }
    assert_eq!(server.metric("kvindex_replays_total", &["outcome=\"filled\""]), 5.0);
}
