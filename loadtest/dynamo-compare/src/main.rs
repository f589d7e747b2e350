//! Side by side: kvindex's index and Dynamo's `dynamo-kv-router` indexers, fed the same event
//! trace and the same queries, each in its own process so each one's memory is its own.
//!
//! It exists because a figure for our index means little without the best open peer measured
//! on the same machine, trace and queries. The trace follows the recipe in
//! `docs/reference/anchors.md` ("Workload used"): splitmix64 seed 42; 200 shared prefixes of
//! U[8,64] blocks with Zipf(1.0) popularity; each conversation = one prefix + U[16,256] own
//! blocks; 10% replicated on 2–4 workers; the whole prefix is stored (no parent) the first time
//! a worker needs it, then the suffix in chunks of U[1,32] blocks chained to the previous
//! block; fill to N residencies; then queries of 512 blocks = a planted 300-block chain + 212
//! fresh blocks, measured after a warm-up.
//!
//! Three indexers:
//! - `kvindex`: `KvIndex::apply` / `KvIndex::score` (one writer thread, or W threads over
//!   disjoint pods);
//! - `dynamo`: Dynamo's plain single-threaded `RadixTree`;
//! - `dynamo-crtc`: Dynamo's default `ThreadPoolIndexer<ConcurrentRadixTreeCompressed>` (what a
//!   Dynamo user runs), W event threads fed by the caller, lookups inline on reader threads.
//!
//! All get what an engine sends: token ids per block. kvindex hashes them itself (its keys are
//! its own); for Dynamo the tokens are hashed with its `compute_block_hash_for_seq`, as its
//! event listener does for a vLLM `BlockStored`, inside the timed region. Queries are token
//! ids for all (hashing included).
//!
//! Phases of one process (`--only NAME`): fill to N residencies in chunks of stores, timing
//! only the index calls (store rate); quiet queries (p50/p99) and memory (RSS delta); then,
//! with `--writers W`, a further `--extra` residencies applied by W writer threads while
//! `--readers R` threads query at `--read-rate` queries/s each (open loop; 0 = without pause):
//! writer rate, reader p50/p99 under ingest. `--only NAME --writers 1 --idle-writers MS` runs
//! that phase with writers that sleep MS instead of writing: the paced reader alone.
//!
//! `--cold-evict-kb K` also times quiet queries that each start cold (K KiB of cache lines
//! written before each, untimed).
//!
//! `kvindex-dynamo-compare [--entries N] [--workers P] [--queries Q] [--extra E] [--readers R]
//! [--read-rate QPS] [--concurrency 1,2,4] [--reps 5] [--quiet-reps 1] [--cold-evict-kb K]
//! [--baseline BIN]` runs
//! every process and prints medians over the rounds with their spread, and the ratios. One tail
//! figure means little on a shared machine, so the concurrent phase runs `--reps` rounds (each
//! a fresh process per indexer and writer count, the indexers interleaved and their order
//! alternated between rounds); `--baseline` adds another build's kvindex to every round, so a
//! change is measured against its base in the same invocation.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use dynamo_kv_router::concurrent_radix_tree_compressed::ConcurrentRadixTreeCompressed;
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::protocols::{
    compute_block_hash_for_seq, BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData,
    KvCacheStoreData, KvCacheStoredBlockData, RouterEvent,
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
/// Stores per timed chunk: event inputs are built outside the timed region, a chunk at a time,
/// small enough that a chunk's token ids are still in cache, as a just-decoded event's are.
const CHUNK: usize = 256;

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
    /// Block ids of each conversation (its prefix's, then its own); the last is the planted one.
    conversations: Vec<Vec<u64>>,
    /// The fill: every store up to N residencies, the planted chain's stores last.
    fill: Vec<Store>,
    /// Stores after the fill, for the concurrent phase.
    extra: Vec<Store>,
    residencies: u64,
}

