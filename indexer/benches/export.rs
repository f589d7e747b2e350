//! What exporting a pod's residencies costs (the snapshot's CPU), on an index shaped like the
//! steady churn of `e2e_ingest` (phase 5): 64 pods, each hashing with its own seed, storing
//! conversations of 8 chained 16-block stores with that bench's token ids (so some
//! conversations of different pods hold the same blocks under other engine hashes), filled to
//! `EXPORT_ENTRIES` (default 10M) residencies and then churned (each new conversation evicts
//! the pod's oldest, tail first) for `EXPORT_CHURN` conversations per pod (default 300), so
//! segments have been freed and reused as in a running server.
//!
//! Prints the CPU seconds (this thread) of `EXPORT_ROUNDS` (default 5) exports of every pod,
//! their median and the median per residency. Uses only `KvIndex::apply` and
//! `KvIndex::export_pod`, so the same file measures any commit that has them (run two
//! builds back to back for a before/after).
//!
//! `cargo bench -p kvindex --bench export` (release build).

use kvindex::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch};
use kvindex::{KvIndex, KvIndexConfig};

const PODS: usize = 64;
const STORE_BLOCKS: usize = 16;
const CHUNKS: usize = 8;
const BLOCK: usize = 16;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// CPU seconds of the calling thread.
fn thread_cpu_s() -> f64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call; CLOCK_THREAD_CPUTIME_ID is 3 on Linux.
    unsafe { clock_gettime(3, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

fn batch(events: Vec<Event<'static>>) -> EventBatch<'static> {
    EventBatch { ts: 0.0, events, data_parallel_rank: None }
}

/// Pod `id`'s store `chunk` of conversation `conv`, as `e2e_ingest`'s `store_payload` builds
/// it (per-pod hashes).
fn store(id: usize, conv: u64, chunk: usize, parent: Option<u64>) -> (Event<'static>, Vec<u64>) {
    let tokens: Vec<u32> = (0..STORE_BLOCKS * BLOCK)
        .map(|j| ((id as u64 * 1_000_003 + conv * 7919 + (chunk * STORE_BLOCKS * BLOCK + j) as u64) % 151_000) as u32)
        .collect();
    let hashes: Vec<u64> = (0..STORE_BLOCKS)
        .map(|b| ((id as u64) << 48) ^ (conv << 16) ^ (chunk * STORE_BLOCKS + b) as u64 ^ 0x9e37_79b9_7f4a_7c15)
        .collect();
    let event = Event::BlockStored(BlockStored {
        block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
        parent_block_hash: parent.map(EngineHash::Uint),
        token_ids: Some(tokens),
        block_size: Some(BLOCK as i64),
        medium: Some("GPU"),
        ..Default::default()
    });
    (event, hashes)
}

fn evict(hashes: &[u64]) -> Vec<Event<'static>> {
    hashes
        .iter()
        .rev()
        .map(|&h| {
            Event::BlockRemoved(BlockRemoved {
                block_hashes: vec![EngineHash::Uint(h)],
                medium: Some("GPU"),
                ..Default::default()
            })
        })
        .collect()
}

fn main() {
    let entries = env("EXPORT_ENTRIES", 10_000_000);
    let churn = env("EXPORT_CHURN", 300);
    let rounds = env("EXPORT_ROUNDS", 5).max(1) as usize;
    let index = KvIndex::new(KvIndexConfig {
        block_size: BLOCK,
        shards: 64,
        max_entries: u64::MAX >> 1,
        hash_check: None,
        ..Default::default()
    });
    let names: Vec<String> = (0..PODS).map(|p| format!("10.0.0.{p}:8000")).collect();
    let per_conv = (STORE_BLOCKS * CHUNKS) as u64;
    let resident = entries / PODS as u64 / per_conv;
    let t = std::time::Instant::now();
    let mut held: Vec<std::collections::VecDeque<Vec<u64>>> = vec![Default::default(); PODS];
    for conv in 0..resident + churn {
        for (id, pod) in names.iter().enumerate() {
            let mut conversation: Vec<u64> = Vec::with_capacity(per_conv as usize);
            for chunk in 0..CHUNKS {
                let (event, hashes) = store(id, conv, chunk, conversation.last().copied());
                index.apply(pod, "m", &batch(vec![event]));
                conversation.extend(hashes);
            }
            held[id].push_back(conversation);
            if conv >= resident {
                let oldest = held[id].pop_front().expect("resident conversations");
                index.apply(pod, "m", &batch(evict(&oldest)));
            }
        }
    }
    println!(
        "index: {} pods, {} residencies, {} keys, built and churned ({churn} conversations per pod) in {:.1} s",
        PODS,
        index.table().entries(),
        index.table().keys(),
        t.elapsed().as_secs_f64()
    );
    let mut cpu = Vec::with_capacity(rounds);
    let mut exported = 0u64;
    for _ in 0..rounds {
        let c = thread_cpu_s();
        exported = 0;
        for pod in &names {
            let export = index.export_pod(pod).expect("every pod has state");
            exported += export.residencies();
            std::hint::black_box(&export);
        }
        cpu.push(thread_cpu_s() - c);
    }
    let shown: Vec<String> = cpu.iter().map(|c| format!("{c:.3}")).collect();
    cpu.sort_by(f64::total_cmp);
    let median = cpu[rounds / 2];
    println!(
        "export of every pod: {} CPU s; median {median:.3} CPU s for {exported} residencies, {:.1} ns per residency",
        shown.join(" / "),
        median * 1e9 / exported as f64
    );
}
