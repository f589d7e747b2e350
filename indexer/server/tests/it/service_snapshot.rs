//! Warm restarts from RocksDB snapshots, against independent pyzmq/msgspec publishers whose
//! replay buffers (`buffer_steps`) no longer reach seq 0, so only the snapshot can bring the
//! index back exact. The real `kvindex` binary is killed with SIGKILL mid-ingest; the one rule
//! is checked before, during and after catch-up.

use std::path::Path;

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "m";
const POD: &str = "warm:8000";

/// The `kvindex serve` flags of a per-pod server over a publisher at fixed ports.
fn serve_args(pub_port: u16, replay_port: u16, dir: &Path) -> Vec<String> {
    let flag = format!("{POD},{MODEL},tcp://127.0.0.1:{pub_port},tcp://127.0.0.1:{replay_port}");
    [
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--block-size",
        "16",
        "--pod",
        &flag,
        "--snapshot-dir",
        dir.to_str().unwrap(),
        "--snapshot-interval",
        "1",
        "--replay-timeout-ms",
        "3000",
        // The publisher starts after the server: its first (failed) replay must not hold gaps
        // off for long.
        "--replay-cooldown-ms",
        "100",
    ]
    .map(String::from)
    .to_vec()
}

fn start(args: &[String]) -> ServeProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kvindex_serve().args(&args).start().expect("kvindex serve")
}

fn source(http: &str) -> Option<Value> {
    debug_source(http, POD)
}

/// Waits until the server has applied the publisher's last seq; returns the source's state.
fn settle(peer: &mut Peer, http: &str, secs: u64) -> String {
    let info = peer.cmd(json!({"op": "info", "names": ["a"]}));
    let last = info["pubs"]["a"]["last_seq"].clone();
    wait_until("caught up with the publisher", secs, || {
        let s = source(http)?;
        (s["last_seq"] == last && s["state"] != "REPLAYING").then(|| s["state"].as_str().unwrap().to_string())
    })
}

/// Waits for a snapshot that covers the publisher's last seq (two writes after catching up).
fn wait_snapshot(http: &str) {
    let before = http_metric(http, "kvindex_snapshot_writes_total", &["outcome=\"ok\""]);
    wait_until("two more snapshots", 20, || {
        (http_metric(http, "kvindex_snapshot_writes_total", &["outcome=\"ok\""]) >= before + 2.0).then_some(())
    });
}

/// A publisher with a 20-message replay buffer, and 30 stores (seqs 0..29): seq 0 is gone.
fn publisher(py: &std::path::PathBuf, pub_port: u16, replay_port: u16) -> Peer {
    let mut peer = Peer::start(py);
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": POD, "bind": format!("tcp://127.0.0.1:{pub_port}"),
        "replay": format!("tcp://127.0.0.1:{replay_port}"), "buffer_steps": 20, "topic": format!("kv@{POD}@{MODEL}")}));
    peer
}

/// Seq 0, applied before the burst: the server's start-up replay (sent before the publisher
/// was up) must not race a burst past the 20-message buffer.
fn first_batch(peer: &mut Peer, http: &str) {
    ingest(peer, 0, 1);
    assert_eq!(settle(peer, http, 30), "EXACT");
}

/// Waits until the restarted server has subscribed again: a message published before that is
/// lost to ZeroMQ's slow joiner, and if it is the stream's last, the server never learns of it.
fn resubscribed(peer: &mut Peer, names: &[&str]) {
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": names, "fresh": true}))["subscribed"], true);
}

fn ingest(peer: &mut Peer, from: u32, to: u32) {
    for k in from..to {
        peer.cmd(json!({"op": "store", "name": "a", "chain": format!("c{k}"), "tokens": chain(k, 4)}));
        if k % 7 == 3 {
            peer.cmd(json!({"op": "remove", "name": "a", "tokens": chain(k - 2, 4), "blocks": [2, 3]}));
        }
    }
}

