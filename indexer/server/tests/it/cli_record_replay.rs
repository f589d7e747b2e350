//! `kvindex record` and `kvindex replay`, as the binary: a recording of independent pyzmq
//! publishers with injected faults (a frame lost on the wire and recovered by replay, a
//! malformed payload, removals, a publisher restart) replays offline to the answers the live
//! (recording) indexer gave; `--explain` is checked on a constructed case; damaged dumps are
//! reported clearly (hostile ones: `cli_replay_hostile.rs`).

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "m";

fn kvindex(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex")).args(args).output().expect("run kvindex");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn replay(file: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["replay", file.to_str().unwrap(), "--quiet"];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = kvindex(&args);
    assert!(ok, "kvindex replay failed: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("replay output {stdout:?}: {e}"))
}

/// The token ids of a query for `tokens` and one token more, as `Peer::score` asks the live
/// server: the engine computes a prompt's last token, so only then can every block of `tokens`
/// be credited.
fn ids(tokens: &[u32]) -> String {
    tokens.iter().chain(&[0]).map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// `kvindex record` in central mode; its `KVINDEX_LISTENING` line gives its addresses.
fn start_record(out: &Path) -> (std::process::Child, String, String, String) {
    start_record_with(out, &[])
}

/// [`start_record`] with more `serve` flags.
fn start_record_with(out: &Path, extra: &[&str]) -> (std::process::Child, String, String, String) {
    // Registration (the peer's `register`) needs the admin token.
    let token = admin_token_file();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["record", "--out", out.to_str().unwrap(), "--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"])
        .args(["--admin-token-file", token.to_str().unwrap()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn kvindex record");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let rest = line.trim().strip_prefix("KVINDEX_LISTENING ").unwrap_or_else(|| panic!("{line:?}")).to_string();
    let field = |name: &str| {
        rest.split_whitespace().find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')).map(str::to_string).unwrap()
    };
    (child, field("grpc"), field("http"), field("zmq"))
}

#[test]
fn cli_record_then_replay_gives_the_live_answers_and_explains_a_constructed_case() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("events.jsonl.gz");
    let (mut child, grpc, http, zmq) = start_record(&dump);
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": grpc}));
    for (name, pod) in [("a", "pod-a"), ("b", "pod-b")] {
        let p = peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": zmq,
            "topic": format!("kv@{pod}@{MODEL}"), "replay": "tcp://127.0.0.1:0"}));
        peer.cmd(json!({"op": "register", "pod": pod, "model": MODEL, "replay_endpoint": p["replay_endpoint"]}));
    }
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a", "b"]}))["subscribed"], true);
    // The constructed case: chain 50 stored at s1 (4 blocks), its blocks 2 and 3 removed at s2.
    let s1 =
        peer.cmd(json!({"op": "store", "name": "a", "chain": "e", "tokens": chain(50, 4)}))["seq"].as_u64().unwrap();
    for k in 0..6 {
        peer.cmd(json!({"op": "store", "name": "a", "chain": format!("a{k}"), "tokens": chain(k, 3)}));
        peer.cmd(json!({"op": "store", "name": "b", "chain": format!("b{k}"), "tokens": chain(k + 20, 2)}));
    }
    // Faults: a store lost on the wire (recovered by replay), a malformed payload on b.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "lost", "tokens": chain(30, 2), "drop": true}));
    let s2 = peer.cmd(json!({"op": "remove", "name": "a", "tokens": chain(50, 4), "blocks": [2, 3]}))["seq"]
        .as_u64()
        .unwrap();
    peer.cmd(json!({"op": "malformed", "name": "b"}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "after", "tokens": chain(31, 2)}));
    let info = peer.cmd(json!({"op": "info", "names": ["a", "b"]}));
    wait_until("the recorder caught up", 30, || {
        ["a", "b"]
            .iter()
            .all(|n| {
                let p = &info["pubs"][n];
                debug_source(&http, p["pod"].as_str().unwrap())
                    .is_some_and(|s| s["last_seq"] == p["last_seq"] && s["state"] != "REPLAYING")
            })
            .then_some(())
    });
    peer.check(&["a", "b"], MODEL);
    let queries: Vec<Vec<u32>> = (0..6)
        .map(|k| chain(k, 3))
        .chain((0..6).map(|k| chain(k + 20, 2)))
        .chain([chain(30, 2), chain(31, 2), chain(50, 4)])
        .collect();
    let live: Vec<Vec<(String, u64)>> = queries
        .iter()
        .map(|q| {
            let r = peer.score(MODEL, q, &[]);
            r["scores"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (s["pod"].as_str().unwrap().to_string(), s["matched_blocks"].as_u64().unwrap()))
                .collect()
        })
        .collect();
    assert!(live.iter().any(|l| l.iter().any(|(p, n)| p == "pod-a" && *n > 0)));
    // SIGTERM: the recorder finishes its gzip member.
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    assert!(child.wait().unwrap().success());

    let score_args: Vec<String> = queries.iter().map(|q| format!("{MODEL}:{}", ids(q))).collect();
    let mut args: Vec<&str> = Vec::new();
    for s in &score_args {
        args.extend(["--score", s.as_str()]);
    }
    let explain = format!("{MODEL}:{}", ids(&chain(50, 4)));
    args.extend(["--explain", &explain, "--pod", "pod-a"]);
    let report = replay(&dump, &args);
    let offline: Vec<Vec<(String, u64)>> = report["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["matches"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| (m["pod"].as_str().unwrap().to_string(), m["matched_blocks"].as_u64().unwrap()))
                .collect()
        })
        .collect();
    assert_eq!(offline, live, "replay of the recording answers as the live indexer did: {report:#}");
    assert!(report["totals"]["replay"].as_u64().unwrap() >= 1, "the replay reply was recorded: {report:#}");
    let a = report["sources"].as_array().unwrap().iter().find(|s| s["pod"] == "pod-a").unwrap().clone();
    assert_eq!((a["gaps"].as_u64(), a["replays_filled"].as_u64()), (Some(1), Some(1)), "{a}");

    let ex = &report["explain"];
    assert_eq!(ex["matched_blocks"], 2, "{ex:#}");
    assert_eq!(ex["breaks_at"], 2);
    let blocks = ex["blocks"].as_array().unwrap();
    for (i, b) in blocks.iter().enumerate() {
        let (change, seq) = if i < 2 { ("stored", s1) } else { ("removed", s2) };
        assert_eq!(b["last_change"]["change"], change, "{b}");
        assert_eq!(b["last_change"]["seq"], seq, "{b}");
    }
    assert_eq!(blocks.len(), 4);

    // Up to s2 - 1 (before the removal, which is past the lost seq): all four blocks held.
    let until = (s2 - 2).to_string();
    let early = replay(&dump, &["--until", &until, "--explain", &explain, "--pod", "pod-a"]);
    assert_eq!(early["explain"]["matched_blocks"], 4, "{:#}", early["explain"]);
}

