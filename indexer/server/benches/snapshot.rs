//! Snapshot cost at a realistic size: an index of `KVINDEX_BENCH_ENTRIES` (default 10M)
//! resident (block, pod) entries over 256 pods, exported, encoded and written to RocksDB, then
//! loaded and imported back (what a warm restart does before its short replay). Prints one
//! line per phase; the figures go to BENCHMARKS.md.
//!
//! Export and import run per pod on `KVINDEX_BENCH_THREADS` threads (default: every core), as
//! the service's apply workers do (each exports and imports the pods of its own streams).
//!
//! `KVINDEX_BENCH_EXPORTS=n` exports n times and reports the median (by CPU), `KVINDEX_BENCH_RESAVES`
//! sets the steady rewrites (default 4).
//!
//! Each phase also prints the process's CPU seconds (user + system, all threads): on a shared,
//! loaded machine wall time says more about the neighbours than about the code.
//!
//! `cargo bench -p kvindex-server --bench snapshot` (release build).

use std::time::Instant;

use kvindex::wire::{BlockStored, EngineHash, Event, EventBatch};
use kvindex::{KvIndex, KvIndexConfig};
use kvindex_server::persist::snapshot::format::{self, Header, StreamRecord};
use kvindex_server::persist::snapshot::store::{SnapshotDir, Store};

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

/// CPU seconds this process has used (user + system, every thread), from `/proc/self/stat`.
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; 100 ticks/s.
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

/// Runs `work` on `threads` slices of `items` at once; the results, in order.
fn per_thread<T: Sync, R: Send>(threads: usize, items: &[T], work: impl Fn(&[T]) -> Vec<R> + Sync) -> Vec<R> {
    let chunk = items.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = items.chunks(chunk).map(|part| s.spawn(|| work(part))).collect();
        parts.into_iter().flat_map(|p| p.join().unwrap()).collect()
    })
}

fn per_thread_mut<T: Send, R: Send>(threads: usize, items: &mut [T], work: impl Fn(&mut [T]) -> R + Sync) -> Vec<R> {
    let chunk = items.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = items.chunks_mut(chunk).map(|part| s.spawn(|| work(part))).collect();
        parts.into_iter().map(|p| p.join().unwrap()).collect()
    })
}

