//! `kvindex replay` on hostile or damaged dumps, as the binary: a gzip bomb of short
//! lines and one huge line replays in bounded memory (peak RSS of the replay process, from
//! `wait4`), recorded replay replies are held within `--max-reply-bytes`, a dump whose seq
//! keeps going back replays in linear time, an invalid UTF-8 line is counted and the lines
//! around it still replay, and a truncated gzip replays every whole line before the cut and
//! exits 2. The dumps are built here: vLLM-shaped map-form batches (msgpack), real gzip.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const MODEL: &str = "m";
const POD: &str = "10.0.0.1:8000";
const BLOCK: usize = 16;

/// Token ids of chain `k`, `blocks` blocks long (distinct per chain).
fn chain(k: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * BLOCK) as u32).map(|j| 1 + k * 10_000 + j).collect()
}

/// The token ids of a query for `tokens` and one token more: the engine computes a prompt's
/// last token, so only then can every block of `tokens` be credited.
fn ids(tokens: &[u32]) -> String {
    tokens.iter().chain(&[0]).map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// A `KVEventBatch` storing `tokens` as one chain (map-form events, as vLLM 0.33 sends them).
fn store_payload(tokens: &[u32]) -> Vec<u8> {
    let hashes: Vec<u64> = (0..tokens.len() / BLOCK).map(|b| u64::from(tokens[0]) << 16 | b as u64).collect();
    let event = json!({"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": null,
        "token_ids": tokens, "block_size": BLOCK, "lora_id": null, "medium": "GPU", "lora_name": null});
    rmp_serde::to_vec(&json!([1.0, [event], 0])).unwrap()
}

/// A live message of `POD` (central mode: the pod is in the topic) storing `tokens` at `seq`.
fn live(seq: u64, tokens: &[u32], t: f64) -> String {
    let topic = format!("kv@{POD}@{MODEL}");
    let frames = [hex::encode(topic), hex::encode(seq.to_be_bytes()), hex::encode(store_payload(tokens))];
    json!({"t": t, "kind": "live", "source": "central", "frames_hex": frames}).to_string()
}

/// A recorded replay reply of `POD` at `seq` (the DEALER's 0.26+ layout).
fn reply(seq: u64, payload: &[u8], t: f64) -> String {
    let frames = ["".to_string(), "".to_string(), hex::encode(seq.to_be_bytes()), hex::encode(payload)];
    json!({"t": t, "kind": "replay", "pod": POD, "model": MODEL, "frames_hex": frames}).to_string()
}

fn gzip(path: &Path, write: impl FnOnce(&mut dyn Write)) {
    let file = std::fs::File::create(path).unwrap();
    let mut enc = flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::best());
    write(&mut enc);
    enc.finish().unwrap().flush().unwrap();
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// Peak resident set of the replay process, KiB (`ru_maxrss` of exactly that child).
    max_rss_kib: u64,
    wall: Duration,
}

impl Run {
    fn report(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("replay output {:?}: {e}", self.stdout))
    }

    /// `matched_blocks` of `POD` for the `i`th `--score`.
    fn matched(&self, i: usize) -> u64 {
        let r = self.report();
        let matches = r["scores"][i]["matches"].as_array().unwrap().clone();
        matches.iter().find(|m| m["pod"] == POD).map_or(0, |m| m["matched_blocks"].as_u64().unwrap())
    }
}

/// Runs `kvindex replay <file> --quiet <args>`, killed (and failed) past `deadline`.
fn replay(file: &Path, args: &[&str], deadline: Duration) -> Run {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["replay", file.to_str().unwrap(), "--quiet"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvindex replay");
    let pid = child.id() as libc::pid_t;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).map(|_| s)
    });
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).map(|_| s)
    });
    // wait4 reaps exactly this child and gives its own peak RSS; a second thread kills it at
    // the deadline, so a replay that runs away fails the test instead of hanging it.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let killer = std::thread::spawn(move || {
        if done_rx.recv_timeout(deadline).is_err() {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return true;
        }
        false
    });
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    let wall = start.elapsed();
    let _ = done_tx.send(());
    let killed = killer.join().unwrap();
    std::mem::forget(child); // reaped above
    let run = Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout: stdout.join().unwrap().unwrap(),
        stderr: stderr.join().unwrap().unwrap(),
        max_rss_kib: usage.ru_maxrss as u64,
        wall,
    };
    assert!(!killed, "kvindex replay {file:?} did not finish within {deadline:?}: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    run
}