/// The anchors.md recipe, as plain store events: `entries` residencies for the fill, then
/// `extra` more.
fn trace(workers: usize, entries: u64, extra: u64, seed: u64) -> Trace {
    let mut rng = SplitMix(seed);
    let prefixes: Vec<Vec<u64>> = (0..200u64).map(|p| (0..rng.range(8, 64)).map(|i| (p << 40) | i).collect()).collect();
    let weights: Vec<f64> = (1..=prefixes.len()).map(|r| 1.0 / r as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut has_prefix = vec![vec![false; prefixes.len()]; workers];
    let mut out = Trace { conversations: Vec::new(), fill: Vec::new(), extra: Vec::new(), residencies: 0 };
    let mut next_conversation = 1u64;
    let mut stored = 0u64;
    while stored < entries + extra {
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
        let copies = if rng.next().is_multiple_of(10) { rng.range(2, 4) as usize } else { 1 };
        let mut holders = Vec::new();
        while holders.len() < copies.min(workers) {
            let worker = (rng.next() % workers as u64) as usize;
            if !holders.contains(&worker) {
                holders.push(worker);
            }
        }
        let conversation = out.conversations.len() as u32;
        let prefix_len = prefixes[prefix].len();
        let phase_fill = stored < entries;
        for &worker in &holders {
            let mut push = |store: Store| {
                stored += u64::from(store.to - store.from);
                if phase_fill {
                    out.fill.push(store);
                } else {
                    out.extra.push(store);
                }
            };
            if !has_prefix[worker][prefix] {
                has_prefix[worker][prefix] = true;
                push(Store { worker: worker as u32, conversation, from: 0, to: prefix_len as u32 });
            }
            let mut start = prefix_len;
            while start < blocks.len() {
                let chunk = (rng.range(1, 32) as usize).min(blocks.len() - start);
                push(Store { worker: worker as u32, conversation, from: start as u32, to: (start + chunk) as u32 });
                start += chunk;
            }
        }
        out.conversations.push(blocks);
    }
    // The planted chain every query starts with, held by a few workers, stored in chained
    // 64-block events as the core benchmarks plant it (BENCHMARKS.md).
    let planted: Vec<u64> = (0..PLANTED_BLOCKS as u64).map(|i| (0x7777u64 << 40) | i).collect();
    let conversation = out.conversations.len() as u32;
    out.conversations.push(planted);
    for worker in 0..PLANTED_HOLDERS.min(workers) {
        for from in (0..PLANTED_BLOCKS).step_by(PLANTED_CHUNK) {
            let to = (from + PLANTED_CHUNK).min(PLANTED_BLOCKS);
            out.fill.push(Store { worker: worker as u32, conversation, from: from as u32, to: to as u32 });
        }
    }
    out.residencies = out.fill.iter().map(|s| u64::from(s.to - s.from)).sum::<u64>();
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

/// What an engine sends for one store, decoded: engine hashes, the parent's, and the token
/// ids, as the `BlockStored` kvindex's decoder yields (built outside the timed region).
struct StoreInput {
    worker: u32,
    hashes: Vec<u64>,
    parent: Option<u64>,
    batch: EventBatch<'static>,
}

impl StoreInput {
    fn build(trace: &Trace, store: &Store) -> StoreInput {
        let chain = &trace.conversations[store.conversation as usize];
        let (from, to) = (store.from as usize, store.to as usize);
        let hashes_all = engine_hashes(&chain[..to]);
        let mut tokens = Vec::with_capacity((to - from) * BLOCK_SIZE);
        for &id in &chain[from..to] {
            block_tokens(id, &mut tokens);
        }
        let hashes = hashes_all[from..to].to_vec();
        let parent = (from > 0).then(|| hashes_all[from - 1]);
        let event = BlockStored {
            block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
            parent_block_hash: parent.map(EngineHash::Uint),
            token_ids: Some(tokens),
            block_size: Some(BLOCK_SIZE as i64),
            medium: Some("GPU"),
            group_idx: Some(0),
            ..Default::default()
        };
        StoreInput {
            worker: store.worker,
            hashes,
            parent,
            batch: EventBatch { ts: 0.0, events: vec![Event::BlockStored(event)], data_parallel_rank: Some(0) },
        }
    }

    fn tokens(&self) -> &[u32] {
        match &self.batch.events[0] {
            Event::BlockStored(s) => s.token_ids.as_deref().unwrap_or(&[]),
            _ => &[],
        }
    }
}

/// The indexers behind one interface. `store` and `score` are the timed calls; `sync` waits
/// for queued work (Dynamo's event threads) and is timed too.
trait Indexer: Send + Sync {
    fn store(&self, input: &StoreInput);
    fn sync(&self) {}
    /// Matched blocks of the best worker, hashing the prompt's tokens included.
    fn score(&self, tokens: &[u32]) -> u32;
}

struct Kvindex {
    index: KvIndex,
    names: Vec<String>,
}

impl Indexer for Kvindex {
    fn store(&self, input: &StoreInput) {
        self.index.apply(&self.names[input.worker as usize], MODEL, &input.batch);
    }

    fn score(&self, tokens: &[u32]) -> u32 {
        let result = self.index.score(&ScoreQuery {
            model: MODEL,
            lora_name: None,
            cache_salt: None,
            token_ids: tokens,
            pods: None,
        });
        result.matches.iter().map(|m| m.matched_blocks).max().unwrap_or(0)
    }
}

fn dynamo_event(input: &StoreInput, id: u64) -> RouterEvent {
    let local = compute_block_hash_for_seq(input.tokens(), BLOCK_SIZE as u32, BlockHashOptions::default());
    let blocks = input
        .hashes
        .iter()
        .zip(local)
        .map(|(&hash, tokens_hash)| KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(hash),
            tokens_hash,
            mm_extra_info: None,
        })
        .collect();
    let event = KvCacheEvent {
        event_id: id,
        data: KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: input.parent.map(ExternalSequenceBlockHash),
            start_position: None,
            blocks,
        }),
        dp_rank: 0,
    };
    RouterEvent::new(u64::from(input.worker), event)
}

