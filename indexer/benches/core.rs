//! Core benchmarks (criterion): apply rate with decode, and in-process scoring with hashing.
//!
//! `cargo bench -p kvindex --bench core`. Figures and comparisons live in BENCHMARKS.md.

#[path = "workload/mod.rs"]
mod workload;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvindex::wire::decode_batch;
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use workload::{apply_payloads, fill, planted, query_tokens, MODEL};

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
