//! Side by side: kvindex's index and Dynamo's `dynamo-kv-router` `RadixTree`, fed the same
//! event trace and the same queries, in separate processes so each one's memory is its own.
//!
//! It exists because a figure for our index means little without the best open peer measured
//! on the same machine, trace and queries. The trace follows the recipe in
//! `shared/reference/anchors.md` ("Workload used"): splitmix64 seed 42; 200 shared prefixes of
//! U[8,64] blocks with Zipf(1.0) popularity; each conversation = one prefix + U[16,256] own
//! blocks; 10% replicated on 2–4 workers; the whole prefix is stored (no parent) the first time
//! a worker needs it, then the suffix in chunks of U[1,32] blocks chained to the previous
//! block; fill to N residencies; then queries of 512 blocks = a planted 300-block chain + 212
//! fresh blocks, measured after a warm-up.
//!
//! Both indexes get what an engine sends: token ids per block. kvindex hashes them itself (its
//! keys are its own); for Dynamo the tokens are hashed with its `compute_block_hash_for_seq`,
//! as its event listener does for a vLLM `BlockStored`, inside the timed region. Queries are
//! token ids for both (hashing included), and Dynamo's lookup is also reported with the block
//! hashes given.
//!
//! `kvindex-dynamo-compare [--entries N] [--workers W] [--queries Q]` runs both and prints the
//! ratios; `--only kvindex|dynamo` runs one and prints its JSON line (what the parent reads).

use std::process::Command;
use std::time::Instant;

use dynamo_kv_router::protocols::{
    compute_block_hash_for_seq, BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent,
    KvCacheEventData, KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
};
use dynamo_kv_router::RadixTree;
use kvindex::wire::{BlockStored, EngineHash, Event, EventBatch};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};

const BLOCK_SIZE: usize = 16;
const MODEL: &str = "bench-model";
const PLANTED_BLOCKS: usize = 300;
const FRESH_BLOCKS: usize = 212;
const PLANTED_HOLDERS: usize = 4;
const PLANTED_CHUNK: usize = 64;
const WARMUP_QUERIES: usize = 1_000;

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// One store event of the trace: blocks `from..to` of `conversation` on `worker`.
#[derive(Clone, Copy)]
struct Store {
    worker: u32,
    conversation: u32,
    from: u32,
    to: u32,
}

struct Trace {
    /// Block ids of each conversation (its prefix's, then its own).
    conversations: Vec<Vec<u64>>,
    stores: Vec<Store>,
    residencies: u64,
}