/// Dynamo's `RadixTree` is single-threaded (`Rc`/`RefCell`); the mutex only satisfies the
/// trait and is uncontended (this side never runs the concurrent phase).
struct DynamoRadix(std::sync::Mutex<(RadixTree, u64)>);

// SAFETY: the tree is only ever touched by the thread that holds the mutex, one at a time, and
// this side never shares the indexer across threads (no concurrent phase for `dynamo`).
unsafe impl Send for DynamoRadix {}
unsafe impl Sync for DynamoRadix {}

impl Indexer for DynamoRadix {
    fn store(&self, input: &StoreInput) {
        let mut guard = self.0.lock().expect("uncontended");
        guard.1 += 1;
        let event = dynamo_event(input, guard.1);
        if let Err(error) = guard.0.apply_event(event) {
            eprintln!("dynamo apply_event: {error:?}");
        }
    }

    fn score(&self, tokens: &[u32]) -> u32 {
        let hashes = compute_block_hash_for_seq(tokens, BLOCK_SIZE as u32, BlockHashOptions::default());
        let guard = self.0.lock().expect("uncontended");
        guard.0.find_matches(hashes, false).scores.values().copied().max().unwrap_or(0)
    }
}

struct DynamoCrtc {
    pool: ThreadPoolIndexer<ConcurrentRadixTreeCompressed>,
    next_id: AtomicU64,
    runtime: tokio::runtime::Runtime,
}

impl Indexer for DynamoCrtc {
    fn store(&self, input: &StoreInput) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = self.pool.enqueue_event(dynamo_event(input, id)) {
            eprintln!("dynamo enqueue_event: {error:?}");
        }
    }

    fn sync(&self) {
        if let Err(error) = self.runtime.block_on(self.pool.flush_and_wait()) {
            eprintln!("dynamo flush: {error:?}");
        }
    }

    fn score(&self, tokens: &[u32]) -> u32 {
        let hashes = compute_block_hash_for_seq(tokens, BLOCK_SIZE as u32, BlockHashOptions::default());
        self.pool.backend().find_matches(&hashes, false).scores.values().copied().max().unwrap_or(0)
    }
}

fn make(name: &str, workers: usize, threads: usize) -> Box<dyn Indexer> {
    match name {
        "kvindex" => Box::new(Kvindex {
            index: KvIndex::new(KvIndexConfig { block_size: BLOCK_SIZE, ..KvIndexConfig::default() }),
            names: (0..workers).map(|w| format!("10.1.{}.{}:8000", w / 250, w % 250)).collect(),
        }),
        "dynamo" => Box::new(DynamoRadix(std::sync::Mutex::new((RadixTree::new(), 0)))),
        "dynamo-crtc" => Box::new(DynamoCrtc {
            pool: ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), threads.max(1), BLOCK_SIZE as u32),
            next_id: AtomicU64::new(0),
            runtime: tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"),
        }),
        other => panic!("unknown indexer {other}"),
    }
}

/// CPU time of the calling thread, in seconds: on a loaded machine it leaves out the time the
/// thread waited for a core, which wall time does not.
fn thread_cpu_s() -> f64 {
    // SAFETY: `clock_gettime` writes the timespec it is given and nothing else.
    unsafe {
        let mut t: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t);
        t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
    }
}

/// What a fill measured.
struct Filled {
    /// Block ops per second of wall time in the index calls.
    rate: f64,
    /// Block ops per second of the filling thread's CPU time in them (meaningful for indexers
    /// that apply on the caller's thread, not for CRTC's event threads).
    cpu_rate: f64,
    rss_delta: u64,
    ops: u64,
}