/// Peak RSS of replaying a two-line dump: what the process needs anyway (debug or release).
fn baseline_rss_kib(dir: &Path) -> u64 {
    let small = dir.join("small.jsonl");
    std::fs::write(&small, format!("{}\n{}\n", live(0, &chain(1, 2), 1.0), live(1, &chain(2, 2), 1.0))).unwrap();
    let run = replay(&small, &[], Duration::from_secs(120));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    run.max_rss_kib
}

#[test]
fn replay_of_a_gzip_bomb_holds_little_memory_and_replays_around_the_junk() {
    let dir = tempfile::tempdir().unwrap();
    let base = baseline_rss_kib(dir.path());
    let (a, b) = (chain(1, 2), chain(2, 3));
    // ~100 KB of gzip expanding to ~100 MB: a store, 1,000,000 short junk lines, one 100 MiB
    // line (over the default --max-line-bytes, 40 MiB), another store. Before: every bad
    // line's message was kept (~100 bytes each) and a line was read whole into a String.
    let bomb = dir.path().join("bomb.jsonl.gz");
    const JUNK: usize = 1_000_000;
    gzip(&bomb, |w| {
        writeln!(w, "{}", live(0, &a, 1.0)).unwrap();
        let junk = "{}\n".repeat(10_000);
        for _ in 0..JUNK / 10_000 {
            w.write_all(junk.as_bytes()).unwrap();
        }
        let chunk = vec![b'7'; 1 << 20];
        for _ in 0..100 {
            w.write_all(&chunk).unwrap();
        }
        writeln!(w).unwrap();
        writeln!(w, "{}", live(1, &b, 2.0)).unwrap();
    });
    let size = std::fs::metadata(&bomb).unwrap().len();
    assert!(size < 1 << 20, "a bomb: {size} bytes of gzip");
    let (sa, sb) = (format!("{MODEL}:{}", ids(&a)), format!("{MODEL}:{}", ids(&b)));
    let run = replay(&bomb, &["--score", &sa, "--score", &sb], Duration::from_secs(300));
    assert_eq!(run.code, Some(0), "read to its end: {}", run.stderr);
    let report = run.report();
    assert_eq!(report["input"], json!({"complete": true, "lines": JUNK as u64 + 3}), "{report:#}");
    assert_eq!(report["bad_lines"], JUNK as u64 + 1);
    assert_eq!(report["bad_line_reasons"], json!({"json": JUNK, "too_long": 1}));
    let samples = report["bad_line_samples"].as_array().unwrap();
    assert_eq!(samples.len(), 20, "the first 20 are named, the rest counted");
    assert_eq!(samples[0], json!({"line": 2, "reason": "json", "detail": "missing field `frames_hex` at column 2"}));
    assert_eq!(report["first_bad_line"], "line 2: missing field `frames_hex` at column 2");
    assert_eq!((run.matched(0), run.matched(1)), (2, 3), "the stores before and after the junk: {report:#}");
    assert!(
        run.stderr.contains(&format!("{} bad lines skipped (json: {JUNK}, too_long: 1)", JUNK + 1)),
        "{}",
        run.stderr
    );
    // The process needs `base` anyway; the junk lines add nothing, the long line at most the
    // 40 MiB bound it is buffered up to. Before this bound: over 200 MiB.
    let grew = run.max_rss_kib.saturating_sub(base);
    assert!(grew < 64 << 10, "peak RSS {} KiB, {grew} KiB over a two-line replay's {base} KiB", run.max_rss_kib);
    // Measured on the loaded 2-core box, debug build: 10-16 s, peak RSS +40 MiB over the base.
    eprintln!("bomb: {size} bytes of gzip, {:?}, peak RSS {} KiB (base {base} KiB)", run.wall, run.max_rss_kib);
}