/// A batch the live indexer applied: its stream's pod, its seq, and per probe every pod that
/// matched with its blocks.
type Observed = (String, u64, Vec<Vec<(String, u64)>>);

/// Every pod that a prompt matched, with its blocks, by pod (live: the gRPC answer).
fn matched(scores: &Value) -> Vec<(String, u64)> {
    let mut m: Vec<(String, u64)> = scores
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["pod"].as_str().unwrap().to_string(), s["matched_blocks"].as_u64().unwrap()))
        .filter(|(_, n)| *n > 0)
        .collect();
    m.sort();
    m
}

/// The stream table is one for live and offline ingest: a live session recorded by the real
/// `kvindex record` (a topic mapped to its pod by `--topic-map`, a DP rank-1 stream, a frame
/// lost on the wire and replayed, a publisher restart, i.e. a disconnect and a new connection)
/// replays offline (`kvindex replay --trace`) to the same scores after every batch. The live
/// side is scored once each batch is applied (its stream's applied seq, nothing in flight);
/// the offline side writes a row after every live record of the dump.
#[test]
fn cli_replay_of_a_recorded_session_scores_as_live_after_every_batch() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("session.jsonl.gz");
    let (mut child, grpc, http, zmq) = start_record_with(&dump, &["--topic-map", "eng-a=pod-a"]);
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": grpc}));
    let a = peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "eng-a", "connect": zmq,
        "topic": format!("kv@eng-a@{MODEL}"), "replay": "tcp://127.0.0.1:0"}));
    peer.cmd(json!({"op": "register", "pod": "pod-a", "model": MODEL, "replay_endpoint": a["replay_endpoint"]}));
    peer.cmd(json!({"op": "pub_start", "name": "b", "pod": "pod-b", "connect": zmq, "dp_rank": 1,
        "topic": format!("kv@pod-b@{MODEL}")}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a", "b"]}))["subscribed"], true);
    let probes: Vec<Vec<u32>> = (0..4).map(|k| chain(k, 3)).chain((10..13).map(|k| chain(k, 2))).collect();
    // (stream pod, seq) of every batch the live indexer received, and what the probes scored then.
    let mut live: Vec<Observed> = Vec::new();
    let mut observe = |peer: &mut Peer, pod: &str, seq: u64, state: &str| {
        wait_until(&format!("{pod} applied seq {seq}"), 30, || {
            debug_source(&http, pod)
                .filter(|s| s["last_seq"] == seq && s["state"] == state && s["replay_in_flight"].is_null())
                .map(|_| ())
        });
        let scores = probes.iter().map(|q| matched(&peer.score(MODEL, q, &[])["scores"])).collect();
        live.push((pod.to_string(), seq, scores));
    };
    let store = |peer: &mut Peer, name: &str, k: u32, blocks: usize, drop: bool| {
        let op = json!({"op": "store", "name": name, "chain": format!("{name}{k}"), "tokens": chain(k, blocks), "drop": drop});
        peer.cmd(op)["seq"].as_u64().unwrap()
    };
    let s = store(&mut peer, "a", 0, 3, false);
    observe(&mut peer, "pod-a", s, "EXACT");
    let s = store(&mut peer, "b", 10, 2, false);
    observe(&mut peer, "pod-b#dp1", s, "EXACT");
    let s = store(&mut peer, "a", 1, 3, false);
    observe(&mut peer, "pod-a", s, "EXACT");
    // Lost on the wire: the next batch is a gap, which the replay fills.
    store(&mut peer, "a", 2, 3, true);
    let s = store(&mut peer, "a", 3, 3, false);
    observe(&mut peer, "pod-a", s, "EXACT");
    let s =
        peer.cmd(json!({"op": "remove", "name": "b", "tokens": chain(10, 2), "blocks": [1]}))["seq"].as_u64().unwrap();
    observe(&mut peer, "pod-b#dp1", s, "EXACT");
    let s = store(&mut peer, "b", 11, 2, false);
    observe(&mut peer, "pod-b#dp1", s, "EXACT");
    // A network blip: b's connection is replaced, its seq goes on. Nothing it sent before is
    // trusted (the closed connection cleared the pod), and without a replay socket the pod
    // stays DEGRADED with what comes next. A replay that did not see the connections would
    // apply the next seq onto the old blocks.
    peer.cmd(json!({"op": "reconnect", "name": "b"}));
    wait_until("the blip's close cleared pod-b#dp1", 30, || {
        debug_source(&http, "pod-b#dp1").filter(|s| s["state"] == "CONNECTING").map(|_| ())
    });
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["b"], "fresh": true}))["subscribed"], true);
    let s = store(&mut peer, "b", 12, 2, false);
    observe(&mut peer, "pod-b#dp1", s, "DEGRADED");
    // A new publisher process: the old connection closes (the pod is cleared), the new one
    // starts from seq 0 (an empty replay buffer; nothing of the old process is claimed). Its
    // connection catches up from its replay socket (nothing yet), so the pod may already be
    // EXACT again, holding nothing, when the debug view is read.
    peer.cmd(json!({"op": "restart", "name": "a"}));
    wait_until("the old connection's close cleared pod-a", 30, || {
        debug_source(&http, "pod-a").filter(|s| s["disconnects"] == 1).map(|_| ())
    });
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"], "fresh": true}))["subscribed"], true);
    let s = store(&mut peer, "a", 1, 3, false);
    assert_eq!(s, 0, "a restarted publisher starts over");
    observe(&mut peer, "pod-a", s, "EXACT");
    let s = store(&mut peer, "a", 0, 2, false);
    observe(&mut peer, "pod-a", s, "EXACT");
    let a = debug_source(&http, "pod-a").unwrap();
    // The gap's replay, and the new connection's catch-up (asked as the connection opened,
    // before its first message; refused when the new process's replay socket is not bound yet,
    // as its PUB connects first, and then not tried again: its first message came first).
    assert_eq!((a["gaps"].as_u64(), a["replays_started"].as_u64()), (Some(1), Some(2)), "{a}");
    let filled = a["replays_filled"].as_u64().unwrap();
    assert!(filled == 2 || (filled == 1 && a["replays_failed"] == 1), "{a}");
    assert!(a["disconnects"].as_u64().unwrap() >= 1, "the restart closed a connection: {a}");
    assert!(live.iter().any(|(_, _, s)| s.iter().any(|m| m.iter().any(|(p, _)| p == "pod-b#dp1"))));
    assert!(live.iter().any(|(_, _, s)| s.iter().any(|m| m.iter().any(|(p, _)| p == "pod-a"))));
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    assert!(child.wait().unwrap().success());

    let trace = dir.path().join("trace.jsonl");
    let specs: Vec<String> = probes.iter().map(|q| format!("{MODEL}:{}", ids(q))).collect();
    let mut args = vec!["--topic-map", "eng-a=pod-a", "--trace-out", trace.to_str().unwrap()];
    for spec in &specs {
        args.extend(["--trace", spec.as_str()]);
    }
    let report = replay(&dump, &args);
    let rows: Vec<Value> =
        std::fs::read_to_string(&trace).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // Each live observation is the next trace row for the same stream and seq (the dump may
    // hold more live records than batches observed: none is skipped over on the way).
    let mut next = 0;
    for (pod, seq, scores) in &live {
        let at = rows[next..]
            .iter()
            .position(|r| r["pod"] == pod.as_str() && r["seq"] == *seq)
            .unwrap_or_else(|| panic!("no trace row for {pod} seq {seq} after row {next}: {report:#}"));
        let row = &rows[next + at];
        let offline: Vec<Vec<(String, u64)>> = row["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m.as_array()
                    .unwrap()
                    .iter()
                    .map(|pair| (pair[0].as_str().unwrap().to_string(), pair[1].as_u64().unwrap()))
                    .collect()
            })
            .collect();
        assert_eq!(&offline, scores, "after {pod} seq {seq}: offline {row} vs live; report {report:#}");
        next += at + 1;
    }
    let a = report["sources"].as_array().unwrap().iter().find(|s| s["pod"] == "pod-a").unwrap().clone();
    assert_eq!((a["gaps"].as_u64(), a["replays_filled"].as_u64()), (Some(1), Some(1)), "{a}");
}