/// Fills with the trace in chunks (inputs built outside the timed region).
fn fill(indexer: &dyn Indexer, trace: &Trace) -> Filled {
    let before = rss_bytes();
    let mut applied_s = 0.0;
    let mut cpu_s = 0.0;
    let mut ops = 0u64;
    for chunk in trace.fill.chunks(CHUNK) {
        let inputs: Vec<StoreInput> = chunk.iter().map(|s| StoreInput::build(trace, s)).collect();
        let cpu = thread_cpu_s();
        let started = Instant::now();
        for input in &inputs {
            indexer.store(input);
        }
        indexer.sync();
        applied_s += started.elapsed().as_secs_f64();
        cpu_s += thread_cpu_s() - cpu;
        ops += inputs.iter().map(|i| i.hashes.len() as u64).sum::<u64>();
    }
    Filled {
        rate: ops as f64 / applied_s.max(1e-9),
        cpu_rate: ops as f64 / cpu_s.max(1e-9),
        rss_delta: rss_bytes().saturating_sub(before),
        ops,
    }
}

fn quiet_queries(indexer: &dyn Indexer, trace: &Trace, queries: usize) -> (f64, f64, u32) {
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
    (percentile(&latencies, 50.0) * 1e6, percentile(&latencies, 99.0) * 1e6, matched)
}

/// Queries that each start cold: before each one (untimed) the thread writes every cache line
/// of a buffer of `evict_kb` KiB, so what the query touches comes from farther away, as for a
/// paced reader whose caches other work used meanwhile (2 MiB: its core's L1 and L2; 64 MiB:
/// the L3 too). Each query twice: with its prompt as cold as the rest, and with the prompt
/// read again after the eviction (a server's request has just been decoded: only the index is
/// cold). Returns p50/p99 in microseconds of each.
fn cold_queries(indexer: &dyn Indexer, trace: &Trace, queries: usize, evict_kb: usize) -> [(f64, f64); 2] {
    let planted = trace.conversations.last().map(Vec::as_slice).unwrap_or(&[]);
    let prompts: Vec<Vec<u32>> = (0..64).map(|q| query_tokens(planted, q)).collect();
    let mut buffer = vec![0u64; evict_kb * 1024 / 8];
    let mut latencies = [Vec::with_capacity(queries), Vec::with_capacity(queries)];
    for query in 0..queries {
        for (warm_prompt, lat) in latencies.iter_mut().enumerate() {
            for line in buffer.chunks_mut(8) {
                line[0] = line[0].wrapping_add(1);
            }
            std::hint::black_box(&mut buffer);
            let prompt = &prompts[query % prompts.len()];
            if warm_prompt == 1 {
                std::hint::black_box(prompt.iter().fold(0u32, |a, &t| a.wrapping_add(t)));
            }
            let started = Instant::now();
            std::hint::black_box(indexer.score(prompt));
            lat.push(started.elapsed().as_secs_f64());
        }
    }
    latencies.map(|mut lat| {
        lat.sort_by(f64::total_cmp);
        (percentile(&lat, 50.0) * 1e6, percentile(&lat, 99.0) * 1e6)
    })
}

