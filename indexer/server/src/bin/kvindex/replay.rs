//! `kvindex replay <dump>`: a dump (or any JSON Lines with `frames_hex`, such as the vLLM
//! vectors) rebuilt into an index offline through the live path's core, then reported on:
//! per-source statistics, scores (`--score`), one prompt's history for one pod (`--explain`),
//! and optionally served read-only over the gRPC API (`--grpc-addr`).
//!
//! A dump may be hostile or damaged: it is streamed a bounded line at a time, a bad line is
//! counted and named (number and reason, never contents) and the run goes on, and a stream
//! that ends early still reports every whole line before it, with exit status 2.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};

use kvindex::wire::Engine;
use kvindex::KvIndexConfig;
use kvindex_server::config::pod::TopicMapEntry;
use kvindex_server::persist::dump::offline::{Limits, NamingSettings, Offline, Until};
use kvindex_server::persist::dump::{self, parse_line, BadLine, BadLines, Line, Lines, ReadError};

#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The dump: gzip or plain JSON Lines with `frames_hex`.
    pub file: PathBuf,
    /// Stop after this point: a Unix time, or a seq (a whole number below 10⁹).
    #[arg(long)]
    pub until: Option<Until>,
    /// A scoring query on the rebuilt index: `<model>:<comma-separated token ids>` (repeatable).
    #[arg(long)]
    pub score: Vec<String>,
    /// Explain a prompt for `--pod`: `<model>:<comma-separated token ids>`.
    #[arg(long, requires = "pod")]
    pub explain: Option<String>,
    /// The pod `--explain` follows.
    #[arg(long)]
    pub pod: Option<String>,
    /// Canonical block size of the rebuilt index.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Serve the rebuilt index read-only over the gRPC API at this address (until Ctrl-C).
    #[arg(long)]
    pub grpc_addr: Option<String>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Longest line read; a longer one is skipped (never held whole) and counted as a bad line.
    #[arg(long, default_value_t = dump::DEFAULT_MAX_LINE_BYTES)]
    pub max_line_bytes: usize,
    /// Bytes of recorded replay replies held for the replays the sequencers ask for (payload
    /// plus 64 per reply); replies past it are dropped and counted (`replies_dropped`): a replay
    /// that needed one fails, and its pod is degraded, never guessed.
    #[arg(long, default_value_t = Limits::DEFAULT_MAX_REPLY_BYTES)]
    pub max_reply_bytes: u64,
    /// The recording service's `--topic-map` (repeatable): topic id → pod, so streams are named
    /// as the service named them.
    #[arg(long = "topic-map", value_name = "TOPIC_ID=POD", value_parser = TopicMapEntry::from_flag)]
    pub topic_map: Vec<TopicMapEntry>,
    /// The recording service's `--dp-naming` (`port-offset` or `topic`).
    #[arg(long, default_value = "port-offset", value_parser = ["port-offset", "topic"])]
    pub dp_naming: String,
    /// The recording service's `--topic-filter`.
    #[arg(long, default_value = "kv@")]
    pub topic_filter: String,
    /// A pod's engine and page size as its pod entry named them (repeatable): a dump records
    /// frames, not the fleet's configuration, so an SGLang or TensorRT-LLM pod must be named
    /// again (else its frames are read by `--default-engine`'s rules).
    #[arg(long = "engine", value_name = "POD=ENGINE[:PAGE_SIZE]", value_parser = pod_engine)]
    pub engines: Vec<(String, Engine, Option<usize>)>,
    /// The recording service's `--default-engine`: the engine of every pod `--engine` does not
    /// name.
    #[arg(long, default_value = "vllm", value_parser = |v: &str| v.parse::<Engine>().map_err(|e| e.to_string()))]
    pub default_engine: Engine,
    /// A prompt scored after every live record (`<model>:<comma-separated token ids>`,
    /// repeatable); the rows go to `--trace-out` as JSON Lines.
    #[arg(long, requires = "trace_out")]
    pub trace: Vec<String>,
    /// Where `--trace` writes its rows (one per live record: record number, pod, seq, scores).
    #[arg(long)]
    pub trace_out: Option<PathBuf>,
}

/// How a replay went. Exit status: 0 when the dump was read to its end (bad lines, if any,
/// are counted in the report and summed up on stderr), 2 when it ends early (a truncated or
/// corrupt gzip: the report covers every whole line before that point), 1 when it cannot be
/// replayed at all (missing file, bad arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Complete,
    EndedEarly,
}

/// What reading the dump came to: its bad lines and where it ended.
#[derive(Debug, Default)]
pub struct Reading {
    pub lines: u64,
    pub bad: BadLines,
    pub ended_early: Option<ReadError>,
}