/// `kvindex serve` with snapshots in `dir`, dialling a pyzmq publisher that has published chains
/// 1..`to` (and some removals), settled EXACT. Returns the serve arguments for the restart.
fn serving_an_ingested_publisher(py: &std::path::PathBuf, dir: &Path, to: u32) -> (Vec<String>, ServeProcess, Peer) {
    let (pub_port, replay_port) = (free_port(), free_port());
    let args = serve_args(pub_port, replay_port, dir);
    let server = start(&args);
    let mut peer = publisher(py, pub_port, replay_port);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    first_batch(&mut peer, &server.http);
    ingest(&mut peer, 1, to);
    assert_eq!(settle(&mut peer, &server.http, 30), "EXACT");
    (args, server, peer)
}

#[test]
fn service_warm_restart_after_sigkill_catches_up_exactly_from_the_snapshot() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (args, mut server, mut peer) = serving_an_ingested_publisher(&py, dir.path(), 30);
    wait_snapshot(&server.http);
    // Heavy ingest, then SIGKILL with messages in flight; more are published while it is down.
    ingest(&mut peer, 30, 36);
    server.process.kill();
    ingest(&mut peer, 36, 40);

    let server = start(&args);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    // During catch-up: never a block the publisher does not hold.
    while source(&server.http).is_none_or(|s| s["state"] == "REPLAYING" || s["state"] == "CONNECTING") {
        peer.check(&["a"], MODEL);
    }
    resubscribed(&mut peer, &["a"]);
    ingest(&mut peer, 40, 42);
    assert_eq!(settle(&mut peer, &server.http, 30), "EXACT", "{:?}", source(&server.http));
    let r = peer.check(&["a"], MODEL);
    assert_eq!(r["mismatches"], json!([]), "after catch-up the index equals the publisher's full stream: {r}");
    assert!(http_metric(&server.http, "kvindex_snapshot_restored_pods_total", &["outcome=\"imported\""]) >= 1.0);
    // A chain stored before the restart, long out of the replay buffer, is credited in full.
    assert_eq!(peer.score_pod(MODEL, &chain(5, 4), POD), (4, "EXACT".to_string()));
}

#[test]
fn service_warm_restart_with_a_too_short_replay_buffer_degrades_without_false_positives() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (args, mut server, mut peer) = serving_an_ingested_publisher(&py, dir.path(), 10);
    wait_snapshot(&server.http);
    server.process.kill();
    // 30 messages while it is down: the 20-message buffer no longer reaches the cursor.
    for k in 0..10 {
        peer.cmd(json!({"op": "remove", "name": "a", "tokens": chain(k, 4), "blocks": [0, 1, 2, 3]}));
    }
    ingest(&mut peer, 10, 30);

    let server = start(&args);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    resubscribed(&mut peer, &["a"]);
    ingest(&mut peer, 30, 31);
    assert_eq!(settle(&mut peer, &server.http, 30), "DEGRADED");
    let r = peer.check(&["a"], MODEL);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), POD).0, 0, "removed while we were away: {r}");
    assert_eq!(http_metric(&server.http, "kvindex_snapshot_restored_pods_total", &["outcome=\"imported\""]), 0.0);
    assert_eq!(http_metric(&server.http, "kvindex_snapshot_restored_pods_total", &["outcome=\"dropped\""]), 1.0);
}