/// The extra stores applied by `writers` threads (disjoint workers, each worker's stores in
/// order) while `readers` threads query; returns writer block ops/s, reader p50/p99 and
/// queries/s.
fn concurrent(
    name: &str,
    indexer: &dyn Indexer,
    trace: &Trace,
    writers: usize,
    readers: usize,
    read_rate: u64,
    idle_writers: Option<Duration>,
) -> (f64, f64, f64, f64) {
    // Kvindex writers are the caller's threads; Dynamo's are its own event threads, fed here
    // by the same number of producer threads.
    let _ = name;
    let mut parts: Vec<Vec<StoreInput>> = (0..writers).map(|_| Vec::new()).collect();
    for store in &trace.extra {
        parts[store.worker as usize % writers].push(StoreInput::build(trace, store));
    }
    let ops: u64 = if idle_writers.is_some() { 0 } else { parts.iter().flatten().map(|i| i.hashes.len() as u64).sum() };
    let planted = trace.conversations.last().cloned().unwrap_or_default();
    let prompts: Vec<Vec<u32>> = (0..64).map(|q| query_tokens(&planted, q)).collect();
    let stop = AtomicBool::new(false);
    let start = Barrier::new(writers + readers + 1);
    let mut latencies: Vec<f64> = Vec::new();
    let mut elapsed = 0.0;
    std::thread::scope(|scope| {
        let reader_handles: Vec<_> = (0..readers)
            .map(|r| {
                let (stop, start, prompts) = (&stop, &start, &prompts);
                // Named, so that a profile can be filtered to the reader (`perf record -t`).
                let reader = std::thread::Builder::new().name("reader".into());
                reader
                    .spawn_scoped(scope, move || {
                        let mut lat = Vec::new();
                        start.wait();
                        let mut q = r;
                        let interval = (read_rate > 0).then(|| Duration::from_secs_f64(1.0 / read_rate as f64));
                        let mut due = Instant::now();
                        while !stop.load(Ordering::Relaxed) {
                            let prompt = &prompts[q % prompts.len()];
                            let t = Instant::now();
                            std::hint::black_box(indexer.score(prompt));
                            lat.push(t.elapsed().as_secs_f64());
                            q += 1;
                            // Open loop: the next query is due one interval later, whatever this
                            // one cost (sleep granularity makes the achieved rate approximate).
                            if let Some(interval) = interval {
                                due += interval;
                                let now = Instant::now();
                                if due > now {
                                    std::thread::sleep(due - now);
                                }
                            }
                        }
                        lat
                    })
                    .expect("spawn the reader")
            })
            .collect();
        let writer_handles: Vec<_> = parts
            .iter()
            .map(|part| {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    // Idle writers: the reader paced as in the concurrent phase, nothing
                    // written, which separates the pacing's own cost from the writers'.
                    if let Some(idle) = idle_writers {
                        std::thread::sleep(idle);
                        return;
                    }
                    for input in part {
                        indexer.store(input);
                    }
                })
            })
            .collect();
        start.wait();
        let t = Instant::now();
        for w in writer_handles {
            w.join().expect("writer");
        }
        indexer.sync();
        elapsed = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for r in reader_handles {
            latencies.extend(r.join().expect("reader"));
        }
    });
    latencies.sort_by(f64::total_cmp);
    (
        ops as f64 / elapsed.max(1e-9),
        percentile(&latencies, 50.0) * 1e6,
        percentile(&latencies, 99.0) * 1e6,
        latencies.len() as f64 / elapsed.max(1e-9),
    )
}

