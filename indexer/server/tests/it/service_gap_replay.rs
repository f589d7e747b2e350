//! A lost live frame, replayed, leaves the pod exact: `kvindex serve` fed with the frames of
//! vLLM's own publisher (`testdata/vllm-vectors`, every release, scenario `main`) by a pyzmq
//! PUB whose ROUTER answers replays as vLLM's does, with one frame and then two non-adjacent
//! frames never sent. After every frame the server has applied, every prompt is scored over
//! gRPC and compared with the reference model of what the engine holds
//! (`indexer/tests/it/support/reference.rs`, the same model the core's vectors test uses), in
//! central mode (engines dial our SUB) and per-pod mode (we dial each engine), with replay
//! replies with and without the topic frame.
//!
//! Why: a report said a filled replay left the pod scoring 0 for every prefix. It
//! did not (see `hybrid_streams_score_the_same_with_and_without_a_lost_frame`): the 0.23 and
//! 0.33 vectors store in a sliding-window group, which makes the pod hybrid, and vLLM then
//! serves only prefixes every group holds. No test drove a lost frame through the service and
//! held every answer after it to a reference; this one does.

use crate::support::reference::Reference;
use crate::support::*;
use serde_json::{json, Value};

const POD: &str = "10.0.0.7:8000";
const MODEL: &str = "Qwen/Qwen3-0.6B";

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// The publisher dials the server's bound SUB.
    Central,
    /// The server dials the publisher's PUB (registered with its replay endpoint).
    PerPod,
}

/// The main scenario's live records of `version`.
fn live_frames(version: &str) -> Vec<Value> {
    let live: Vec<Value> = read_jsonl(&format!("frames-{version}.jsonl"))
        .into_iter()
        .filter(|r| r["kind"] == "live" && r["scenario"] == "main")
        .collect();
    assert!(live.len() > 10, "{version}: too few live frames");
    live
}

fn payload_of(record: &Value) -> Vec<u8> {
    hex::decode(record["frames_hex"][2].as_str().unwrap()).unwrap()
}

/// Publishes `version`'s main stream without the frames at `drops`; after every frame the
/// server must have applied (each frame that is not dropped), checks every score against the
/// reference. Returns the answers, one line per checked frame.
fn run(version: &str, mode: Mode, topic_frame: bool, drops: &[usize]) -> Vec<String> {
    let py = python().expect("python peers");
    let live = live_frames(version);
    let topic = live[0]["publisher"]["topic"].as_str().unwrap().to_string();
    let server = match mode {
        Mode::Central => Server::start(&["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"]),
        Mode::PerPod => Server::start(&["--block-size", "16"]),
    };
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let mut publisher = json!({"op": "pub_start", "name": "v", "pod": POD, "replay": "tcp://127.0.0.1:0",
        "topic": topic, "replay_topic_frame": topic_frame});
    match mode {
        Mode::Central => publisher["connect"] = json!(server.zmq()),
        Mode::PerPod => publisher["bind"] = json!("tcp://127.0.0.1:0"),
    }
    let p = peer.cmd(publisher);
    let mut register = json!({"op": "register", "pod": POD, "model": MODEL, "replay_endpoint": p["replay_endpoint"]});
    if let Mode::PerPod = mode {
        register["endpoint"] = p["endpoint"].clone();
    }
    peer.cmd(register);
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["v"]}))["subscribed"], true);

    let what = format!("{version} {mode:?} topic_frame={topic_frame} drops={drops:?}");
    let mut reference = Reference::default();
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    let mut answers = Vec::new();
    let mut checked_positive = 0;
    for (i, record) in live.iter().enumerate() {
        let dropped = drops.contains(&i);
        peer.cmd(json!({"op": "raw", "name": "v", "frames_hex": record["frames_hex"], "drop": dropped}));
        // The engine holds what it published, whether or not the frame reached us.
        let payload = payload_of(record);
        let batch = kvindex::wire::decode_batch(&payload).unwrap();
        for e in &batch.events {
            reference.apply(e);
            if let kvindex::wire::Event::BlockStored(s) = e {
                if let Some(t) = s.token_ids.as_ref().filter(|t| !t.is_empty()) {
                    prompts.push(t.clone());
                }
            }
        }
        if dropped {
            // Nothing tells the server a frame was lost until the next one comes.
            continue;
        }
        let seq = record["expect"]["seq"].as_u64().unwrap();
        wait_until(&format!("{what}: frame {i} (seq {seq}) applied, EXACT"), 30, || {
            let s = server.source(POD)?;
            (s["last_seq"] == seq && s["state"] == "EXACT" && s["replay_in_flight"].is_null()).then_some(())
        });
        // Every prefix the engine holds in any group, every prompt it stored (their prefixes
        // are what a plain query reaches), and each one token longer (vLLM serves at most the
        // prompt's tokens minus one).
        let mut queries: Vec<Vec<u32>> = reference.groups.keys().flat_map(|&g| reference.plain_prefixes(g)).collect();
        queries.sort();
        queries.extend(prompts.iter().cloned());
        let longer: Vec<Vec<u32>> = queries.iter().map(|q| [q.as_slice(), &[7]].concat()).collect();
        queries.extend(longer);
        let got = peer.cmd(json!({"op": "score_pod_many", "model": MODEL, "pod": POD, "prompts": queries}));
        let got = got["scores"].as_array().unwrap();
        let mut line = Vec::new();
        for (q, g) in queries.iter().zip(got) {
            let want = u64::from(reference.expected(q));
            let (matched, state) = (g[0].as_u64().unwrap(), g[1].as_str().unwrap());
            assert_eq!(state, "EXACT", "{what}: frame {i}: query of {} tokens", q.len());
            assert_eq!(matched, want, "{what}: frame {i} (seq {seq}): query of {} tokens", q.len());
            checked_positive += usize::from(want > 0);
            line.push(matched);
        }
        answers.push(format!("frame {i}: {line:?}"));
    }
    let s = server.source(POD).unwrap();
    // Each lost frame is one gap that a replay filled; nothing was cleared.
    let gaps = drops.len() as u64;
    assert_eq!(s["gaps"], gaps, "{what}: {s}");
    // Per-pod, the start-up sync and the catch-up on the dialer's connection fill too (the
    // catch-up waits for the start-up sync, and a first live message before it makes it
    // needless: 0 or 1 of it).
    let filled = s["replays_filled"].as_u64().unwrap();
    match mode {
        Mode::Central => assert_eq!(filled, gaps, "{what}: {s}"),
        Mode::PerPod => assert!((gaps + 1..=gaps + 2).contains(&filled), "{what}: {s}"),
    }
    assert_eq!(s["replays_failed"], 0, "{what}: {s}");
    // No gap cleared anything. Per-pod, a start-up sync answered before the dialer's
    // connection opened is read again from 0 on that connection (the engine may have restarted
    // in between): at most that one clear, a restart of the stream, which no gap makes.
    match mode {
        Mode::Central => assert_eq!(s["clears"], 0, "{what}: {s}"),
        Mode::PerPod => {
            assert!(s["clears"].as_u64().unwrap() <= 1, "{what}: {s}");
            assert_eq!(s["clears"], s["restarts"], "{what}: only the reconnect's clear: {s}");
        }
    }
    assert!(checked_positive > 0, "{what}: no query had a positive expectation");
    answers
}

