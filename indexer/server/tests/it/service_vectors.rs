//! `kvindex serve` fed with the frames captured from vLLM's own publisher (every release in
//! `testdata/vllm-vectors`), sent byte for byte by a pyzmq publisher in central mode. One captured
//! frame is withheld, so the index must be completed through the replay ROUTER (reply layout
//! without the topic frame up to 0.25, with it from 0.26). Scores are checked at two points.

use crate::support::*;
use serde_json::{json, Value};

const POD: &str = "10.0.0.7:8000";
const MODEL: &str = "Qwen/Qwen3-0.6B";

fn tokens_of(event: &Value) -> Vec<u32> {
    event["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect()
}

fn run(version: &str) {
    let Some(py) = python() else { return };
    let live: Vec<Value> = read_jsonl(&format!("frames-{version}.jsonl"))
        .into_iter()
        .filter(|r| r["kind"] == "live" && r["scenario"] == "main")
        .collect();
    assert!(live.len() > 8, "{version}: too few live frames");
    let topic = live[0]["publisher"]["topic"].as_str().unwrap().to_string();
    let topic_frame = version_at_least(version, (0, 26));
    // The 64-block chain, and the store after the final AllBlocksCleared.
    let long_at = live
        .iter()
        .position(|r| r["expect"]["events"][0]["block_hashes"].as_array().is_some_and(|h| h.len() == 64))
        .unwrap();
    let long_tokens = tokens_of(&live[long_at]["expect"]["events"][0]);
    let last_tokens = tokens_of(&live.last().unwrap()["expect"]["events"][0]);

    let server = Server::start(&["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"]);
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let p = peer.cmd(
        json!({"op": "pub_start", "name": "v", "pod": POD, "connect": server.zmq(), "replay": "tcp://127.0.0.1:0",
        "topic": topic, "replay_topic_frame": topic_frame}),
    );
    peer.cmd(json!({"op": "register", "pod": POD, "model": MODEL, "replay_endpoint": p["replay_endpoint"]}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["v"]}))["subscribed"], true);

    let send = |peer: &mut Peer, r: &Value, drop: bool| {
        peer.cmd(json!({"op": "raw", "name": "v", "frames_hex": r["frames_hex"], "drop": drop}));
    };
    for (i, r) in live[..=long_at].iter().enumerate() {
        send(&mut peer, r, i == 3);
    }
    let long_seq = live[long_at]["expect"]["seq"].as_u64().unwrap();
    wait_until("replayed through the long chain", 30, || {
        let s = server.source(POD)?;
        (s["last_seq"] == long_seq && s["state"] == "EXACT").then_some(())
    });
    // Streams that also store in a sliding-window group (group 1 of the newer vectors) make the
    // pod hybrid: vLLM serves a prefix only where every group can, and that group holds none of
    // these chains, so the exact answer is 0. The chain is still held: the source
    // counts its blocks.
    let hybrid = |records: &[Value]| {
        records.iter().any(|r| {
            r["expect"]["events"]
                .as_array()
                .is_some_and(|es| es.iter().any(|e| e["group_idx"].as_i64().unwrap_or(0) > 0))
        })
    };
    let long_expected = if hybrid(&live[..long_at]) { 0 } else { 64 };
    assert_eq!(
        peer.score_pod(MODEL, &long_tokens, POD),
        (long_expected, "EXACT".to_string()),
        "{version}: 64-block chain"
    );
    assert!(server.source(POD).unwrap()["blocks"].as_u64().unwrap() >= 64, "{version}: the chain is held");

    for r in &live[long_at + 1..] {
        send(&mut peer, r, false);
    }
    let last_seq = live.last().unwrap()["expect"]["seq"].as_u64().unwrap();
    wait_until("every frame applied", 30, || {
        let s = server.source(POD)?;
        (s["last_seq"] == last_seq && s["state"] == "EXACT").then_some(())
    });
    let r = peer.score(MODEL, &last_tokens, &[]);
    if hybrid(&live) {
        assert_eq!(peer.score_pod(MODEL, &last_tokens, POD), (0, "EXACT".to_string()), "{version}: {r}");
    } else {
        assert_eq!(r["scores"][0]["pod"], POD, "{version}: {r}");
        assert_eq!(r["scores"][0]["matched_blocks"], 2, "{version}: {r}");
        assert_eq!(r["scores"][0]["matched_by_tier"]["GPU"], 2, "{version}: {r}");
        assert_eq!(r["scores"][0]["state"], "EXACT");
    }
    assert_eq!(r["block_size"], 16);
    // Cleared by AllBlocksCleared.
    assert_eq!(peer.score_pod(MODEL, &long_tokens, POD).0, 0, "{version}: cleared chain still credited");
    let s = server.source(POD).unwrap();
    assert_eq!(s["gaps"], 1, "{s}");
    assert_eq!(s["replays_filled"], 1, "{s}");
    assert_eq!(server.metric("kvindex_decode_errors_total", &[]), 0.0);
    assert!(server.metric("kvindex_replays_total", &["outcome=\"filled\""]) >= 1.0);
}

fn version_at_least(v: &str, (maj, min): (u64, u64)) -> bool {
    let mut it = v.split('.').map(|x| x.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap()) >= (maj, min)
}

#[test]
fn service_vectors_0_9_0() {
    run("0.9.0");
}

#[test]
fn service_vectors_0_10_1() {
    run("0.10.1");
}

#[test]
fn service_vectors_0_17_0() {
    run("0.17.0");
}

#[test]
fn service_vectors_0_23_0() {
    run("0.23.0");
}

#[test]
fn service_vectors_0_33_0() {
    run("0.33.0");
}