#[test]
fn replay_holds_recorded_replies_within_max_reply_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let base = baseline_rss_kib(dir.path());
    // 24 replies of 1 MiB each (highly compressible), then a live stream that joins at seq 70
    // and asks for a replay from 0. At 2 MiB held, one reply waits and 23 are dropped.
    let dump = dir.path().join("replies.jsonl.gz");
    gzip(&dump, |w| {
        let payload = vec![0xc0u8; 1 << 20];
        for seq in 0..24 {
            writeln!(w, "{}", reply(seq, &payload, 1.0)).unwrap();
        }
        writeln!(w, "{}", live(70, &chain(3, 2), 2.0)).unwrap();
    });
    let s = format!("{MODEL}:{}", ids(&chain(3, 2)));
    let run = replay(&dump, &["--max-reply-bytes", "2097152", "--score", &s], Duration::from_secs(300));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report();
    assert_eq!(report["totals"]["replay"], 24, "{report:#}");
    assert_eq!(report["totals"]["replies_dropped"], 23, "{report:#}");
    let source = &report["sources"][0];
    assert_eq!(source["state"], "DEGRADED", "a replay that lacks replies never guesses: {source:#}");
    assert_eq!(run.matched(0), 2, "batches after the loss still apply");
    let grew = run.max_rss_kib.saturating_sub(base);
    // Lines of 2 MiB (hex) in flight, one 1 MiB reply held. Holding them all: over 24 MiB.
    assert!(grew < 16 << 10, "peak RSS {} KiB, {grew} KiB over {base} KiB", run.max_rss_kib);
    eprintln!("replies: {:?}, peak RSS {} KiB (base {base} KiB)", run.wall, run.max_rss_kib);
}

#[test]
fn replay_of_a_dump_whose_seq_keeps_going_back_is_linear() {
    let dir = tempfile::tempdir().unwrap();
    // 20,000 lines: a recorded reply and a live batch, in turn, the live seqs going down. Every
    // live line is a restart, and each restart asks for a replay from 0; answering each from
    // every recorded reply (not once per reply) was quadratic: 8k lines took 47 s.
    const N: u64 = 10_000;
    let dump = dir.path().join("backwards.jsonl");
    let shared = chain(7, 2);
    let payload = store_payload(&shared);
    let mut text = String::new();
    for i in 0..N {
        let t = 1_764_600_000.0 + i as f64 * 0.01;
        text.push_str(&reply(i, &payload, t));
        text.push('\n');
        text.push_str(&live(N - i, &shared, t));
        text.push('\n');
    }
    std::fs::write(&dump, text).unwrap();
    let s = format!("{MODEL}:{}", ids(&shared));
    let run = replay(&dump, &["--score", &s, "--explain", &s, "--pod", POD], Duration::from_secs(120));
    // A complexity guard, not a timing: on the 2-core box, debug build, it takes about 6 s
    // idle and 40 s at load average 12; before the fix the same box had not finished 8,000
    // such lines in 300 s (quadratic: 20,000 would take over half an hour).
    assert!(run.wall < Duration::from_secs(100), "20,000 lines took {:?}", run.wall);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report();
    assert_eq!(report["totals"]["live"], N, "{report:#}");
    let source = &report["sources"][0];
    assert_eq!(source["restarts"], N - 1, "{source:#}");
    assert_eq!(source["last_seq"], 1, "{source:#}");
    assert_eq!(run.matched(0), 2, "the last batch holds the chain: {report:#}");
    // The explained prompt is cleared and stored again on every line: its history keeps the
    // latest 10,000 changes and counts the rest; each block's last change is the last line's.
    let ex = &report["explain"];
    assert_eq!(ex["matched_blocks"], 2, "{:#}", ex["blocks"]);
    assert_eq!(ex["history"].as_array().unwrap().len(), 10_000);
    assert!(ex["history_dropped"].as_u64().unwrap() > 20_000, "{}", ex["history_dropped"]);
    assert_eq!(ex["blocks"][1]["last_change"]["seq"], 1, "{:#}", ex["blocks"]);
    eprintln!("backwards: {} lines in {:?}", 2 * N, run.wall);
}