/// How much of a kvindex query is deriving its block keys from the tokens (all 512).
fn kvindex_keys_only(trace: &Trace, queries: usize) -> (f64, f64) {
    let planted = trace.conversations.last().map(Vec::as_slice).unwrap_or(&[]);
    let mut latencies = Vec::new();
    for query in 0..(WARMUP_QUERIES + queries) as u64 {
        let tokens = query_tokens(planted, query);
        let started = Instant::now();
        let keys = kvindex::keys::PromptKeys::new(&tokens, BLOCK_SIZE, None).all();
        let elapsed = started.elapsed().as_secs_f64();
        std::hint::black_box(keys);
        if query as usize >= WARMUP_QUERIES {
            latencies.push(elapsed);
        }
    }
    latencies.sort_by(f64::total_cmp);
    (percentile(&latencies, 50.0) * 1e6, percentile(&latencies, 99.0) * 1e6)
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn number(args: &[String], name: &str, default: u64) -> Result<u64, String> {
    match flag(args, name) {
        None => Ok(default),
        Some(text) => text.parse().map_err(|_| format!("{name} expects a number, got {text:?}")),
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

struct Options {
    entries: u64,
    workers: usize,
    queries: usize,
    extra: u64,
    readers: usize,
    /// Queries per second per reader in the concurrent phase (0 = as fast as possible).
    read_rate: u64,
    writers: usize,
    concurrency: Vec<usize>,
    /// Rounds of the concurrent phase (each a fresh process per indexer and writer count).
    reps: usize,
    /// Rounds of the quiet phase (fill, quiet queries, memory).
    quiet_reps: usize,
    /// `--idle-writers MS`: the writer threads sleep this long instead of writing (0 = write).
    idle_writers: Option<Duration>,
    /// `--cold-evict-kb K`: also time queries that start cold, K KiB of cache lines written
    /// before each (0 = not run).
    cold_evict_kb: usize,
    /// Another build of this harness whose kvindex runs beside ours in every round
    /// (`kvindex-baseline`): before and after a change in one invocation, interleaved.
    baseline: Option<std::path::PathBuf>,
}

fn options(args: &[String]) -> Result<Options, String> {
    let concurrency = flag(args, "--concurrency")
        .unwrap_or_else(|| "1,2,4".into())
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("--concurrency expects numbers, got {s:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Options {
        entries: number(args, "--entries", 10_000_000)?,
        workers: number(args, "--workers", 256)?.max(PLANTED_HOLDERS as u64) as usize,
        queries: number(args, "--queries", 10_000)?.max(1) as usize,
        extra: number(args, "--extra", 2_000_000)?,
        readers: number(args, "--readers", 1)? as usize,
        read_rate: number(args, "--read-rate", 20_000)?,
        writers: number(args, "--writers", 0)? as usize,
        concurrency,
        reps: number(args, "--reps", 5)?.max(1) as usize,
        quiet_reps: number(args, "--quiet-reps", 1)?.max(1) as usize,
        idle_writers: Some(number(args, "--idle-writers", 0)?).filter(|&ms| ms > 0).map(Duration::from_millis),
        cold_evict_kb: number(args, "--cold-evict-kb", 0)? as usize,
        baseline: flag(args, "--baseline").map(std::path::PathBuf::from),
    })
}

/// One indexer in this process: fill, quiet queries, then the concurrent phase if asked.
fn run_one(name: &str, o: &Options) -> std::process::ExitCode {
    let trace = trace(o.workers, o.entries, o.extra, 42);
    let indexer = make(name, o.workers, o.writers.max(1));
    let Filled { rate, cpu_rate, rss_delta: memory, ops } = fill(indexer.as_ref(), &trace);
    let (p50, p99, matched) = quiet_queries(indexer.as_ref(), &trace, o.queries);
    let cold = if o.cold_evict_kb > 0 {
        let [(c50, c99), (w50, w99)] = cold_queries(indexer.as_ref(), &trace, o.queries.min(2_000), o.cold_evict_kb);
        format!(",\"cold_query_p50_us\":{c50:.2},\"cold_query_p99_us\":{c99:.2},\"cold_index_p50_us\":{w50:.2},\"cold_index_p99_us\":{w99:.2}")
    } else {
        String::new()
    };
    println!(
        "{{\"indexer\":\"{name}\",\"residencies\":{},\"block_ops\":{ops},\"apply_ops_per_s\":{rate:.0},\"apply_ops_per_cpu_s\":{cpu_rate:.0},\"query_p50_us\":{p50:.2},\"query_p99_us\":{p99:.2},\"rss_delta_bytes\":{memory},\"bytes_per_residency\":{:.1},\"min_matched_blocks\":{matched}{cold}}}",
        trace.residencies,
        memory as f64 / ops.max(1) as f64,
    );
    if name == "kvindex" && o.writers == 0 {
        let (p50, p99) = kvindex_keys_only(&trace, o.queries);
        println!("{{\"indexer\":\"kvindex, key derivation only (all 512 blocks, no index)\",\"query_p50_us\":{p50:.2},\"query_p99_us\":{p99:.2}}}");
    }
    if o.writers > 0 {
        if name == "dynamo" {
            eprintln!("kvindex-dynamo-compare: RadixTree is single-threaded; no concurrent phase");
            return std::process::ExitCode::from(2);
        }
        let (wrate, rp50, rp99, qps) =
            concurrent(name, indexer.as_ref(), &trace, o.writers, o.readers, o.read_rate, o.idle_writers);
        println!(
            "{{\"indexer\":\"{name}\",\"writers\":{},\"readers\":{},\"write_ops_per_s\":{wrate:.0},\"read_p50_us\":{rp50:.2},\"read_p99_us\":{rp99:.2},\"reads_per_s\":{qps:.0}}}",
            o.writers, o.readers
        );
    }
    std::process::ExitCode::SUCCESS
}

/// One contender of a round: a label, the binary that runs it, and its `--only` name there.
struct Contender {
    label: &'static str,
    bin: std::path::PathBuf,
    only: &'static str,
}

/// Runs `c` for one round in its own process; returns its lines, relabelled with `c.label`
/// and tagged with the round and the process's place in it (`slot`: round and writer count),
/// by which the ratios pair contenders that ran side by side.
fn child(c: &Contender, o: &Options, writers: usize, round: usize) -> Result<Vec<String>, String> {
    let output = Command::new(&c.bin)
        .args(["--only", c.only])
        .args(["--entries", &o.entries.to_string()])
        .args(["--workers", &o.workers.to_string()])
        .args(["--queries", &o.queries.to_string()])
        .args(["--extra", &o.extra.to_string()])
        .args(["--readers", &o.readers.to_string()])
        .args(["--read-rate", &o.read_rate.to_string()])
        .args(["--writers", &writers.to_string()])
        .args(["--cold-evict-kb", &o.cold_evict_kb.to_string()])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", c.label))?;
    if !output.status.success() {
        return Err(format!("{} failed: {}", c.label, String::from_utf8_lossy(&output.stderr)));
    }
    let from = format!("\"indexer\":\"{}", c.only);
    let to = format!("\"indexer\":\"{}", c.label);
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.ends_with('}'))
        .map(|l| {
            let slot = round * 1000 + writers;
            format!("{},\"round\":{round},\"slot\":{slot}}}", l[..l.len() - 1].replacen(&from, &to, 1))
        })
        .collect())
}

