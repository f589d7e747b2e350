//! Footprint and latency-distribution figures the criterion benches cannot give: memory per
//! resident (block, pod) entry at 10M entries, bytes allocated per score call, score p50/p99,
//! and the single-thread apply rate (median of runs).
//!
//! `cargo bench -p kvindex --bench footprint`. Prints one line per figure.

#[path = "workload/mod.rs"]
mod workload;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kvindex::wire::decode_batch;
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use workload::{apply_payloads, fill, planted, query_tokens, MODEL};

/// Counts bytes allocated (for a score call's allocation) and bytes live (for the index's
/// heap footprint, which RSS overstates with the workload generator's freed garbage).
struct Counting;

static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size.saturating_sub(layout.size()) as u64, Ordering::Relaxed);
        LIVE.fetch_add(new_size as u64, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn score_latency(index: &KvIndex, prompt: &[u32], runs: usize) -> (f64, f64, u64) {
    let q = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: prompt, pods: None };
    for _ in 0..runs / 10 {
        std::hint::black_box(index.score(&q));
    }
    let mut us = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        std::hint::black_box(index.score(&q));
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    let before = ALLOCATED.load(Ordering::Relaxed);
    std::hint::black_box(index.score(&q));
    let allocated = ALLOCATED.load(Ordering::Relaxed) - before;
    (percentile(&us, 0.5), percentile(&us, 0.99), allocated)
}

fn apply_rate() -> f64 {
    let index = KvIndex::new(KvIndexConfig { block_size: 16, ..Default::default() });
    fill(&index, 64, 2_000_000, (16, 256), 7);
    let (payloads, _) = apply_payloads(16, 64);
    let mut rates = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let mut ops = 0u64;
        for _ in 0..20 {
            for (pod, payload) in &payloads {
                let batch = decode_batch(payload).expect("valid");
                let r = index.apply(pod, MODEL, &batch);
                ops += r.stored_blocks + r.removed_blocks;
            }
        }
        rates.push(ops as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` probes every bench target
    }
    if std::env::var_os("FOOTPRINT_APPLY_ONLY").is_some() {
        print_apply_rate();
        return;
    }

    // The memory figure comes first: the apply-rate runs build and drop indexes whose deferred
    // frees (the tree reclaims replaced segments by epoch) would otherwise land inside this
    // measurement and hide part of the index's memory.
    let base = rss_bytes();
    let live_base = LIVE.load(Ordering::Relaxed);
    let index = KvIndex::new(KvIndexConfig { block_size: 16, ..Default::default() });
    let t = Instant::now();
    let fleet = fill(&index, 256, 10_000_000, (16, 256), 42);
    let fill_s = t.elapsed().as_secs_f64();
    drop(fleet);
    let live = LIVE.load(Ordering::Relaxed) - live_base;
    let rss = rss_bytes().saturating_sub(base);
    let entries = index.table().entries();
    println!(
        "memory at {:.2}M entries ({:.2}M distinct blocks, 256 pods): live heap {:.0} MiB = {:.1} B/entry (index tables {:.1} B/entry, the rest per-pod sets and maps); RSS delta {:.1} B/entry (fill {:.1}s)",
        entries as f64 / 1e6,
        index.table().keys() as f64 / 1e6,
        live as f64 / (1 << 20) as f64,
        live as f64 / entries as f64,
        index.table().approx_bytes() as f64 / entries as f64,
        rss as f64 / entries as f64,
        fill_s
    );
    let conv = planted(&index, 300, &[3, 77, 150, 201]);
    let prompt = query_tokens(&conv, 300, 212, 16);
    let (p50, p99, alloc) = score_latency(&index, &prompt, 20_000);
    println!("score 8k tokens (512 blocks, 300 held), 256 pods, 10M resident: p50 {p50:.1} us, p99 {p99:.1} us, {alloc} B allocated/call");
    drop(index);

    let index = KvIndex::new(KvIndexConfig { block_size: 64, ..Default::default() });
    fill(&index, 96, 5_000_000, (64, 2048), 43);
    let conv = planted(&index, 3000, &[5, 50, 90]);
    let prompt = query_tokens(&conv, 3000, 750, 64);
    let (p50, p99, alloc) = score_latency(&index, &prompt, 5_000);
    println!("score 240k tokens (3750 blocks of 64, 3000 held), 96 pods, 5M resident: p50 {p50:.1} us, p99 {p99:.1} us, {alloc} B allocated/call");
    drop(index);

    print_apply_rate();
}

fn print_apply_rate() {
    let rate = apply_rate();
    println!("apply, decode included, 1 thread, 2M resident: median {:.2}M block ops/s (7 runs)", rate / 1e6);
}