#[test]
fn service_graceful_restart_restores_scores_and_a_corrupt_snapshot_starts_clean() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (args, mut server, mut peer) = serving_an_ingested_publisher(&py, dir.path(), 30);
    let before: Vec<Value> = (0..30).map(|k| peer.score(MODEL, &chain(k, 4), &[])["scores"].clone()).collect();
    // SIGTERM: graceful, with a final snapshot.
    let pid = server.process.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(server.process.wait().unwrap().success());

    server = start(&args);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    wait_until("ready", 20, || (http_request(&server.http, "GET", "/readyz", None).0 == 200).then_some(()));
    resubscribed(&mut peer, &["a"]);
    peer.check(&["a"], MODEL);
    // The next message proves the stream continued from the cursor; the pod comes back whole.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "next", "tokens": chain(99, 1)}));
    assert_eq!(settle(&mut peer, &server.http, 30), "EXACT");
    let after: Vec<Value> = (0..30).map(|k| peer.score(MODEL, &chain(k, 4), &[])["scores"].clone()).collect();
    assert_eq!(after, before, "scores after a warm restart equal those before it");
    server.process.kill();

    // Damage every file of the store: the next start refuses it, starts clean and says why.
    corrupt_store(dir.path());
    let server = start(&args);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    assert_eq!(http_metric(&server.http, "kvindex_snapshot_loads_total", &["outcome=\"refused\""]), 1.0);
    assert!(http_metric(&server.http, "kvindex_snapshot_load_errors_total", &[]) >= 1.0);
    // Ready means the start-up replay is over and the subscription is up: a store sent before
    // that can fall between the replay's answer and the live stream (ZeroMQ's slow joiner).
    wait_until("ready", 20, || (http_request(&server.http, "GET", "/readyz", None).0 == 200).then_some(()));
    resubscribed(&mut peer, &["a"]);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "next2", "tokens": chain(98, 1)}));
    settle(&mut peer, &server.http, 30);
    peer.check(&["a"], MODEL);
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), POD).0, 0, "nothing from the refused snapshot");
}

/// Damages every file of the store in `dir` (those over 64 bytes): the next start refuses it.
fn corrupt_store(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let len = std::fs::metadata(&path).unwrap().len();
        if len > 64 {
            let mut bytes = std::fs::read(&path).unwrap();
            for b in bytes.iter_mut().skip(len as usize / 3).take(32) {
                *b ^= 0x5a;
            }
            std::fs::write(&path, bytes).unwrap();
        }
    }
}

