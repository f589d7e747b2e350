//! Cost of SGLang's sampled page-hash cross-check (`PageChainCheck::check`), to compare with
//! vLLM's (`vllm_hash` bench, `verify_chain`): what one checked store costs `kvindex serve`'s
//! apply worker, per page, for a root store and for a continuation of a checked one. Page size 1
//! (SGLang's default: every token a page) and 16.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use kvindex::sglang::{event_id, page_digests, ChainTokens, EventFormat, PageChainCheck, SglangRelease};
use kvindex::wire::{BlockStored, EngineHash};

const TOKENS: usize = 1024;

fn token_ids() -> Vec<u32> {
    // Realistic vocabulary ids, deterministic (as the vllm_hash bench).
    (0..TOKENS as u32).map(|i| i.wrapping_mul(2_654_435_761) % 151_936).collect()
}

/// The chain's two stores (the first half, then its continuation), as SGLang 0.5.23 publishes.
fn stores(page: usize) -> (BlockStored<'static>, BlockStored<'static>) {
    let tokens = token_ids();
    let wide: Vec<u64> = tokens.iter().map(|&t| u64::from(t)).collect();
    let ids: Vec<i64> =
        page_digests(None, ChainTokens::Plain(&wide), page, false).unwrap().iter().map(event_id).collect();
    let half = ids.len() / 2;
    let store = |pages: std::ops::Range<usize>, parent: Option<i64>| BlockStored {
        block_hashes: ids[pages.clone()].iter().map(|&i| EngineHash::Int(i)).collect(),
        parent_block_hash: parent.map(EngineHash::Int),
        token_ids: Some(tokens[pages.start * page..pages.end * page].to_vec()),
        block_size: Some(page as i64),
        ..Default::default()
    };
    (store(0..half, None), store(half..ids.len(), Some(ids[half - 1])))
}

fn check(c: &mut Criterion) {
    let release = SglangRelease::new(0, 5, 23);
    let mut group = c.benchmark_group("sglang_page_check");
    for page in [1usize, 16] {
        let (root, continuation) = stores(page);
        group.throughput(Throughput::Elements(root.block_hashes.len() as u64));
        group.bench_function(format!("root_{}_pages_of_{page}", root.block_hashes.len()), |b| {
            let mut check = PageChainCheck::new(release, EventFormat::Default);
            b.iter(|| black_box(check.check(black_box(&root))))
        });
        group.bench_function(format!("continuation_{}_pages_of_{page}", continuation.block_hashes.len()), |b| {
            let mut check = PageChainCheck::new(release, EventFormat::Default);
            check.check(&root);
            b.iter(|| black_box(check.check(black_box(&continuation))))
        });
    }
    group.finish();
}

criterion_group!(benches, check);
criterion_main!(benches);