/// Reads `path` line by line, calling `each` with every parsed record until it returns false;
/// `on_bad` gets the lines that are not records.
fn read_dump(
    path: &Path,
    max_line_bytes: usize,
    mut progress: impl FnMut(u64),
    mut on_bad: impl FnMut(BadLine),
    mut each: impl FnMut(&dump::DumpRecord, &[Vec<u8>]) -> bool,
) -> anyhow::Result<(u64, Option<ReadError>)> {
    let mut lines = Lines::new(dump::open(path)?, max_line_bytes);
    loop {
        let (number, line) = match lines.next_line() {
            Ok(Some(line)) => line,
            Ok(None) => return Ok((lines.number(), None)),
            Err(e) => return Ok((lines.number(), Some(e))),
        };
        let parsed = match line {
            Line::TooLong(len) => Err(BadLine {
                line: number,
                reason: "too_long",
                detail: format!("{len} bytes, over --max-line-bytes {max_line_bytes}"),
            }),
            Line::Bytes(bytes) => parse_line(bytes, number),
        };
        match parsed {
            Ok(Some((record, frames))) => {
                if !each(&record, &frames) {
                    return Ok((number, None));
                }
            }
            Ok(None) => {}
            Err(bad) => on_bad(bad),
        }
        if number % 4096 == 0 {
            progress(lines.bytes());
        }
    }
}

fn query(spec: &str) -> anyhow::Result<(String, Vec<u32>)> {
    let (model, ids) = spec.rsplit_once(':').context("expected <model>:<comma-separated token ids>")?;
    let ids = ids
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<u32>().with_context(|| format!("token id {s:?}")))
        .collect::<anyhow::Result<_>>()?;
    Ok((model.to_string(), ids))
}

/// Rebuilds the index from `args.file`.
pub fn rebuild(args: &ReplayArgs) -> anyhow::Result<(Offline, Reading)> {
    anyhow::ensure!(args.block_size > 0, "--block-size must be positive");
    anyhow::ensure!(args.max_line_bytes > 0, "--max-line-bytes must be positive");
    let limits = Limits { max_reply_bytes: args.max_reply_bytes, ..Default::default() };
    let naming = NamingSettings {
        topic_filter: args.topic_filter.clone(),
        dp_naming_topic: args.dp_naming == "topic",
        topic_map: args.topic_map.iter().map(|t| (t.topic_id.clone(), t.pod.clone())).collect(),
        engines: args.engines.iter().map(|(pod, engine, page)| (pod.clone(), (*engine, *page))).collect(),
        default_engine: args.default_engine,
    };
    let config = KvIndexConfig { block_size: args.block_size, ..Default::default() };
    let mut offline = Offline::with_naming(config, limits, naming);
    if let Some(path) = &args.trace_out {
        let probes = args.trace.iter().map(|spec| query(spec)).collect::<anyhow::Result<Vec<_>>>()?;
        let file = std::fs::File::create(path).with_context(|| format!("--trace-out {}", path.display()))?;
        offline.trace(probes, Box::new(std::io::BufWriter::new(file)));
    }
    if let (Some(spec), Some(pod)) = (&args.explain, &args.pod) {
        let (model, tokens) = query(spec)?;
        offline.explain(pod, &model, &tokens);
    }
    let size = std::fs::metadata(&args.file).with_context(|| format!("{}", args.file.display()))?.len();
    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(size).with_style(indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} (file, compressed) {msg}",
        )?)
    };
    // Pass 1: the recorded replay replies, which answer the replays the sequencers ask for.
    let until = args.until;
    read_dump(
        &args.file,
        args.max_line_bytes,
        |_| {},
        |_| {},
        |record, frames| {
            if until.is_some_and(|u| Offline::beyond(record, frames, u)) {
                return false;
            }
            if record.is_replay() {
                offline.add_reply(record, frames);
            }
            true
        },
    )?;
    // Pass 2: every message in order, through the live path.
    let mut bad = BadLines::default();
    let (lines, ended_early) = read_dump(
        &args.file,
        args.max_line_bytes,
        |read| bar.set_position(read.min(size)),
        |line| bad.add(line),
        |record, frames| {
            if until.is_some_and(|u| Offline::beyond(record, frames, u)) {
                return false;
            }
            offline.feed(record, frames);
            true
        },
    )?;
    bar.finish_and_clear();
    offline.finish_trace().context("--trace-out")?;
    Ok((offline, Reading { lines, bad, ended_early }))
}