/// Median, minimum and maximum (NaN when empty).
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.retain(|v| !v.is_nan());
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 };
    (median, values[0], values[n - 1])
}

/// The lines of one contender: the quiet phase's (`writers` None) or one writer count's.
fn rows<'a>(lines: &'a [String], label: &str, writers: Option<usize>) -> Vec<&'a String> {
    let tag = format!("\"indexer\":\"{label}\"");
    lines
        .iter()
        .filter(|line| {
            line.contains(&tag)
                && match writers {
                    None => !line.contains("\"writers\""),
                    Some(w) => line.contains(&format!("\"writers\":{w},")),
                }
        })
        .collect()
}

/// `key` over the rounds of one contender: median, min, max.
fn over_rounds(lines: &[String], label: &str, writers: Option<usize>, key: &str) -> (f64, f64, f64) {
    spread(rows(lines, label, writers).iter().map(|l| field(l, key)).collect())
}

/// Ratios of `key`, ours / theirs in the same slot (same round and writer count): median,
/// min, max.
fn round_ratios(lines: &[String], ours: &str, theirs: &str, writers: Option<usize>, key: &str) -> (f64, f64, f64) {
    let theirs = rows(lines, theirs, writers);
    spread(
        rows(lines, ours, writers)
            .iter()
            .filter_map(|o| {
                let slot = field(o, "slot");
                theirs.iter().find(|t| field(t, "slot") == slot).map(|t| field(o, key) / field(t, key))
            })
            .collect(),
    )
}

