//! RecordRoute through real gRPC (a `grpcio` client) and real ZeroMQ publishers (`pyzmq`):
//! the credit shows in `speculative_blocks` and never in `matched_blocks`; the engine's own
//! events replace it (announced blocks end their credit, so an eviction does not bring it
//! back); AllBlocksCleared and the TTL end it; bad requests get a clear status and a count.

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "m";
const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";

/// (matched_blocks, speculative_blocks) of `pod` for `prompt` (0, 0 when not listed).
fn score_of(peer: &mut Peer, prompt: &[u32], pod: &str) -> (u64, u64) {
    let r = peer.score(MODEL, prompt, &[]);
    let scores = r["scores"].as_array().unwrap_or_else(|| panic!("{r}"));
    scores
        .iter()
        .find(|s| s["pod"] == pod)
        .map_or((0, 0), |s| (s["matched_blocks"].as_u64().unwrap(), s["speculative_blocks"].as_u64().unwrap()))
}

fn record(peer: &mut Peer, pod: &str, tokens: &[u32], ttl_ms: u32) -> Value {
    peer.try_cmd(json!({"op": "record_route", "pod": pod, "model": MODEL, "tokens": tokens, "ttl_ms": ttl_ms}))
}

#[test]
fn record_route_credits_apart_and_real_events_replace_it() {
    let Some(py) = python() else { return };
    let server = Server::central(&[
        "--max-tokens",
        "1000",
        "--speculative-ttl-ms",
        "30000",
        "--speculative-max-ttl-ms",
        "60000",
    ]);
    let mut peer = Peer::with_grpc(&py, &server);
    for (name, pod) in [("a", A), ("b", B)] {
        peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(), "topic": format!("kv@{pod}@{MODEL}")}));
    }
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a", "b"]}))["subscribed"], true);
    let prompt = chain(0, 6);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(0, 2)}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "other", "tokens": chain(9, 1)}));
    peer.wait_exact(&server, &["a", "b"], MODEL, "EXACT", 20);

    // The 2 blocks a holds need no credit; the other 4 are credited.
    let r = record(&mut peer, A, &prompt, 0);
    assert_eq!((&r["credited_blocks"], &r["ttl_ms"]), (&json!(4), &json!(30000)), "{r}");
    assert_eq!(score_of(&mut peer, &prompt, A), (2, 6), "matched stays what the engine announced");
    assert_eq!(score_of(&mut peer, &prompt, B), (0, 0));
    // A sibling prompt sharing 4 blocks is credited 4; b, credited from scratch, is listed
    // although it matches nothing.
    let mut sibling = chain(0, 4);
    sibling.extend(chain(7, 2));
    assert_eq!(score_of(&mut peer, &sibling, A), (2, 4));
    assert_eq!(record(&mut peer, B, &sibling, 0)["credited_blocks"], 6);
    assert_eq!(score_of(&mut peer, &sibling, B), (0, 6));
    // A filter naming b only reports b's credit.
    let r = peer.score(MODEL, &sibling, &[B]);
    assert_eq!(r["scores"].as_array().unwrap().len(), 1);
    assert_eq!(r["scores"][0]["speculative_blocks"], 6);

    // The engine announces blocks 2 and 3: they are exact now, the rest still credited.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(0, 4), "start": 2}));
    peer.settle(&server, &["a"]);
    assert_eq!(score_of(&mut peer, &prompt, A), (4, 6));
    // It evicts them again: the credit they replaced does not come back.
    peer.cmd(json!({"op": "remove", "name": "a", "tokens": chain(0, 4), "blocks": [2, 3]}));
    peer.settle(&server, &["a"]);
    assert_eq!(score_of(&mut peer, &prompt, A), (2, 0));

    // AllBlocksCleared ends every credit of the pod.
    assert_eq!(record(&mut peer, A, &prompt, 0)["credited_blocks"], 4);
    assert_eq!(score_of(&mut peer, &prompt, A), (2, 6));
    peer.cmd(json!({"op": "clear", "name": "a"}));
    peer.settle(&server, &["a"]);
    assert_eq!(score_of(&mut peer, &prompt, A), (0, 0));
    assert!(server.metric("kvindex_speculative_cleared_total", &["reason=\"all_blocks_cleared\""]) >= 4.0);

    // A TTL above the maximum is capped; a short one expires.
    assert_eq!(record(&mut peer, A, &prompt, 600_000)["ttl_ms"], 60000);
    peer.cmd(json!({"op": "clear", "name": "a"}));
    peer.settle(&server, &["a"]);
    assert_eq!(record(&mut peer, A, &prompt, 300)["ttl_ms"], 300);
    wait_until("a 300 ms credit to expire", 20, || (score_of(&mut peer, &prompt, A) == (0, 0)).then_some(()));
    assert!(server.metric("kvindex_record_route_requests_total", &["outcome=\"ok\""]) >= 5.0);
    assert!(server.metric("kvindex_speculative_blocks_total", &["result=\"credited\""]) >= 20.0);
}

#[test]
fn record_route_rejects_bad_requests_with_a_status_and_a_count() {
    let Some(py) = python() else { return };
    let server = Server::central(&["--max-tokens", "1000"]);
    let mut peer = Peer::with_grpc(&py, &server);
    peer.cmd(
        json!({"op": "pub_start", "name": "a", "pod": A, "connect": server.zmq(), "topic": format!("kv@{A}@{MODEL}")}),
    );
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(0, 1)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);

    let cases = [
        (json!({"pod": "nope:1", "model": MODEL, "tokens": chain(0, 2)}), "NOT_FOUND", "not a source"),
        (json!({"pod": "", "model": MODEL, "tokens": chain(0, 2)}), "INVALID_ARGUMENT", "required"),
        (json!({"pod": A, "model": "other", "tokens": chain(0, 2)}), "INVALID_ARGUMENT", "serves"),
        (
            json!({"pod": A, "model": MODEL, "tokens": (0..1001).collect::<Vec<u32>>()}),
            "INVALID_ARGUMENT",
            "max_tokens",
        ),
        (json!({"pod": "x".repeat(2000), "model": MODEL, "tokens": [1]}), "INVALID_ARGUMENT", "longer than"),
    ];
    for (req, code, says) in &cases {
        let mut cmd = req.clone();
        cmd["op"] = json!("record_route");
        let r = peer.try_cmd(cmd);
        assert_eq!(r["code"], *code, "{req}: {r}");
        assert!(r["details"].as_str().unwrap().contains(says), "{req}: {r}");
    }
    let rejected: f64 = ["unknown_pod", "invalid", "wrong_model"]
        .iter()
        .map(|o| server.metric("kvindex_record_route_requests_total", &[&format!("outcome=\"{o}\"")]))
        .sum();
    assert_eq!(rejected, 5.0);
    // Nothing was credited by any of them.
    let r = peer.score(MODEL, &chain(0, 2), &[]);
    assert!(r["scores"].as_array().unwrap().iter().all(|s| s["speculative_blocks"] == 0), "{r}");
    assert_eq!(server.metric("kvindex_speculative_entries", &[]), 0.0);
}