pub fn report(offline: &Offline, reading: &Reading, args: &ReplayArgs) -> anyhow::Result<Value> {
    let mut scores = Vec::new();
    for spec in &args.score {
        let (model, tokens) = query(spec)?;
        let r = offline.score(&model, &tokens);
        let matches: Vec<Value> = r
            .matches
            .iter()
            .map(|m| {
                let pod = offline.index().pods().name(m.pod).map(|p| p.to_string()).unwrap_or_default();
                json!({"pod": pod, "matched_blocks": m.matched_blocks, "weighted_score": m.weighted_score,
                       "state": offline.state_of(&pod)})
            })
            .collect();
        scores.push(json!({"model": model, "total_blocks": r.total_blocks, "matches": matches}));
    }
    let table = offline.index().table();
    let input = match &reading.ended_early {
        None => json!({"complete": true, "lines": reading.lines}),
        Some(e) => json!({"complete": false, "lines": reading.lines, "ended_at_line": e.line,
                          "reason": e.reason, "detail": e.source.to_string()}),
    };
    let mut out = json!({
        "input": input,
        "totals": offline.totals(),
        "bad_lines": reading.bad.count,
        "bad_line_reasons": reading.bad.by_reason,
        "bad_line_samples": reading.bad.first,
        "index": {"entries": table.entries(), "keys": table.keys()},
        "sources": offline.stream_stats(),
        "scores": scores,
    });
    if let Some(pod) = &args.pod {
        out["explain"] = explain(offline, pod);
    }
    if let Some(first) = reading.bad.first.first() {
        out["first_bad_line"] = json!(first.to_string());
    }
    Ok(out)
}

/// The explained prompt: how far the pod's run reaches now, where it breaks, and every change.
fn explain(offline: &Offline, pod: &str) -> Value {
    let events = offline.explained();
    // Blocks up to the last one that ever changed (one that never did was never held).
    let all = offline.explained_blocks();
    let held = &all[..all.iter().rposition(Option::is_some).map_or(0, |i| i + 1)];
    let matched = held.iter().take_while(|e| e.as_ref().is_some_and(|e| e.change == "stored")).count();
    let blocks: Vec<Value> = held
        .iter()
        .enumerate()
        .map(|(i, e)| match e {
            Some(e) => json!({"block": i, "held": e.change == "stored", "last_change": e}),
            None => json!({"block": i, "held": false, "last_change": null}),
        })
        .collect();
    json!({"pod": pod, "matched_blocks": matched, "breaks_at": matched, "blocks": blocks, "history": events,
           "history_dropped": offline.explained_dropped()})
}

/// The stderr lines of a replay that read its dump with trouble (none when it went cleanly).
fn warnings(file: &Path, reading: &Reading) -> Vec<String> {
    let mut lines = Vec::new();
    let file = file.display();
    if reading.bad.count > 0 {
        let reasons: Vec<String> = reading.bad.by_reason.iter().map(|(r, n)| format!("{r}: {n}")).collect();
        let first = reading.bad.first.first().map(ToString::to_string).unwrap_or_default();
        lines.push(format!(
            "kvindex replay: warning: {file}: {} bad lines skipped ({}); first: {first}",
            reading.bad.count,
            reasons.join(", ")
        ));
    }
    if let Some(e) = &reading.ended_early {
        lines.push(format!(
            "kvindex replay: {file}: input ends early at line {} ({}: {}); the report covers lines 1-{}",
            e.line,
            e.reason,
            e.source,
            e.line - 1
        ));
    }
    lines
}

pub fn run(args: &ReplayArgs) -> anyhow::Result<Outcome> {
    let (offline, reading) = rebuild(args)?;
    let report = report(&offline, &reading, args)?;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, &report)?;
    writeln!(out)?;
    out.flush()?;
    drop(out);
    for line in warnings(&args.file, &reading) {
        eprintln!("{line}");
    }
    let outcome = if reading.ended_early.is_some() { Outcome::EndedEarly } else { Outcome::Complete };
    if let Some(addr) = &args.grpc_addr {
        crate::serve_read_only(offline, addr)?;
    }
    Ok(outcome)
}

/// `--engine <pod>=<engine>[:<page size>]`.
fn pod_engine(v: &str) -> Result<(String, Engine, Option<usize>), String> {
    let (pod, spec) = v.split_once('=').ok_or_else(|| format!("expected POD=ENGINE[:PAGE_SIZE], got {v:?}"))?;
    let (engine, page_size) = match spec.split_once(':') {
        Some((engine, page)) => {
            let page: usize = page.parse().map_err(|_| format!("page size {page:?} is not a positive integer"))?;
            if page == 0 {
                return Err("page size must be positive".into());
            }
            (engine, Some(page))
        }
        None => (spec, None),
    };
    let engine = engine.parse::<Engine>().map_err(|e| e.to_string())?;
    if pod.is_empty() {
        return Err("the pod id is empty".into());
    }
    Ok((pod.to_string(), engine, page_size))
}
