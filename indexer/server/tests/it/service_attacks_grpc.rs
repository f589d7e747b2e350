//! Attacks on the gRPC read plane, each against the real `kvindex serve` binary on
//! loopback with grpcio clients and pyzmq publishers (`tests/python/kvpeer.py`):
//!
//! - RecordRoute moves new prompts to the pod it names, so it takes the control plane's token:
//!   without one configured it is off (PERMISSION_DENIED), with one a call without it is
//!   UNAUTHENTICATED; both are counted and change no score.
//! - One caller (peer address) cannot hold more than its share of the credit table: a second
//!   caller, through a relay from another loopback address, still gets credit.
//! - A flood of large ScoreTokens queries is shed (RESOURCE_EXHAUSTED, counted) while small
//!   queries keep being answered. Latency is the benchmarks' business (BENCHMARKS.md); this
//!   asserts outcomes only.

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "m";
const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";

/// The binary with `extra` flags, central mode, and a peer whose publishers `a` and `b` (pods
/// A and B) hold `held` and one block of their own respectively, both EXACT.
fn central(py: &std::path::PathBuf, extra: &[&str], held: &[u32]) -> (ServeProcess, Peer) {
    let mut args = vec!["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--zmq-bind", "tcp://127.0.0.1:0"];
    args.extend_from_slice(&["--block-size", "16"]);
    args.extend_from_slice(extra);
    let server = kvindex_serve().args(&args).start().expect("kvindex serve");
    let mut peer = Peer::start(py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let zmq = server.zmq.clone().unwrap();
    for (name, pod) in [("a", A), ("b", B)] {
        peer.cmd(
            json!({"op": "pub_start", "name": name, "pod": pod, "connect": zmq, "topic": format!("kv@{pod}@{MODEL}")}),
        );
    }
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a", "b"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "held", "tokens": held}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "own", "tokens": chain(99, 1)}));
    peer.wait_exact(&server, &["a", "b"], MODEL, "EXACT", 60);
    (server, peer)
}

/// RecordRoute of `tokens` to `pod`, presenting `token` (`None`: the test's admin token).
fn record(peer: &mut Peer, pod: &str, tokens: &[u32], token: Option<&str>) -> Value {
    let mut cmd = json!({"op": "record_route", "pod": pod, "model": MODEL, "tokens": tokens});
    if let Some(token) = token {
        cmd["token"] = json!(token);
    }
    peer.try_cmd(cmd)
}

/// (matched_blocks, speculative_blocks) of `pod` for `prompt`.
fn score_of(peer: &mut Peer, prompt: &[u32], pod: &str) -> (u64, u64) {
    let r = peer.score(MODEL, prompt, &[pod]);
    let s = &r["scores"][0];
    (s["matched_blocks"].as_u64().unwrap(), s["speculative_blocks"].as_u64().unwrap())
}

/// Waits until the credits-held gauge (set on each apply tick) reads `n`.
fn wait_entries(server: &ServeProcess, n: f64) {
    wait_until(&format!("kvindex_speculative_entries = {n}"), 20, || {
        (server.metric("kvindex_speculative_entries", &[]) == n).then_some(())
    });
}

fn outcomes(server: &ServeProcess, outcome: &str) -> f64 {
    server.metric("kvindex_record_route_requests_total", &[&format!("outcome=\"{outcome}\"")])
}

/// In the default configuration (no `admin_token_file`): RecordRoute is off
/// for everyone, as RegisterPod is, whatever the call presents.
#[test]
fn attack_record_route_is_off_without_an_admin_token() {
    let Some(py) = python() else { return };
    let (server, mut peer) = central(&py, &[], &chain(0, 2));
    let prompt = chain(0, 6);
    for token in [None, Some("")] {
        let r = record(&mut peer, A, &prompt, token);
        assert_eq!(r["code"], "PERMISSION_DENIED", "{r}");
        assert!(r["details"].as_str().unwrap().contains("admin_token_file"), "{r}");
    }
    assert_eq!(score_of(&mut peer, &prompt, A), (2, 0), "no credit");
    assert_eq!(outcomes(&server, "no_admin_token"), 2.0);
    assert_eq!(outcomes(&server, "ok"), 0.0);
    assert_eq!(server.metric("kvindex_speculative_entries", &[]), 0.0);
}

/// With a token configured, RecordRoute without it (or with a wrong one) is
/// UNAUTHENTICATED, counted, and moves no score; with it, it credits as before.
#[test]
fn attack_record_route_without_the_token_changes_no_score() {
    let Some(py) = python() else { return };
    let token_file = admin_token_file();
    let (server, mut peer) = central(&py, &["--admin-token-file", token_file.to_str().unwrap()], &chain(0, 2));
    let prompt = chain(0, 6);
    for (token, says) in [("", "missing bearer token"), ("kvindex-wrong-token-0123456789", "wrong bearer token")] {
        let r = record(&mut peer, B, &prompt, Some(token));
        assert_eq!(r["code"], "UNAUTHENTICATED", "{r}");
        assert!(r["details"].as_str().unwrap().contains(says), "{r}");
    }
    assert_eq!(score_of(&mut peer, &prompt, B), (0, 0), "the attacker's pod gained nothing");
    assert_eq!(score_of(&mut peer, &prompt, A), (2, 0));
    assert_eq!((outcomes(&server, "missing_token"), outcomes(&server, "wrong_token")), (1.0, 1.0));
    assert_eq!(server.metric("kvindex_speculative_entries", &[]), 0.0);
    // The router's call, with the token.
    let r = record(&mut peer, A, &prompt, None);
    assert_eq!(r["credited_blocks"], 4, "{r}");
    assert_eq!(score_of(&mut peer, &prompt, A), (2, 6));
    assert_eq!(outcomes(&server, "ok"), 1.0);
}

/// One caller holds at most `speculative_max_entries_per_caller` credits, all
/// pods together, so it cannot fill the table; a caller at another address has its own share.
#[test]
fn attack_one_caller_cannot_exceed_its_share_of_the_credit_table() {
    let Some(py) = python() else { return };
    let token_file = admin_token_file();
    let (server, mut peer) = central(
        &py,
        &[
            "--admin-token-file",
            token_file.to_str().unwrap(),
            "--speculative-max-entries",
            "64",
            "--speculative-max-entries-per-caller",
            "16",
            // Credits outlive the test: with the 2 s default the first caller's could expire
            // on a loaded box before the count of both callers is read (it did in CI).
            "--speculative-ttl-ms",
            "600000",
            "--speculative-max-ttl-ms",
            "600000",
        ],
        &chain(0, 1),
    );
    // Caller 127.0.0.1 (this peer): 12 blocks on A, then only 4 of 12 on B, then none.
    assert_eq!(record(&mut peer, A, &chain(1, 12), None)["credited_blocks"], 12);
    assert_eq!(record(&mut peer, B, &chain(2, 12), None)["credited_blocks"], 4);
    assert_eq!(record(&mut peer, A, &chain(3, 4), None)["credited_blocks"], 0);
    wait_entries(&server, 16.0);
    let refused = |server: &ServeProcess| {
        server.metric("kvindex_speculative_blocks_total", &["result=\"refused\"", "bound=\"caller\""])
    };
    assert_eq!(refused(&server), 12.0);
    assert_eq!(score_of(&mut peer, &chain(2, 12), B), (0, 4));

    // Caller 127.0.0.2 (a second peer, through a relay from that address) has a share of its
    // own: it extends the 4 credits the first caller holds and adds 8.
    let mut other = Peer::start(&py);
    other.cmd(json!({"op": "grpc", "addr": server.grpc, "source": "127.0.0.2"}));
    assert_eq!(record(&mut other, B, &chain(2, 12), None)["credited_blocks"], 12);
    assert_eq!(score_of(&mut peer, &chain(2, 12), B), (0, 12));
    wait_entries(&server, 24.0);
    assert_eq!(refused(&server), 12.0, "nothing of the second caller's was refused");
}

/// 32 concurrent 262,144-token queries over 8 connections, round after
/// round, against one slot for large queries and no room to wait: the excess is refused at once
/// with RESOURCE_EXHAUSTED and counted, some large queries are answered, and every small query
/// sent meanwhile is answered. (The queue's room is the admission's unit tests'; here a wait
/// would need three large queries decoded at once, which a fast server rarely lets happen.)
#[test]
fn a_flood_of_large_queries_is_shed_while_small_ones_are_answered() {
    let Some(py) = python() else { return };
    let large = chain(0, 16_384);
    let (server, mut peer) =
        central(&py, &["--grpc-max-concurrent-large", "1", "--grpc-max-queued-tokens", "0"], &large);
    let r = peer.cmd(json!({
        "op": "flood", "model": MODEL, "large": large, "small": chain(0, 4), "concurrency": 32, "clients": 8,
    }));
    let count = |kind: &str, code: &str| r[kind][code].as_f64().unwrap_or(0.0);
    assert!(count("large", "RESOURCE_EXHAUSTED") > 0.0, "no large query was shed: {r}");
    assert!(count("large", "OK") > 0.0, "no large query was answered: {r}");
    let small: f64 = r["small"].as_object().unwrap().values().map(|n| n.as_f64().unwrap()).sum();
    assert!(small > 0.0 && count("small", "OK") == small, "every small query is answered: {r}");
    assert_eq!(
        r["large"].as_object().unwrap().keys().filter(|c| *c != "OK" && *c != "RESOURCE_EXHAUSTED").count(),
        0,
        "{r}"
    );
    assert!(r["messages"]["large RESOURCE_EXHAUSTED"].as_str().unwrap().contains("grpc_max_queued_tokens"), "{r}");
    assert_eq!(
        server.metric("kvindex_grpc_shed_total", &["method=\"ScoreTokens\""]),
        count("large", "RESOURCE_EXHAUSTED"),
        "each shed query is counted"
    );
    // Nothing is left queued or running, and the index answers exactly.
    wait_until("the large queries to drain", 30, || {
        (server.metric("kvindex_grpc_large_in_flight", &[]) == 0.0
            && server.metric("kvindex_grpc_queued_tokens", &[]) == 0.0)
            .then_some(())
    });
    // The prompt is as long as max_tokens allows, and exactly the held blocks: all but the
    // last block (the engine computes the last token).
    let r = peer.score_exactly(MODEL, &large, &[A]);
    assert_eq!((&r["scores"][0]["matched_blocks"], &r["scores"][0]["state"]), (&json!(16_383), &json!("EXACT")), "{r}");
}
