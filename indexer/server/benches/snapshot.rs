//! Snapshot cost at a realistic size: an index of `KVINDEX_BENCH_ENTRIES` (default 10M)
//! resident (block, pod) entries over 256 pods, exported, encoded and written to RocksDB, then
//! loaded and imported back (what a warm restart does before its short replay). Prints one
//! line per phase; the figures go to BENCHMARKS.md.
//!
//! `cargo bench -p kvindex-server --bench snapshot` (release build).

use std::time::Instant;

use kvindex::wire::{BlockStored, EngineHash, Event, EventBatch};
use kvindex::{KvIndex, KvIndexConfig};
use kvindex_server::snapshot::format::{Header, StreamRecord};
use kvindex_server::snapshot::store::Store;

const PODS: u64 = 256;
const BLOCKS_PER_STORE: u64 = 32;

fn store(chain: u64) -> EventBatch<'static> {
    let tokens: Vec<u32> = (0..BLOCKS_PER_STORE * 16).map(|j| (chain * 7919 + j) as u32 % 150_000).collect();
    // One hash configuration fleet-wide (as in production): the same tokens, the same hashes.
    let hashes = (0..BLOCKS_PER_STORE).map(|b| EngineHash::Uint((chain << 8) ^ b ^ 1)).collect();
    EventBatch {
        ts: 0.0,
        events: vec![Event::BlockStored(BlockStored {
            block_hashes: hashes,
            parent_block_hash: None,
            token_ids: Some(tokens),
            block_size: Some(16),
            ..Default::default()
        })],
        data_parallel_rank: None,
    }
}

fn dir_bytes(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

fn main() {
    let entries: u64 = std::env::var("KVINDEX_BENCH_ENTRIES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000_000);
    let chains_per_pod = entries / PODS / BLOCKS_PER_STORE;
    let config = KvIndexConfig {
        block_size: 16,
        shards: 64,
        max_entries: u64::MAX >> 1,
        hash_check: None,
        ..Default::default()
    };
    let index = KvIndex::new(config.clone());
    let t = Instant::now();
    for pod in 0..PODS {
        let name = format!("10.0.{}.{}:8000", pod / 256, pod % 256);
        for c in 0..chains_per_pod {
            // A quarter of each pod's chains are shared fleet-wide (system prompts, few-shot).
            let chain = if c % 4 == 0 { c } else { pod * 1_000_000 + c };
            index.apply(&name, "m", &store(chain));
        }
    }
    println!(
        "build: {} entries, {} keys in {:.2}s",
        index.table().entries(),
        index.table().keys(),
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let exports = index.export_all();
    let export_s = t.elapsed().as_secs_f64();
    let records: Vec<StreamRecord> =
        exports.into_iter().map(|e| StreamRecord::new(&e.pod.clone(), 0, 1000, e)).collect();
    let residencies: u64 = records.iter().map(StreamRecord::residencies).sum();
    let dir = tempfile::tempdir().unwrap();
    let db = Store::open(dir.path()).unwrap();
    let header = Header {
        recipe_version: kvindex::keys::RECIPE_VERSION,
        block_size: 16,
        created_unix_ms: 0,
        streams: records.len() as u64,
        residencies,
    };
    let t = Instant::now();
    db.save(&header, &records, true).unwrap();
    db.flush().unwrap();
    let save_s = t.elapsed().as_secs_f64();
    drop(db);
    drop(records);
    println!(
        "snapshot: export {export_s:.2}s, encode+write+flush {save_s:.2}s, {residencies} residencies, {:.1} MB on disk ({:.2} B/residency)",
        dir_bytes(dir.path()) as f64 / 1e6,
        dir_bytes(dir.path()) as f64 / residencies as f64
    );
    drop(index);

    let t = Instant::now();
    let db = Store::open(dir.path()).unwrap();
    let loaded = db.load(kvindex::keys::RECIPE_VERSION, 16).unwrap().unwrap();
    let load_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let restored = KvIndex::new(config);
    for r in &loaded.streams {
        restored.import_pod(&r.export());
    }
    let import_s = t.elapsed().as_secs_f64();
    println!(
        "restore: open+read+verify {load_s:.2}s, import {import_s:.2}s, total {:.2}s; {} entries back",
        load_s + import_s,
        restored.table().entries()
    );
}