/// The real vLLM hybrid capture (Gemma 3: a sliding-window group and a full-attention group;
/// see `indexer/tests/it/real_hybrid_engine.rs`): its payloads, and the requests' prompts.
fn hybrid_capture() -> (Vec<Vec<u8>>, Vec<Vec<u32>>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../loadtest/real-vllm/captures");
    let lines = |name: &str| -> Vec<Value> {
        std::fs::read_to_string(dir.join(name)).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let payloads = lines("frames-0.32.0-real-hybrid.jsonl")
        .iter()
        .map(|r| hex::decode(r["frames_hex"][2].as_str().unwrap()).unwrap())
        .collect();
    let prompts = lines("requests-0.32.0-real-hybrid.jsonl")
        .iter()
        .map(|r| r["prompt_token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect())
        .collect();
    (payloads, prompts)
}

/// The pod's matched blocks per prompt, as the in-process core scores `payloads`.
fn core_scores(payloads: &[Vec<u8>], prompts: &[Vec<u32>]) -> Vec<u32> {
    let index = kvindex::KvIndex::new(kvindex::KvIndexConfig { block_size: 32, ..Default::default() });
    for p in payloads {
        index.apply(POD, "tiny", &kvindex::wire::decode_batch(p).unwrap());
    }
    prompts
        .iter()
        .map(|t| {
            let q = kvindex::ScoreQuery { model: "tiny", lora_name: None, cache_salt: None, token_ids: t, pods: None };
            index.score(&q).matches.first().map_or(0, |m| m.matched_blocks)
        })
        .collect()
}

#[test]
fn service_graceful_restart_restores_a_hybrid_pod_with_its_groups() {
    let Some(py) = python() else { return };
    let (payloads, prompts) = hybrid_capture();
    let (before, after) = payloads.split_at(12);
    let expected = core_scores(&payloads, &prompts);
    // The test can fail: a cold start (what the messages after the restart alone give) differs.
    assert_ne!(core_scores(after, &prompts), expected);
    let dir = tempfile::tempdir().unwrap();
    let (pub_port, replay_port) = (free_port(), free_port());
    let flag = format!("{POD},tiny,tcp://127.0.0.1:{pub_port},tcp://127.0.0.1:{replay_port}");
    let mut args = serve_args(pub_port, replay_port, dir.path());
    let at = args.iter().position(|a| a == "--pod").unwrap();
    args[at + 1] = flag;
    let at = args.iter().position(|a| a == "--block-size").unwrap();
    args[at + 1] = "32".into();
    let mut server = start(&args);
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": POD, "bind": format!("tcp://127.0.0.1:{pub_port}"),
        "replay": format!("tcp://127.0.0.1:{replay_port}"), "buffer_steps": 100, "topic": format!("kv@{POD}@tiny")}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    let topic = hex::encode(format!("kv@{POD}@tiny"));
    let publish = |peer: &mut Peer, seq: usize, payload: &[u8]| {
        let frames = [topic.clone(), hex::encode((seq as u64).to_be_bytes()), hex::encode(payload)];
        peer.cmd(json!({"op": "raw", "name": "a", "frames_hex": frames}));
    };
    publish(&mut peer, 0, &before[0]);
    assert_eq!(settle(&mut peer, &server.http, 30), "EXACT");
    for (seq, p) in before.iter().enumerate().skip(1) {
        publish(&mut peer, seq, p);
    }
    assert_eq!(settle(&mut peer, &server.http, 30), "EXACT");
    let pid = server.process.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(server.process.wait().unwrap().success());

    let server = start(&args);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    resubscribed(&mut peer, &["a"]);
    for (k, p) in after.iter().enumerate() {
        publish(&mut peer, before.len() + k, p);
    }
    assert_eq!(settle(&mut peer, &server.http, 30), "EXACT");
    assert!(http_metric(&server.http, "kvindex_snapshot_restored_pods_total", &["outcome=\"imported\""]) >= 1.0);
    let served: Vec<u32> = prompts.iter().map(|t| peer.score_pod("tiny", t, POD).0 as u32).collect();
    assert_eq!(served, expected, "the hybrid pod came back with its groups and residencies");
}

/// Incremental snapshots: of two pods, only the one whose stream moved has its record written
/// again; the other's stored record is kept as it was, and still brings its pod back exactly
/// after a SIGKILL, from a cursor the engine's replay buffer no longer reaches past.
#[test]
fn service_snapshots_rewrite_only_the_streams_that_moved() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pods = [("a", "busy:8000", free_port(), free_port()), ("b", "idle:8000", free_port(), free_port())];
    let mut args = serve_args(pods[0].2, pods[0].3, dir.path());
    let at = args.iter().position(|a| a == "--pod").unwrap();
    args[at + 1] = format!("{},{MODEL},tcp://127.0.0.1:{},tcp://127.0.0.1:{}", pods[0].1, pods[0].2, pods[0].3);
    args.push("--pod".into());
    args.push(format!("{},{MODEL},tcp://127.0.0.1:{},tcp://127.0.0.1:{}", pods[1].1, pods[1].2, pods[1].3));
    let mut server = start(&args);
    let mut peer = Peer::start(&py);
    for (name, pod, pub_port, replay_port) in pods {
        peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "bind": format!("tcp://127.0.0.1:{pub_port}"),
            "replay": format!("tcp://127.0.0.1:{replay_port}"), "buffer_steps": 20, "topic": format!("kv@{pod}@{MODEL}")}));
    }
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a", "b"]}))["subscribed"], true);
    // Distinct chains per pod: b's blocks can only come back through b's own record.
    let store = |peer: &mut Peer, name: &str, k: u32| {
        let k = if name == "b" { 1000 + k } else { k };
        peer.cmd(json!({"op": "store", "name": name, "chain": format!("c{k}"), "tokens": chain(k, 4)}));
    };
    for name in ["a", "b"] {
        store(&mut peer, name, 0);
    }
    peer.wait_exact(&server, &["a", "b"], MODEL, "EXACT", 30);
    for k in 1..25 {
        for name in ["a", "b"] {
            store(&mut peer, name, k);
        }
    }
    peer.wait_exact(&server, &["a", "b"], MODEL, "EXACT", 30);
    wait_snapshot(&server.http);
    let counts = |http: &str| {
        let streams = |outcome: &str| {
            http_metric(http, "kvindex_snapshot_streams_total", &[&format!("outcome=\"{outcome}\"")]) as u64
        };
        (
            http_metric(http, "kvindex_snapshot_writes_total", &["outcome=\"ok\""]) as u64,
            streams("written"),
            streams("kept"),
        )
    };
    // Nothing moves: snapshots keep both records and write none.
    let (w0, written0, kept0) = counts(&server.http);
    wait_until("three more snapshots", 20, || (counts(&server.http).0 >= w0 + 3).then_some(()));
    let (_, written1, kept1) = counts(&server.http);
    assert_eq!(written1, written0, "no stream moved: no record written");
    assert!(kept1 >= kept0 + 4, "both records kept by every snapshot ({kept0} -> {kept1})");
    // Only a moves: its record is written again, b's is kept.
    for k in 25..30 {
        store(&mut peer, "a", k);
    }
    peer.settle(&server, &["a"]);
    wait_snapshot(&server.http);
    let (_, written2, kept2) = counts(&server.http);
    assert!(written2 > written1, "a moved: its record was written");
    let (w3, ..) = counts(&server.http);
    wait_until("two more snapshots", 20, || (counts(&server.http).0 >= w3 + 2).then_some(()));
    let (_, written3, kept3) = counts(&server.http);
    assert_eq!(written3, written2, "nothing moved since");
    assert!(kept3 > kept2);

    // SIGKILL; both publishers go on while it is down (b by one batch only).
    server.process.kill();
    store(&mut peer, "a", 30);
    store(&mut peer, "b", 25);
    let server = start(&args);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    resubscribed(&mut peer, &["a", "b"]);
    for name in ["a", "b"] {
        store(&mut peer, name, 31);
    }
    let r = peer.wait_exact(&server, &["a", "b"], MODEL, "EXACT", 30);
    assert_eq!(r["mismatches"], json!([]), "{r}");
    assert_eq!(http_metric(&server.http, "kvindex_snapshot_restored_pods_total", &["outcome=\"imported\""]), 2.0);
    // Chains long out of both replay buffers, credited in full: b's from its kept record.
    assert_eq!(peer.score_pod(MODEL, &chain(1002, 4), "idle:8000"), (4, "EXACT".to_string()));
    assert_eq!(peer.score_pod(MODEL, &chain(2, 4), "busy:8000"), (4, "EXACT".to_string()));
}

