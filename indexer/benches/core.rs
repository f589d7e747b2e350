//! Core benchmarks (criterion): apply rate with decode, and in-process scoring with hashing.
//!
//! `cargo bench -p kvindex --bench core`. Figures and comparisons live in BENCHMARKS.md.

#[path = "workload/mod.rs"]
mod workload;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvindex::wire::{decode_batch, Event};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use workload::{
    encode_batch, engine_hash, fill, pod_name, query_tokens, removed_event, stored_event, Conversation, MODEL,
};

/// One engine step's worth of traffic per pod: a 64-block request stored in 16-block events,
/// then evicted one hash per `BlockRemoved` (as vLLM's block pool does), all as msgpack.
fn apply_payloads(bs: usize, pods: usize) -> (Vec<(String, Vec<u8>)>, u64) {
    let mut out = Vec::new();
    let mut tokens = Vec::new();
    let mut ops = 0;
    for p in 0..pods {
        let blocks: Vec<u64> = (0..64u64).map(|i| ((p as u64 + 1) << 32) | i).collect();
        let stores: Vec<Event<'_>> =
            (0..4).map(|c| Event::BlockStored(stored_event(&blocks, c * 16, c * 16 + 16, bs, &mut tokens))).collect();
        let removes: Vec<Event<'_>> =
            (0..64).rev().map(|i| Event::BlockRemoved(removed_event(engine_hash(&blocks, i)))).collect();
        for events in [stores, removes] {
            let mut buf = Vec::new();
            encode_batch(1.7e9, &events, &mut buf);
            out.push((pod_name(1000 + p), buf));
        }
        ops += 128;
    }
    (out, ops)
}

fn bench_apply(c: &mut Criterion) {
    let index = KvIndex::new(KvIndexConfig { block_size: 16, ..Default::default() });
    fill(&index, 64, 2_000_000, (16, 256), 7);
    let (payloads, ops) = apply_payloads(16, 16);
    let mut g = c.benchmark_group("apply");
    g.throughput(Throughput::Elements(ops));
    g.sample_size(30);
    g.bench_function("decode+apply 16 pods x (64 stores + 64 removes), 2M resident", |b| {
        b.iter(|| {
            for (pod, payload) in &payloads {
                let batch = decode_batch(payload).expect("valid");
                index.apply(pod, MODEL, &batch);
            }
        })
    });
    g.finish();
}

fn planted(index: &KvIndex, len: usize, holders: &[usize]) -> Conversation {
    let blocks: Vec<u64> = (0..len as u64).map(|i| (0x7777u64 << 40) | i).collect();
    let mut tokens = Vec::new();
    for &p in holders {
        for start in (0..len).step_by(64) {
            let ev = stored_event(&blocks, start, (start + 64).min(len), index.block_size(), &mut tokens);
            let batch = kvindex::wire::EventBatch {
                ts: 0.0,
                events: vec![Event::BlockStored(ev)],
                data_parallel_rank: Some(0),
            };
            index.apply(&pod_name(p), MODEL, &batch);
        }
    }
    Conversation { blocks, prefix_len: 0 }
}

fn bench_score(c: &mut Criterion) {
    let mut g = c.benchmark_group("score");
    g.sample_size(50);

    let index = KvIndex::new(KvIndexConfig { block_size: 16, ..Default::default() });
    fill(&index, 256, 10_000_000, (16, 256), 42);
    let conv = planted(&index, 300, &[3, 77, 150, 201]);
    let prompt = query_tokens(&conv, 300, 212, 16);
    assert_eq!(prompt.len(), 8192);
    let q = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: &prompt, pods: None };
    assert_eq!(index.score(&q).matches.iter().map(|m| m.matched_blocks).max(), Some(300));
    g.bench_function("8k tokens (512 blocks), 256 pods, 10M resident", |b| b.iter(|| index.score(&q)));
    drop(index);

    let index = KvIndex::new(KvIndexConfig { block_size: 64, ..Default::default() });
    fill(&index, 96, 5_000_000, (64, 2048), 43);
    let conv = planted(&index, 3000, &[5, 50, 90]);
    let prompt = query_tokens(&conv, 3000, 750, 64);
    assert_eq!(prompt.len(), 240_000);
    let q = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: &prompt, pods: None };
    assert_eq!(index.score(&q).matches.iter().map(|m| m.matched_blocks).max(), Some(3000));
    g.bench_function("240k tokens (3750 blocks of 64), 96 pods, 5M resident", |b| {
        b.iter_batched(|| (), |_| index.score(&q), BatchSize::SmallInput)
    });
    g.finish();
}

criterion_group!(benches, bench_apply, bench_score);
criterion_main!(benches);
