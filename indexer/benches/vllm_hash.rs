//! Cost of reproducing vLLM block hashes, to size how much of the ingest stream the
//! `verify_chain` cross-check may sample. Reported per block (16 tokens, the common block size).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use kvindex::vllm_hash::{BlockHasher, HashAlgo, InternalHash, ParentRef, PublishedHash, VllmHashConfig, VllmVersion};

const BLOCK_SIZE: usize = 16;
const BLOCKS: usize = 64;

fn hasher(algo: HashAlgo) -> BlockHasher {
    BlockHasher::new(&VllmHashConfig { version: VllmVersion::new(0, 33, 0), algo, pythonhashseed: Some("0".into()) })
        .expect("reproducible configuration")
}

fn token_ids() -> Vec<u32> {
    // Realistic vocabulary ids (mixed opcode/head widths), deterministic.
    (0..(BLOCK_SIZE * BLOCKS) as u32).map(|i| i.wrapping_mul(2_654_435_761) % 151_936).collect()
}

fn per_block_hash(c: &mut Criterion) {
    let tokens = token_ids();
    let mut group = c.benchmark_group("hash_block");
    group.throughput(Throughput::Elements(1));
    for algo in [HashAlgo::Sha256Cbor, HashAlgo::Sha256, HashAlgo::XxhashCbor, HashAlgo::Xxhash] {
        let hasher = hasher(algo);
        let parent = hasher.hash_block(None, &tokens[..BLOCK_SIZE], None);
        let mut scratch = Vec::with_capacity(256);
        group.bench_function(algo.as_str(), |b| {
            b.iter(|| {
                black_box(hasher.hash_block_with(
                    &mut scratch,
                    Some(black_box(&parent)),
                    black_box(&tokens[BLOCK_SIZE..2 * BLOCK_SIZE]),
                    None,
                ))
            })
        });
    }
    group.finish();
}

fn verify_event(c: &mut Criterion) {
    let tokens = token_ids();
    let hasher = hasher(HashAlgo::Sha256Cbor);
    let chain: Vec<InternalHash> = hasher.hash_chain(None, &tokens, BLOCK_SIZE, &[]);
    let published: Vec<PublishedHash<'static>> =
        chain.iter().map(|hash| PublishedHash::Int(hash.published_u64().unwrap_or_default())).collect();
    let mut group = c.benchmark_group("verify_chain");
    group.throughput(Throughput::Elements(BLOCKS as u64));
    group.bench_function("sha256_cbor_64_blocks", |b| {
        b.iter(|| {
            black_box(hasher.verify_chain(ParentRef::Root, black_box(&tokens), BLOCK_SIZE, black_box(&published), &[]))
        })
    });
    group.finish();
}

criterion_group!(benches, per_block_hash, verify_event);
criterion_main!(benches);