/// `kvindex serve` flags of a server with no pods, snapshotting to `dir` every second.
fn bare_args(dir: &Path) -> Vec<String> {
    ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--snapshot-dir", dir.to_str().unwrap()]
        .into_iter()
        .chain(["--snapshot-interval", "1"])
        .map(String::from)
        .collect()
}

fn refused(args: &[String]) -> (std::process::ExitStatus, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    serve_refused(&args, 30)
}

fn snapshots_written(http: &str) -> f64 {
    http_metric(http, "kvindex_snapshot_writes_total", &["outcome=\"ok\""])
}

/// The names in `dir`, sorted, with each file's contents.
fn listing(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap_or_default())
        })
        .collect();
    names.sort();
    names
}

/// A store in `dir` as a server leaves it after a snapshot (SIGKILLed), then damaged.
fn a_corrupt_store(dir: &Path) {
    let mut server = start(&bare_args(dir));
    wait_until("a snapshot", 20, || (snapshots_written(&server.http) >= 1.0).then_some(()));
    server.process.kill();
    corrupt_store(dir);
}

/// A refused snapshot removed the whole directory, the operator's files in it too,
/// and through a symlink replaced the link with a directory of its own. A directory holding a
/// file kvindex did not write is refused at start, naming the file, with nothing touched,
/// whether named directly or through a link; a store of RocksDB's files alone still starts
/// clean (through the link too, which stays a link).
#[test]
fn service_a_snapshot_dir_with_an_operator_file_refuses_to_start_and_nothing_is_deleted() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("snapshots");
    a_corrupt_store(&dir);
    std::fs::write(dir.join("notes.txt"), "the operator's notes").unwrap();
    let before = listing(&dir);

    let (status, stderr) = refused(&bare_args(&dir));
    assert!(!status.success(), "{status}");
    assert!(
        stderr.contains(dir.to_str().unwrap()) && stderr.contains("\"notes.txt\""),
        "names the dir and the file: {stderr}"
    );
    assert!(stderr.contains("did not write"), "{stderr}");
    assert_eq!(listing(&dir), before, "nothing in the directory was touched");

    let link = root.path().join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let (status, stderr) = refused(&bare_args(&link));
    assert!(!status.success(), "{status}");
    assert!(stderr.contains("\"notes.txt\""), "{stderr}");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is still a link");
    assert_eq!(listing(&dir), before, "nothing in the link's target was touched");

    // Only RocksDB's files: refused and started clean, in the link's target.
    std::fs::remove_file(dir.join("notes.txt")).unwrap();
    let server = start(&bare_args(&link));
    assert_eq!(http_metric(&server.http, "kvindex_snapshot_loads_total", &["outcome=\"refused\""]), 1.0);
    wait_until("a snapshot", 20, || (snapshots_written(&server.http) >= 1.0).then_some(()));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is still a link");
    assert!(dir.join("CURRENT").is_file(), "the new store is in the link's target");
}