/// One lost frame, then two non-adjacent ones (each filled by its own replay), for a release.
fn lose_frames(version: &str, mode: Mode, topic_frame: bool) {
    run(version, mode, topic_frame, &[3]);
    run(version, mode, topic_frame, &[7, 9]);
}

/// vLLM sends the topic frame in replay replies from 0.26 on.
fn native_topic_frame(version: &str) -> bool {
    let mut it = version.split('.').map(|x| x.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap()) >= (0, 26)
}

macro_rules! releases {
    ($($name:ident => $version:literal),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                #[test]
                fn central_lost_frames_replayed_exactly() {
                    lose_frames($version, Mode::Central, native_topic_frame($version));
                }

                #[test]
                fn per_pod_lost_frames_replayed_exactly() {
                    lose_frames($version, Mode::PerPod, native_topic_frame($version));
                }
            }
        )*
    };
}

releases! {
    v0_9_0 => "0.9.0",
    v0_10_1 => "0.10.1",
    v0_17_0 => "0.17.0",
    v0_23_0 => "0.23.0",
    v0_33_0 => "0.33.0",
}

/// Both replay reply layouts against the newest release: the server reads either, whatever
/// the release the frames came from.
#[test]
fn central_replies_without_the_topic_frame() {
    lose_frames("0.33.0", Mode::Central, false);
}

#[test]
fn per_pod_replies_without_the_topic_frame() {
    lose_frames("0.9.0", Mode::PerPod, true);
}

/// The reported scenario (0.33.0, the frame of seq 6 lost): the pod scores exactly what it
/// scores when nothing is lost, after every frame. That frame stores in a sliding-window
/// group, so from there on vLLM serves only prefixes both groups hold (none of the others).
#[test]
fn hybrid_streams_score_the_same_with_and_without_a_lost_frame() {
    let whole = run("0.33.0", Mode::Central, true, &[]);
    let lost = run("0.33.0", Mode::Central, true, &[6]);
    let whole: Vec<&String> = whole.iter().filter(|l| !l.starts_with("frame 6:")).collect();
    assert_eq!(lost.iter().collect::<Vec<_>>(), whole);
}