#[test]
fn replay_counts_an_invalid_utf8_line_and_replays_the_lines_around_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (chain(1, 2), chain(2, 2));
    let secret = "987654321";
    let mut bytes = Vec::new();
    writeln!(bytes, "{}", live(0, &a, 1.0)).unwrap();
    // A record naming a pod with a control character (and token ids for a model): refused.
    let mut named: Value = serde_json::from_str(&live(2, &a, 1.5)).unwrap();
    (named["pod"], named["model"]) = (json!("x\u{1}"), json!(secret));
    writeln!(bytes, "{named}").unwrap();
    // One invalid byte in a line that also holds token ids.
    let prefix = format!("{{\"kind\":\"live\",\"pod\":\"{secret}");
    bytes.extend_from_slice(prefix.as_bytes());
    bytes.extend_from_slice(b"\xff\",\"frames_hex\":[]}\n");
    writeln!(bytes, "{}", live(1, &b, 2.0)).unwrap();
    let dump = dir.path().join("utf8.jsonl");
    std::fs::write(&dump, &bytes).unwrap();
    let (sa, sb) = (format!("{MODEL}:{}", ids(&a)), format!("{MODEL}:{}", ids(&b)));
    let run =
        replay(&dump, &["--score", &sa, "--score", &sb, "--explain", &sa, "--pod", POD], Duration::from_secs(120));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report();
    assert_eq!(report["input"], json!({"complete": true, "lines": 4}), "{report:#}");
    assert_eq!(report["bad_lines"], 1, "{report:#}");
    assert_eq!(
        report["bad_line_samples"],
        json!([{"line": 3, "reason": "not_utf8", "detail": format!("invalid UTF-8 at byte {}", prefix.len())}])
    );
    assert_eq!(report["totals"]["refused_names"], 1, "a control character in a pod name: {report:#}");
    assert_eq!((run.matched(0), run.matched(1)), (2, 2), "the lines before and after: {report:#}");
    assert_eq!(report["explain"]["matched_blocks"], 2);
    assert_eq!(report["sources"][0]["state"], "EXACT", "seqs 0 and 1 both applied: {report:#}");
    assert!(run.stderr.contains("1 bad lines skipped (not_utf8: 1); first: line 3: invalid UTF-8"), "{}", run.stderr);
    assert!(!run.stdout.contains(secret) && !run.stderr.contains(secret), "no contents: {}{}", run.stdout, run.stderr);
}

#[test]
fn replay_of_a_truncated_gzip_replays_every_whole_line_then_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    // `kvindex record` killed mid-write: 400 stores of one stream, the gzip cut in the middle.
    let mut text = String::new();
    for k in 0..400u32 {
        text.push_str(&live(u64::from(k), &chain(k, 2), 1.0 + f64::from(k)));
        text.push('\n');
    }
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(text.as_bytes()).unwrap();
    let gz = enc.finish().unwrap();
    let cut = &gz[..gz.len() / 2];
    let dump = dir.path().join("cut.jsonl.gz");
    std::fs::write(&dump, cut).unwrap();
    // What a decoder recovers before the cut: its whole lines are what must replay.
    let mut recovered = Vec::new();
    let mut decoder = flate2::read::MultiGzDecoder::new(cut);
    let mut buf = [0u8; 4096];
    loop {
        match decoder.read(&mut buf) {
            Ok(0) => panic!("a cut gzip must not end cleanly"),
            Ok(n) => recovered.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    let whole = recovered.iter().filter(|&&b| b == b'\n').count() as u64;
    assert!(whole > 10 && whole < 400, "{whole}");
    let scores: Vec<String> =
        [0, whole - 1, whole].iter().map(|&k| format!("{MODEL}:{}", ids(&chain(k as u32, 2)))).collect();
    let mut args = Vec::new();
    for s in &scores {
        args.extend(["--score", s.as_str()]);
    }
    let run = replay(&dump, &args, Duration::from_secs(120));
    assert_eq!(run.code, Some(2), "ended early: a distinct status: {}", run.stderr);
    let report = run.report();
    assert_eq!(report["input"]["complete"], false, "{report:#}");
    assert_eq!(report["input"]["lines"], whole, "{report:#}");
    assert_eq!(report["input"]["ended_at_line"], whole + 1);
    assert_eq!(report["input"]["reason"], "truncated");
    assert_eq!(report["totals"]["live"], whole);
    assert_eq!(report["bad_lines"], 0, "the cut line is not a bad line: {report:#}");
    assert_eq!(report["sources"][0]["last_seq"], whole - 1);
    assert_eq!((run.matched(0), run.matched(1), run.matched(2)), (2, 2, 0), "{report:#}");
    let expected = format!("cut.jsonl.gz: input ends early at line {} (truncated: ", whole + 1);
    assert!(run.stderr.contains(&expected), "{}", run.stderr);
    assert!(run.stderr.contains(&format!("the report covers lines 1-{whole}")), "{}", run.stderr);
}