/// The anchors.md recipe, as plain store events; ends once `entries` residencies are stored.
fn trace(workers: usize, entries: u64, seed: u64) -> Trace {
    let mut rng = SplitMix(seed);
    let prefixes: Vec<Vec<u64>> = (0..200u64)
        .map(|p| (0..rng.range(8, 64)).map(|i| (p << 40) | i).collect())
        .collect();
    let weights: Vec<f64> = (1..=prefixes.len()).map(|r| 1.0 / r as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut has_prefix = vec![vec![false; prefixes.len()]; workers];
    let mut out = Trace {
        conversations: Vec::new(),
        stores: Vec::new(),
        residencies: 0,
    };
    let mut next_conversation = 1u64;
    while out.residencies < entries {
        let mut x = (rng.next() % 1_000_000) as f64 / 1_000_000.0 * total;
        let prefix = weights
            .iter()
            .position(|w| {
                x -= w;
                x <= 0.0
            })
            .unwrap_or(prefixes.len() - 1);
        let suffix_len = rng.range(16, 256);
        let mut blocks = prefixes[prefix].clone();
        blocks.extend((0..suffix_len).map(|i| (1 << 63) | (next_conversation << 24) | i));
        next_conversation += 1;
        let copies = if rng.next().is_multiple_of(10) {
            rng.range(2, 4) as usize
        } else {
            1
        };
        let mut holders = Vec::new();
        while holders.len() < copies.min(workers) {
            let worker = (rng.next() % workers as u64) as usize;
            if !holders.contains(&worker) {
                holders.push(worker);
            }
        }
        let conversation = out.conversations.len() as u32;
        let prefix_len = prefixes[prefix].len();
        for &worker in &holders {
            if !has_prefix[worker][prefix] {
                has_prefix[worker][prefix] = true;
                out.stores.push(Store {
                    worker: worker as u32,
                    conversation,
                    from: 0,
                    to: prefix_len as u32,
                });
                out.residencies += prefix_len as u64;
            }
            let mut start = prefix_len;
            while start < blocks.len() {
                let chunk = (rng.range(1, 32) as usize).min(blocks.len() - start);
                out.stores.push(Store {
                    worker: worker as u32,
                    conversation,
                    from: start as u32,
                    to: (start + chunk) as u32,
                });
                out.residencies += chunk as u64;
                start += chunk;
            }
        }
        out.conversations.push(blocks);
    }
    // The planted chain every query starts with, held by a few workers.
    let planted: Vec<u64> = (0..PLANTED_BLOCKS as u64)
        .map(|i| (0x7777u64 << 40) | i)
        .collect();
    let conversation = out.conversations.len() as u32;
    out.conversations.push(planted);
    // Stored in chained 64-block events, as the core benchmarks plant it (BENCHMARKS.md).
    for worker in 0..PLANTED_HOLDERS.min(workers) {
        for from in (0..PLANTED_BLOCKS).step_by(PLANTED_CHUNK) {
            let to = (from + PLANTED_CHUNK).min(PLANTED_BLOCKS);
            out.stores.push(Store {
                worker: worker as u32,
                conversation,
                from: from as u32,
                to: to as u32,
            });
        }
    }
    out
}

/// A block's token ids: deterministic, vocabulary-sized.
fn block_tokens(id: u64, out: &mut Vec<u32>) {
    let mut rng = SplitMix(id);
    out.extend((0..BLOCK_SIZE).map(|_| (rng.next() % 151_936) as u32));
}

/// The engine's (vLLM's) chained hash of block `i`: a function of the content prefix.
fn engine_hashes(blocks: &[u64]) -> Vec<u64> {
    let mut parent = 0x5bd1_e995u64;
    blocks
        .iter()
        .map(|&id| {
            parent = SplitMix(id ^ parent.rotate_left(17)).next();
            parent
        })
        .collect()
}

fn query_tokens(planted: &[u64], query: u64) -> Vec<u32> {
    let mut tokens = Vec::with_capacity((PLANTED_BLOCKS + FRESH_BLOCKS) * BLOCK_SIZE);
    for &id in planted {
        block_tokens(id, &mut tokens);
    }
    for i in 0..FRESH_BLOCKS as u64 {
        block_tokens(0xfeed_0000_0000 ^ (query << 16) ^ i, &mut tokens);
    }
    tokens
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(((p / 100.0) * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)]
}

/// The two indexes behind one interface: apply a store from token ids, score a prompt.
trait Indexer {
    fn store(
        &mut self,
        worker: u32,
        blocks: &[u64],
        hashes: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
    );
    /// Matched blocks of the best worker, hashing the prompt's tokens included.
    fn score(&mut self, tokens: &[u32]) -> u32;
}

struct Kvindex(KvIndex, Vec<String>);

impl Indexer for Kvindex {
    fn store(
        &mut self,
        worker: u32,
        _blocks: &[u64],
        hashes: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
    ) {
        let event = BlockStored {
            block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
            parent_block_hash: parent.map(EngineHash::Uint),
            token_ids: Some(tokens.to_vec()),
            block_size: Some(BLOCK_SIZE as i64),
            medium: Some("GPU"),
            group_idx: Some(0),
            ..Default::default()
        };
        let batch = EventBatch {
            ts: 0.0,
            events: vec![Event::BlockStored(event)],
            data_parallel_rank: Some(0),
        };
        self.0.apply(&self.1[worker as usize], MODEL, &batch);
    }

    fn score(&mut self, tokens: &[u32]) -> u32 {
        let result = self.0.score(&ScoreQuery {
            model: MODEL,
            lora_name: None,
            cache_salt: None,
            token_ids: tokens,
            pods: None,
        });
        result
            .matches
            .iter()
            .map(|m| m.matched_blocks)
            .max()
            .unwrap_or(0)
    }
}

struct Dynamo(RadixTree, u64);

impl Indexer for Dynamo {
    fn store(
        &mut self,
        worker: u32,
        _blocks: &[u64],
        hashes: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
    ) {
        let local =
            compute_block_hash_for_seq(tokens, BLOCK_SIZE as u32, BlockHashOptions::default());
        let blocks = hashes
            .iter()
            .zip(local)
            .map(|(&hash, tokens_hash)| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(hash),
                tokens_hash,
                mm_extra_info: None,
            })
            .collect();
        self.1 += 1;
        let event = KvCacheEvent {
            event_id: self.1,
            data: KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: parent.map(ExternalSequenceBlockHash),
                start_position: None,
                blocks,
            }),
            dp_rank: 0,
        };
        if let Err(error) = self
            .0
            .apply_event(RouterEvent::new(u64::from(worker), event))
        {
            eprintln!("dynamo apply_event: {error:?}");
        }
    }

    fn score(&mut self, tokens: &[u32]) -> u32 {
        let hashes =
            compute_block_hash_for_seq(tokens, BLOCK_SIZE as u32, BlockHashOptions::default());
        self.0
            .find_matches(hashes, false)
            .scores
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }
}

