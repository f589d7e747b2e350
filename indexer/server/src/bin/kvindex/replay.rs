//! `kvindex replay <dump>`: a dump (or any JSON Lines with `frames_hex`, such as the vLLM
//! vectors) rebuilt into an index offline through the live path's core, then reported on:
//! per-source statistics, scores (`--score`), one prompt's history for one pod (`--explain`),
//! and optionally served read-only over the gRPC API (`--grpc-addr`).

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};

use kvindex::KvIndexConfig;
use kvindex_server::dump::offline::{Offline, Until};
use kvindex_server::dump::{self, parse_line};

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
pub fn rebuild(args: &ReplayArgs) -> anyhow::Result<(Offline, Vec<String>)> {
    anyhow::ensure!(args.block_size > 0, "--block-size must be positive");
    let mut offline = Offline::new(KvIndexConfig { block_size: args.block_size, ..Default::default() });
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
    let mut errors = Vec::new();
    for (number, line) in dump::open(&args.file)?.lines().enumerate() {
        let line = line.with_context(|| format!("{}: line {}", args.file.display(), number + 1))?;
        if let Ok(Some((record, frames))) = parse_line(&line, number as u64 + 1) {
            if args.until.is_some_and(|u| Offline::beyond(&record, &frames, u)) {
                break;
            }
            if record.is_replay() {
                offline.add_reply(&record, &frames);
            }
        }
    }
    // Pass 2: every message in order, through the live path.
    let mut read = 0u64;
    for (number, line) in dump::open(&args.file)?.lines().enumerate() {
        let line = line.with_context(|| format!("{}: line {}", args.file.display(), number + 1))?;
        read += line.len() as u64 + 1;
        if number % 4096 == 0 {
            bar.set_position(read.min(size));
        }
        match parse_line(&line, number as u64 + 1) {
            Ok(Some((record, frames))) => {
                if args.until.is_some_and(|u| Offline::beyond(&record, &frames, u)) {
                    break;
                }
                offline.feed(&record, &frames);
            }
            Ok(None) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    bar.finish_and_clear();
    Ok((offline, errors))
}

pub fn report(offline: &Offline, errors: &[String], args: &ReplayArgs) -> anyhow::Result<Value> {
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
    let mut out = json!({
        "totals": offline.totals(),
        "bad_lines": errors.len(),
        "index": {"entries": table.entries(), "keys": table.keys()},
        "sources": offline.stream_stats(),
        "scores": scores,
    });
    if let Some(pod) = &args.pod {
        out["explain"] = explain(offline, pod);
    }
    if let Some(first) = errors.first() {
        out["first_bad_line"] = json!(first);
    }
    Ok(out)
}

/// The explained prompt: how far the pod's run reaches now, where it breaks, and every change.
fn explain(offline: &Offline, pod: &str) -> Value {
    let events = offline.explained();
    let mut held: Vec<Option<&kvindex_server::dump::offline::ExplainEvent>> = Vec::new();
    for e in events {
        if held.len() <= e.block {
            held.resize(e.block + 1, None);
        }
        held[e.block] = Some(e);
    }
    let matched = held.iter().take_while(|e| e.is_some_and(|e| e.change == "stored")).count();
    let blocks: Vec<Value> = held
        .iter()
        .enumerate()
        .map(|(i, e)| match e {
            Some(e) => json!({"block": i, "held": e.change == "stored", "last_change": e}),
            None => json!({"block": i, "held": false, "last_change": null}),
        })
        .collect();
    json!({"pod": pod, "matched_blocks": matched, "breaks_at": matched, "blocks": blocks, "history": events})
}

pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let (offline, errors) = rebuild(args)?;
    let report = report(&offline, &errors, args)?;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, &report)?;
    writeln!(out)?;
    drop(out);
    if let Some(addr) = &args.grpc_addr {
        crate::serve_read_only(offline, addr)?;
    }
    Ok(())
}