#[test]
fn cli_replay_reads_vectors_and_reports_damaged_dumps_clearly() {
    let dir = tempfile::tempdir().unwrap();
    // A vector file replays as a dump: one captured engine, decoded and indexed.
    let vectors = workspace().join("testdata/vllm-vectors/frames-0.33.0.jsonl");
    let report = replay(&vectors, &[]);
    assert!(report["totals"]["live"].as_u64().unwrap() > 0, "{report:#}");
    let sources = report["sources"].as_array().unwrap();
    assert!(sources.iter().any(|s| s["pod"] == "10.0.0.7:8000" && s["model"] == "Qwen/Qwen3-0.6B"), "{report:#}");
    assert!(sources.iter().map(|s| s["stored_blocks"].as_u64().unwrap()).sum::<u64>() > 0, "{report:#}");

    // A bad line is counted and named; the rest replays.
    let text = std::fs::read_to_string(&vectors).unwrap();
    let mut lines: Vec<&str> = text.lines().take(5).collect();
    lines.insert(2, "{not json");
    let damaged = dir.path().join("damaged.jsonl");
    std::fs::write(&damaged, lines.join("\n")).unwrap();
    let report = replay(&damaged, &[]);
    assert_eq!(report["bad_lines"], 1, "{report:#}");
    assert!(report["first_bad_line"].as_str().unwrap().starts_with("line 3"), "{report:#}");

    // A truncated gzip dump: the lines before the cut replay, a clear message naming the
    // file, exit status 2, no panic.
    let gz = dir.path().join("cut.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, text.as_bytes()).unwrap();
    let bytes = enc.finish().unwrap();
    std::fs::write(&gz, &bytes[..bytes.len() / 2]).unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_kvindex")).args(["replay", gz.to_str().unwrap(), "--quiet"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cut.jsonl.gz: input ends early") && !stderr.contains("panicked"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["totals"]["live"].as_u64().unwrap() > 0, "{report:#}");
    let (ok, _, stderr) = kvindex(&["replay", "/nonexistent/dump", "--quiet"]);
    assert!(!ok && stderr.contains("/nonexistent/dump"), "{stderr}");
}