fn main() {
    let threads: usize = std::env::var("KVINDEX_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
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

    // Exported `KVINDEX_BENCH_EXPORTS` times (default 1); the median is reported.
    let rounds: usize = std::env::var("KVINDEX_BENCH_EXPORTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    let names = index.pod_names();
    let mut timings = Vec::new();
    let mut exports: Vec<kvindex::PodExport> = Vec::new();
    for _ in 0..rounds {
        drop(std::mem::take(&mut exports));
        let (t, c) = (Instant::now(), cpu_s());
        exports = per_thread(threads, &names, |part| part.iter().filter_map(|p| index.export_pod(p)).collect());
        timings.push((t.elapsed().as_secs_f64(), cpu_s() - c));
    }
    if rounds > 1 {
        println!(
            "exports: {}",
            timings.iter().map(|(s, c)| format!("{s:.2}s ({c:.2} CPU s)")).collect::<Vec<_>>().join(", ")
        );
    }
    timings.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (export_s, export_cpu) = timings[rounds / 2];
    let records: Vec<StreamRecord> =
        exports.into_iter().map(|e| StreamRecord::new(&e.pod.clone(), 0, 1000, e)).collect();
    let residencies: u64 = records.iter().map(StreamRecord::residencies).sum();
    let dir = tempfile::tempdir().unwrap();
    let db = Store::open(SnapshotDir::claim(dir.path()).unwrap().into()).unwrap();
    let (t, c) = (Instant::now(), cpu_s());
    let puts: Vec<(String, Vec<u8>)> = records.iter().map(|r| (r.key(), format::encode_record(r))).collect();
    let header = Header {
        recipe_version: kvindex::keys::RECIPE_VERSION,
        block_size: 16,
        created_unix_ms: 0,
        residencies,
        streams: puts.iter().map(|(k, v)| (k.clone(), format::checksum_of(v).unwrap())).collect(),
        generation: 0,
        generations: Vec::new(),
    };
    db.save(&header, &puts, &[]).unwrap();
    let (save_s, save_cpu) = (t.elapsed().as_secs_f64(), cpu_s() - c);
    println!(
        "snapshot ({threads} threads): export {export_s:.2}s ({export_cpu:.2} CPU s), encode+write+flush {save_s:.2}s ({save_cpu:.2} CPU s), {residencies} residencies, {:.1} MB on disk ({:.2} B/residency)",
        dir_bytes(dir.path()) as f64 / 1e6,
        dir_bytes(dir.path()) as f64 / residencies as f64
    );
    // Steady state: every pod moved, so each periodic snapshot rewrites every record, and
    // RocksDB compacts behind it.
    let resaves: u32 = std::env::var("KVINDEX_BENCH_RESAVES").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    let (t, c) = (Instant::now(), cpu_s());
    let (mut save_wall, mut encode_cpu) = (Vec::new(), 0.0);
    // As the server writes them: each record put on its own under the snapshot's generation,
    // then the header and the deletes of the records it replaces in one commit.
    let mut previous: Vec<String> = puts.iter().map(|(k, _)| k.clone()).collect();
    drop(puts);
    for generation in 1..=resaves as u64 {
        let t = Instant::now();
        let mut streams = Vec::with_capacity(records.len());
        let mut stored = Vec::with_capacity(records.len());
        for r in &records {
            let c = cpu_s();
            let value = format::encode_record(r);
            encode_cpu += cpu_s() - c;
            let key = format::record_key(generation, &r.key());
            db.put(&key, &value).unwrap();
            streams.push((r.key(), format::checksum_of(&value).unwrap()));
            stored.push(key);
        }
        let header = Header { generation, generations: vec![generation; streams.len()], streams, ..header.clone() };
        let mut batch = kvindex_server::persist::snapshot::store::SnapshotBatch::default();
        for key in std::mem::replace(&mut previous, stored) {
            batch.delete(&key);
        }
        db.commit(batch, &header).unwrap();
        save_wall.push(t.elapsed().as_secs_f64());
    }
    let writes_s = t.elapsed().as_secs_f64();
    while db.background_busy() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (resave_s, resave_cpu) = (t.elapsed().as_secs_f64(), cpu_s() - c);
    if resaves > 0 {
        println!(
            "steady snapshots: {resaves} rewrites of every record, each {} s; with RocksDB's flushes and compactions {:.2} s wall ({:.2} s writing), {:.2} CPU s per snapshot ({:.2} of it encoding), {:.1} MB on disk after",
            save_wall.iter().map(|s| format!("{s:.2}")).collect::<Vec<_>>().join("/"),
            resave_s,
            writes_s,
            resave_cpu / resaves as f64,
            encode_cpu / resaves as f64,
            dir_bytes(dir.path()) as f64 / 1e6
        );
    }
    drop(db);
    drop(records);
    drop(index);

    let (t, c) = (Instant::now(), cpu_s());
    let db = Store::open(SnapshotDir::claim(dir.path()).unwrap().into()).unwrap();
    let loaded = db.load(kvindex::keys::RECIPE_VERSION, 16).unwrap().unwrap();
    let (load_s, load_cpu) = (t.elapsed().as_secs_f64(), cpu_s() - c);
    let (t, c) = (Instant::now(), cpu_s());
    let restored = KvIndex::new(config);
    let mut streams: Vec<Option<StreamRecord>> = loaded.streams.into_iter().map(Some).collect();
    let refused: u64 = per_thread_mut(threads, &mut streams, |part| {
        part.iter_mut().filter_map(Option::take).map(|r| restored.import_pod(&r.into_export()).refused).sum::<u64>()
    })
    .into_iter()
    .sum();
    let (import_s, import_cpu) = (t.elapsed().as_secs_f64(), cpu_s() - c);
    assert_eq!(refused, 0);
    println!(
        "restore ({threads} threads): open+read+verify {load_s:.2}s ({load_cpu:.2} CPU s), import {import_s:.2}s ({import_cpu:.2} CPU s), total {:.2}s ({:.2} CPU s); {} entries back",
        load_s + import_s,
        load_cpu + import_cpu,
        restored.table().entries()
    );
}