/// Fills `indexer` with the trace, then times queries; one JSON line of figures.
fn measure(name: &str, indexer: &mut dyn Indexer, trace: &Trace, queries: usize) -> String {
    let before = rss_bytes();
    let mut tokens = Vec::new();
    let mut block_ops = 0u64;
    let mut apply_s = 0.0f64;
    for store in &trace.stores {
        let chain = &trace.conversations[store.conversation as usize];
        let (from, to) = (store.from as usize, store.to as usize);
        // The engine's view of the event, built outside the timed region.
        let hashes_all = engine_hashes(&chain[..to]);
        tokens.clear();
        for &id in &chain[from..to] {
            block_tokens(id, &mut tokens);
        }
        let parent = (from > 0).then(|| hashes_all[from - 1]);
        let started = Instant::now();
        indexer.store(
            store.worker,
            &chain[from..to],
            &hashes_all[from..to],
            parent,
            &tokens,
        );
        apply_s += started.elapsed().as_secs_f64();
        block_ops += (to - from) as u64;
    }
    let memory = rss_bytes().saturating_sub(before);
    let planted = trace.conversations.last().map(Vec::as_slice).unwrap_or(&[]);
    let mut latencies = Vec::with_capacity(queries);
    let mut matched = u32::MAX;
    for query in 0..(WARMUP_QUERIES + queries) as u64 {
        let prompt = query_tokens(planted, query);
        let started = Instant::now();
        let best = indexer.score(&prompt);
        let elapsed = started.elapsed().as_secs_f64();
        matched = matched.min(best);
        if query as usize >= WARMUP_QUERIES {
            latencies.push(elapsed);
        }
    }
    latencies.sort_by(f64::total_cmp);
    format!(
        "{{\"indexer\":\"{name}\",\"residencies\":{},\"block_ops\":{block_ops},\"apply_ops_per_s\":{:.0},\"query_p50_us\":{:.2},\"query_p99_us\":{:.2},\"rss_delta_bytes\":{memory},\"bytes_per_residency\":{:.1},\"min_matched_blocks\":{matched}}}",
        trace.residencies + (PLANTED_HOLDERS * PLANTED_BLOCKS) as u64,
        block_ops as f64 / apply_s.max(1e-9),
        percentile(&latencies, 50.0) * 1e6,
        percentile(&latencies, 99.0) * 1e6,
        memory as f64 / block_ops.max(1) as f64,
    )
}