/// A second server on the same snapshot directory (a rolling update on a shared
/// volume) deleted the first one's live store, and the first went on writing snapshots into
/// deleted files. It must fail at start, naming the directory and the holder, and leave the
/// first one's store whole: that store, not an empty one, is what the next server loads. A
/// holder that predates kvindex's lock file (here: the file removed under it) is still seen,
/// through RocksDB's own lock.
#[test]
fn service_a_second_server_on_a_held_snapshot_dir_fails_and_the_first_ones_store_survives() {
    let dir = tempfile::tempdir().unwrap();
    let args = bare_args(dir.path());
    let mut first = start(&args);
    wait_until("a snapshot", 20, || (snapshots_written(&first.http) >= 1.0).then_some(()));

    let (status, stderr) = refused(&args);
    assert!(!status.success(), "{status}");
    assert!(stderr.contains(dir.path().to_str().unwrap()), "names the directory: {stderr}");
    assert!(stderr.contains("another kvindex holds") && stderr.contains("kvindex.lock"), "{stderr}");
    assert_eq!(stderr.matches("another kvindex holds").count(), 1, "said once: {stderr}");

    std::fs::remove_file(dir.path().join("kvindex.lock")).unwrap();
    let (status, stderr) = refused(&args);
    assert!(!status.success(), "{status}");
    assert!(stderr.contains("another kvindex holds") && stderr.contains("/LOCK is locked"), "{stderr}");

    // The first goes on snapshotting into its own store; SIGTERM writes the final one.
    let written = snapshots_written(&first.http);
    wait_until("two more snapshots", 20, || (snapshots_written(&first.http) >= written + 2.0).then_some(()));
    let pid = first.process.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(first.process.wait().unwrap().success());
    let next = start(&args);
    assert_eq!(
        http_metric(&next.http, "kvindex_snapshot_loads_total", &["outcome=\"loaded\""]),
        1.0,
        "the first server's store, whole"
    );
}