fn show((median, min, max): (f64, f64, f64), digits: usize) -> String {
    format!("{median:.digits$} [{min:.digits$}–{max:.digits$}]")
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let o = match options(&args) {
        Ok(o) => o,
        Err(error) => {
            eprintln!("kvindex-dynamo-compare: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Some(name) = flag(&args, "--only") {
        if !["kvindex", "dynamo", "dynamo-crtc"].contains(&name.as_str()) {
            eprintln!("kvindex-dynamo-compare: --only expects kvindex, dynamo or dynamo-crtc, got {name:?}");
            return std::process::ExitCode::from(2);
        }
        return run_one(&name, &o);
    }
    let Ok(me) = std::env::current_exe() else {
        eprintln!("kvindex-dynamo-compare: cannot find its own binary");
        return std::process::ExitCode::FAILURE;
    };
    let mut contenders = vec![Contender { label: "kvindex", bin: me.clone(), only: "kvindex" }];
    if let Some(bin) = &o.baseline {
        contenders.push(Contender { label: "kvindex-baseline", bin: bin.clone(), only: "kvindex" });
    }
    let labels: Vec<&str> = contenders.iter().map(|c| c.label).collect();
    contenders.push(Contender { label: "dynamo", bin: me.clone(), only: "dynamo" });
    contenders.push(Contender { label: "dynamo-crtc", bin: me.clone(), only: "dynamo-crtc" });
    // Rounds interleave the contenders, and alternate their order, so that a change in the
    // machine's load falls on all of them alike.
    let mut runs: Vec<(&Contender, usize, usize)> = Vec::new();
    for round in 0..o.quiet_reps {
        let mut order: Vec<&Contender> = contenders.iter().collect();
        if round % 2 == 1 {
            order.reverse();
        }
        runs.extend(order.into_iter().map(|c| (c, 0, round)));
    }
    for round in 0..o.reps {
        for &w in &o.concurrency {
            let mut order: Vec<&Contender> = contenders.iter().filter(|c| c.only != "dynamo").collect();
            if round % 2 == 1 {
                order.reverse();
            }
            runs.extend(order.into_iter().map(|c| (c, w, round)));
        }
    }
    let mut lines: Vec<String> = Vec::new();
    for (c, writers, round) in runs {
        match child(c, &o, writers, round) {
            Ok(text) => {
                for line in text {
                    println!("{line}");
                    lines.push(line);
                }
            }
            Err(error) => {
                eprintln!("kvindex-dynamo-compare: {error}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    // Every process fills and answers quiet queries before its concurrent phase, so the quiet
    // figures are over all of a contender's processes.
    println!(
        "medians [min–max]: quiet figures over every process of a contender ({} quiet round(s), and each concurrent one), concurrent over {} round(s)",
        o.quiet_reps, o.reps
    );
    for label in labels.iter().chain(&["dynamo", "dynamo-crtc"]) {
        println!(
            "{label}: apply ops/s {}, per CPU second {}, query p50 {} us, p99 {} us, bytes per residency {}",
            show(over_rounds(&lines, label, None, "apply_ops_per_s"), 0),
            show(over_rounds(&lines, label, None, "apply_ops_per_cpu_s"), 0),
            show(over_rounds(&lines, label, None, "query_p50_us"), 2),
            show(over_rounds(&lines, label, None, "query_p99_us"), 2),
            show(over_rounds(&lines, label, None, "bytes_per_residency"), 1),
        );
        if o.cold_evict_kb > 0 {
            println!(
                "{label}: cold query ({} KiB written before each) p50 {} us, p99 {} us; prompt read again after the eviction: p50 {} us, p99 {} us",
                o.cold_evict_kb,
                show(over_rounds(&lines, label, None, "cold_query_p50_us"), 2),
                show(over_rounds(&lines, label, None, "cold_query_p99_us"), 2),
                show(over_rounds(&lines, label, None, "cold_index_p50_us"), 2),
                show(over_rounds(&lines, label, None, "cold_index_p99_us"), 2),
            );
        }
    }
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for &ours in &labels {
        pairs.push((ours, "dynamo"));
        pairs.push((ours, "dynamo-crtc"));
    }
    if labels.len() > 1 {
        pairs.push(("kvindex", "kvindex-baseline"));
    }
    for &(ours, theirs) in &pairs {
        if rows(&lines, ours, None).is_empty() || rows(&lines, theirs, None).is_empty() {
            continue;
        }
        let ratio = |key: &str| show(round_ratios(&lines, ours, theirs, None, key), 2);
        println!(
            "ratios {ours}/{theirs} (per process side by side, median [min–max]): apply ops/s {}x (per CPU second {}x), query p50 {}x, query p99 {}x, bytes per residency {}x (matched blocks {} vs {})",
            ratio("apply_ops_per_s"),
            ratio("apply_ops_per_cpu_s"),
            ratio("query_p50_us"),
            ratio("query_p99_us"),
            ratio("bytes_per_residency"),
            over_rounds(&lines, ours, None, "min_matched_blocks").1,
            over_rounds(&lines, theirs, None, "min_matched_blocks").1,
        );
        if o.cold_evict_kb > 0 {
            println!(
                "ratios {ours}/{theirs}, cold queries: p50 {}x, p99 {}x; prompt read again: p50 {}x, p99 {}x",
                ratio("cold_query_p50_us"),
                ratio("cold_query_p99_us"),
                ratio("cold_index_p50_us"),
                ratio("cold_index_p99_us"),
            );
        }
    }
    for &w in &o.concurrency {
        for label in labels.iter().chain(&["dynamo-crtc"]) {
            println!(
                "{w} writer(s) + {} reader(s) at {}/s, {label}: write ops/s {}, read p50 {} us, read p99 {} us, reads/s {}",
                o.readers,
                o.read_rate,
                show(over_rounds(&lines, label, Some(w), "write_ops_per_s"), 0),
                show(over_rounds(&lines, label, Some(w), "read_p50_us"), 2),
                show(over_rounds(&lines, label, Some(w), "read_p99_us"), 2),
                show(over_rounds(&lines, label, Some(w), "reads_per_s"), 0),
            );
        }
        for &(ours, theirs) in pairs.iter().filter(|p| p.1 != "dynamo") {
            let ratio = |key: &str| show(round_ratios(&lines, ours, theirs, Some(w), key), 2);
            let of_medians =
                |key: &str| over_rounds(&lines, ours, Some(w), key).0 / over_rounds(&lines, theirs, Some(w), key).0;
            println!(
                "ratios {ours}/{theirs}, {w} writer(s): write ops/s {}x, read p50 {}x, read p99 {}x (per round, median [min–max]); of the medians: read p50 {:.2}x, read p99 {:.2}x",
                ratio("write_ops_per_s"),
                ratio("read_p50_us"),
                ratio("read_p99_us"),
                of_medians("read_p50_us"),
                of_medians("read_p99_us"),
            );
        }
    }
    std::process::ExitCode::SUCCESS
}