/// How much of a kvindex query is deriving its 512 chained block keys from the tokens.
fn kvindex_keys_only(trace: &Trace, queries: usize) -> (f64, f64) {
    let planted = trace.conversations.last().map(Vec::as_slice).unwrap_or(&[]);
    let root = kvindex::keys::namespace_root(MODEL, 0);
    let mut latencies = Vec::new();
    for query in 0..(WARMUP_QUERIES + queries) as u64 {
        let tokens = query_tokens(planted, query);
        let started = Instant::now();
        let mut key = root;
        for block in tokens.chunks_exact(BLOCK_SIZE) {
            key = kvindex::keys::block_key(key, block, &[]);
        }
        let elapsed = started.elapsed().as_secs_f64();
        std::hint::black_box(key);
        if query as usize >= WARMUP_QUERIES {
            latencies.push(elapsed);
        }
    }
    latencies.sort_by(f64::total_cmp);
    (
        percentile(&latencies, 50.0) * 1e6,
        percentile(&latencies, 99.0) * 1e6,
    )
}

fn dynamo_lookup_only(trace: &Trace, queries: usize) -> (f64, f64) {
    // Dynamo's own figure is a lookup with the block hashes given; measured on a fresh tree.
    let mut tree = Dynamo(RadixTree::new(), 0);
    let mut tokens = Vec::new();
    for store in &trace.stores {
        let chain = &trace.conversations[store.conversation as usize];
        let (from, to) = (store.from as usize, store.to as usize);
        let hashes_all = engine_hashes(&chain[..to]);
        tokens.clear();
        for &id in &chain[from..to] {
            block_tokens(id, &mut tokens);
        }
        tree.store(
            store.worker,
            &chain[from..to],
            &hashes_all[from..to],
            (from > 0).then(|| hashes_all[from - 1]),
            &tokens,
        );
    }
    let planted = trace.conversations.last().map(Vec::as_slice).unwrap_or(&[]);
    let mut latencies = Vec::new();
    for query in 0..(WARMUP_QUERIES + queries) as u64 {
        let hashes: Vec<LocalBlockHash> = compute_block_hash_for_seq(
            &query_tokens(planted, query),
            BLOCK_SIZE as u32,
            BlockHashOptions::default(),
        );
        let started = Instant::now();
        let scores = tree.0.find_matches(hashes, false);
        let elapsed = started.elapsed().as_secs_f64();
        std::hint::black_box(scores);
        if query as usize >= WARMUP_QUERIES {
            latencies.push(elapsed);
        }
    }
    latencies.sort_by(f64::total_cmp);
    (
        percentile(&latencies, 50.0) * 1e6,
        percentile(&latencies, 99.0) * 1e6,
    )
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn number(args: &[String], name: &str, default: u64) -> Result<u64, String> {
    match flag(args, name) {
        None => Ok(default),
        Some(text) => text
            .parse()
            .map_err(|_| format!("{name} expects a number, got {text:?}")),
    }
}

fn field(line: &str, key: &str) -> f64 {
    let pattern = format!("\"{key}\":");
    line.split(&pattern)
        .nth(1)
        .and_then(|rest| rest.split([',', '}']).next())
        .and_then(|v| v.trim_matches('"').parse().ok())
        .unwrap_or(f64::NAN)
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let parsed = (|| {
        Ok::<_, String>((
            number(&args, "--entries", 10_000_000)?,
            number(&args, "--workers", 256)?.max(PLANTED_HOLDERS as u64) as usize,
            number(&args, "--queries", 10_000)?.max(1) as usize,
        ))
    })();
    let (entries, workers, queries) = match parsed {
        Ok(values) => values,
        Err(error) => {
            eprintln!("kvindex-dynamo-compare: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    match flag(&args, "--only").as_deref() {
        Some("kvindex") => {
            let trace = trace(workers, entries, 42);
            let names = (0..workers)
                .map(|w| format!("10.1.{}.{}:8000", w / 250, w % 250))
                .collect();
            let mut index = Kvindex(
                KvIndex::new(KvIndexConfig {
                    block_size: BLOCK_SIZE,
                    ..KvIndexConfig::default()
                }),
                names,
            );
            println!("{}", measure("kvindex", &mut index, &trace, queries));
            let (p50, p99) = kvindex_keys_only(&trace, queries);
            println!("{{\"indexer\":\"kvindex, key derivation only (no index probe)\",\"query_p50_us\":{p50:.2},\"query_p99_us\":{p99:.2}}}");
            std::process::ExitCode::SUCCESS
        }
        Some("dynamo") => {
            let trace = trace(workers, entries, 42);
            let mut tree = Dynamo(RadixTree::new(), 0);
            println!(
                "{}",
                measure("dynamo RadixTree", &mut tree, &trace, queries)
            );
            drop(tree);
            let (p50, p99) = dynamo_lookup_only(&trace, queries);
            println!("{{\"indexer\":\"dynamo RadixTree, lookup only (hashes given)\",\"query_p50_us\":{p50:.2},\"query_p99_us\":{p99:.2}}}");
            std::process::ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("kvindex-dynamo-compare: --only expects kvindex or dynamo, got {other:?}");
            std::process::ExitCode::from(2)
        }
        None => {
            let Ok(me) = std::env::current_exe() else {
                eprintln!("kvindex-dynamo-compare: cannot find its own binary");
                return std::process::ExitCode::FAILURE;
            };
            let mut lines = Vec::new();
            for which in ["kvindex", "dynamo"] {
                let output = Command::new(&me)
                    .args(["--only", which, "--entries", &entries.to_string()])
                    .args([
                        "--workers",
                        &workers.to_string(),
                        "--queries",
                        &queries.to_string(),
                    ])
                    .output();
                match output {
                    Ok(output) if output.status.success() => {
                        let text = String::from_utf8_lossy(&output.stdout).into_owned();
                        print!("{text}");
                        lines.extend(text.lines().map(str::to_string));
                    }
                    Ok(output) => {
                        eprintln!(
                            "kvindex-dynamo-compare: {which} failed: {}",
                            String::from_utf8_lossy(&output.stderr)
                        );
                        return std::process::ExitCode::FAILURE;
                    }
                    Err(error) => {
                        eprintln!("kvindex-dynamo-compare: cannot run {which}: {error}");
                        return std::process::ExitCode::FAILURE;
                    }
                }
            }
            let find = |name: &str| {
                let tag = format!("\"indexer\":\"{name}\"");
                lines.iter().find(|line| line.contains(&tag))
            };
            if let (Some(ours), Some(theirs)) = (find("kvindex"), find("dynamo RadixTree")) {
                println!(
                    "ratios kvindex/dynamo: apply ops/s {:.2}x, query p50 {:.2}x, query p99 {:.2}x, bytes per residency {:.2}x (matched blocks {} vs {})",
                    field(ours, "apply_ops_per_s") / field(theirs, "apply_ops_per_s"),
                    field(ours, "query_p50_us") / field(theirs, "query_p50_us"),
                    field(ours, "query_p99_us") / field(theirs, "query_p99_us"),
                    field(ours, "bytes_per_residency") / field(theirs, "bytes_per_residency"),
                    field(ours, "min_matched_blocks"),
                    field(theirs, "min_matched_blocks"),
                );
            }
            std::process::ExitCode::SUCCESS
        }
    }
}
