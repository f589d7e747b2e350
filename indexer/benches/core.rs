//! Core benchmarks (criterion): apply rate with decode, in-process scoring with hashing, and
//! key derivation alone (key recipe 3 beside recipe 2's XXH3-64 per block, in one run).
//!
//! `cargo bench -p kvindex --bench core`. Figures and comparisons live in BENCHMARKS.md.

#[path = "workload/mod.rs"]
mod workload;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvindex::keys::{block_hash, PromptKeys};
use kvindex::wire::decode_batch;
use kvindex::{KvIndex, KvIndexConfig, PodRules, ScoreQuery};
use workload::{apply_payloads, fill, planted, query_tokens, MODEL};
use xxhash_rust::xxh3::xxh3_64_with_seed;

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
    // The same with every pod's match cut in units (EAGLE: the last block held back), the path
    // a fleet whose engine blocks are larger than the index's takes.
    for p in 0..256 {
        index.set_pod_rules(&workload::pod_name(p), PodRules { eagle: true, context_parallel: 1 }).expect("valid");
    }
    assert_eq!(index.score(&q).matches.iter().map(|m| m.matched_blocks).max(), Some(299));
    g.bench_function("8k tokens (512 blocks), 256 pods, 10M resident, every pod cut in units", |b| {
        b.iter(|| index.score(&q))
    });
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

fn bench_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("keys");
    g.throughput(Throughput::Elements(512));
    for bs in [16, 64] {
        let mut tokens = Vec::new();
        for id in 0..512 {
            workload::block_tokens(id, bs, &mut tokens);
        }
        g.bench_function(format!("recipe 3, 512 blocks of {bs} tokens (PromptKeys::all)"), |b| {
            b.iter(|| PromptKeys::new(&tokens, bs, None).all())
        });
        // What key recipe 2 computed per block: XXH3-64 of the tokens' little-endian bytes (read
        // in place on little-endian machines, as here).
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        g.bench_function(format!("recipe 2 (XXH3-64), 512 blocks of {bs} tokens"), |b| {
            b.iter(|| {
                bytes
                    .chunks_exact(bs * 4)
                    .map(|block| xxh3_64_with_seed(block, 0x6b76_626c_6f63_6b02))
                    .collect::<Vec<u64>>()
            })
        });
        if bs == 16 {
            g.bench_function("recipe 3 portable (no AES instructions), 512 blocks of 16 tokens", |b| {
                b.iter(|| {
                    let mut keys = vec![0u64; 512];
                    block_hash::hash_blocks_portable(&tokens, 16, 1, &mut keys);
                    keys
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench_keys, bench_apply, bench_score);
criterion_main!(benches);
