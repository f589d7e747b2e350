//! The snapshot's RocksDB: one header key and one key per stream. A snapshot rewrites the
//! records of the streams that moved, deletes those of streams that are gone and replaces the
//! header, in one atomic write batch, so a reader sees one snapshot or the previous one, never
//! a mix.
//!
//! RocksDB checksums its own blocks; our values carry their own (see [`super::format`]), and the
//! header lists every stream record with its checksum, so a store that lost records, holds one
//! it should not, was damaged, or was written by another format or key recipe is refused as a
//! whole.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rocksdb::{Env, Options, WriteBatch, WriteOptions, DB};

use super::format::{self, FormatError, Header, StreamRecord};

const HEADER_KEY: &[u8] = b"header";
const STREAM_PREFIX: &[u8] = b"stream/";

/// Why a stored snapshot was not loaded. The service then starts clean.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot open the snapshot store: {0}")]
    Open(String),
    #[error("cannot read the snapshot store: {0}")]
    Read(String),
    #[error("snapshot {key}: {source}")]
    Format { key: String, source: FormatError },
    #[error("snapshot made with key recipe {found}, this build uses {expected}")]
    Recipe { found: u32, expected: u32 },
    #[error("snapshot made with block size {found}, the index uses {expected}")]
    BlockSize { found: u64, expected: u64 },
    #[error("snapshot truncated: header says {expected} streams, found {found}")]
    Truncated { expected: u64, found: u64 },
    #[error("snapshot record {key} is not one its header lists")]
    Stray { key: String },
}

impl LoadError {
    /// Stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LoadError::Open(_) => "open",
            LoadError::Read(_) => "read",
            LoadError::Format { source, .. } => source.label(),
            LoadError::Recipe { .. } => "recipe",
            LoadError::BlockSize { .. } => "block_size",
            LoadError::Truncated { .. } => "truncated",
            LoadError::Stray { .. } => "stray",
        }
    }
}

/// A loaded snapshot.
#[derive(Debug)]
pub struct Loaded {
    pub header: Header,
    pub streams: Vec<StreamRecord>,
}

pub struct Store {
    db: DB,
    path: PathBuf,
}

fn options() -> Options {
    let mut o = Options::default();
    o.create_if_missing(true);
    o.set_paranoid_checks(true);
    // RocksDB's flushes and compactions are a snapshot's background work: below ingest in CPU
    // priority, like the snapshot pool (`pool.rs`). Without an env the defaults stand.
    if let Ok(mut env) = Env::new() {
        env.lower_thread_pool_cpu_priority();
        env.lower_high_priority_thread_pool_cpu_priority();
        o.set_env(&env);
    }
    o
}

impl Store {
    /// Opens (or creates) the store at `dir`.
    pub fn open(dir: &Path) -> Result<Store, LoadError> {
        let db = DB::open(&options(), dir).map_err(|e| LoadError::Open(e.to_string()))?;
        Ok(Store { db, path: dir.to_path_buf() })
    }

    /// Removes whatever is at `dir` (a refused snapshot) and opens an empty store there.
    pub fn recreate(dir: &Path) -> Result<Store, String> {
        if dir.exists() {
            if let Err(e) = DB::destroy(&options(), dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot destroy the snapshot store; removing it");
            }
            if dir.exists() {
                std::fs::remove_dir_all(dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
            }
        }
        Store::open(dir).map_err(|e| e.to_string())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored snapshot, `Ok(None)` when the store holds none yet.
    pub fn load(&self, recipe_version: u32, block_size: u64) -> Result<Option<Loaded>, LoadError> {
        let Some(value) = self.db.get(HEADER_KEY).map_err(|e| LoadError::Read(e.to_string()))? else {
            return Ok(None);
        };
        let header: Header =
            format::decode(&value).map_err(|source| LoadError::Format { key: "header".into(), source })?;
        if header.recipe_version != recipe_version {
            return Err(LoadError::Recipe { found: header.recipe_version, expected: recipe_version });
        }
        if header.block_size != block_size {
            return Err(LoadError::BlockSize { found: header.block_size, expected: block_size });
        }
        let listed: HashMap<&str, u64> = header.streams.iter().map(|(k, sum)| (k.as_str(), *sum)).collect();
        let expected = header.streams.len() as u64;
        if listed.len() as u64 != expected {
            return Err(LoadError::Format {
                key: "header".into(),
                source: FormatError::Decode("a stream listed twice".into()),
            });
        }
        let mut values = Vec::with_capacity(header.streams.len());
        for item in self.db.prefix_iterator(STREAM_PREFIX) {
            let (key, value) = item.map_err(|e| LoadError::Read(e.to_string()))?;
            if !key.starts_with(STREAM_PREFIX) {
                break;
            }
            // Only the records the header lists, each with the checksum it was listed with.
            let name = String::from_utf8_lossy(&key);
            if listed.get(name.as_ref()).is_none_or(|&sum| format::checksum_of(&value) != Some(sum)) {
                return Err(LoadError::Stray { key: name.into_owned() });
            }
            values.push((key, value));
        }
        if values.len() as u64 != expected {
            return Err(LoadError::Truncated { expected, found: values.len() as u64 });
        }
        let streams = decode_all(&values)?;
        Ok(Some(Loaded { header, streams }))
    }

    /// Makes the stored snapshot `header`'s, in one atomic write: `puts` (key, encoded record)
    /// are written, `deletes` removed, the records neither names stay. Returns bytes written.
    ///
    /// The write skips RocksDB's write-ahead log and is flushed to a table file before this
    /// returns, so it is on disk (synced) either way: the log would be a second full copy of
    /// every record on each snapshot (about a fifth of a 10M-entry snapshot's CPU, BENCHMARKS.md),
    /// and a snapshot left in the memtable would be lost to a kill -9. A crash mid-flush leaves
    /// the table out of the manifest: the previous snapshot, whole.
    pub fn save(&self, header: &Header, puts: &[(String, Vec<u8>)], deletes: &[String]) -> Result<u64, rocksdb::Error> {
        let mut batch = SnapshotBatch::default();
        for key in deletes {
            batch.delete(key);
        }
        for (key, value) in puts {
            batch.put(key, value);
        }
        self.commit(batch, header)
    }

    /// Writes `batch` and the header that describes the snapshot it completes, as
    /// [`save`](Self::save) does: one atomic write, on disk when this returns.
    pub fn commit(&self, batch: SnapshotBatch, header: &Header) -> Result<u64, rocksdb::Error> {
        let SnapshotBatch { mut batch, mut bytes } = batch;
        let value = format::encode(header);
        bytes += value.len() as u64;
        batch.put(HEADER_KEY, value);
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        self.db.write_opt(batch, &opts)?;
        self.db.flush()?;
        Ok(bytes)
    }

    /// Whether RocksDB still has flushes or compactions running or pending (benches wait for
    /// it, so a snapshot's cost includes the background work it causes).
    pub fn background_busy(&self) -> bool {
        [
            "rocksdb.num-running-compactions",
            "rocksdb.num-running-flushes",
            "rocksdb.compaction-pending",
            "rocksdb.mem-table-flush-pending",
        ]
        .iter()
        .any(|p| self.db.property_int_value(*p).ok().flatten().unwrap_or(0) > 0)
    }
}

/// The records of a snapshot being written, before its header: each encoded record goes
/// straight in (and its own buffer can go), so a large snapshot is not held twice, as a list
/// of encoded records and again as the batch copied from it.
#[derive(Default)]
pub struct SnapshotBatch {
    batch: WriteBatch,
    bytes: u64,
}

impl SnapshotBatch {
    pub fn put(&mut self, key: &str, value: &[u8]) {
        self.bytes += value.len() as u64;
        self.batch.put(key.as_bytes(), value);
    }

    pub fn delete(&mut self, key: &str) {
        self.batch.delete(key.as_bytes());
    }
}

/// A stored key and its value.
type KeyValue = (Box<[u8]>, Box<[u8]>);

/// Verifies and decodes stream records on every core: at ten million residencies, decoding
/// is most of a load. The first damaged record (in key order) refuses the whole snapshot.
fn decode_all(values: &[KeyValue]) -> Result<Vec<StreamRecord>, LoadError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, values.len().max(1));
    let chunk = values.len().div_ceil(threads).max(1);
    let decoded: Vec<Result<Vec<StreamRecord>, LoadError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = values
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|(key, value)| {
                            format::decode_record(value).map_err(|source| LoadError::Format {
                                key: String::from_utf8_lossy(key).into_owned(),
                                source,
                            })
                        })
                        .collect()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("decoding never panics")).collect()
    });
    let mut streams = Vec::with_capacity(values.len());
    for part in decoded {
        streams.extend(part?);
    }
    Ok(streams)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvindex::{ChainParent, EngineBlocks, PodExport};

    fn record(pod: &str, cursor: u64) -> StreamRecord {
        let mut blocks = EngineBlocks::default();
        blocks.push(5, ChainParent::Root(7), &[], &[10], &[1]).unwrap();
        let export =
            PodExport { pod: pod.into(), model: "m".into(), tiers: vec!["GPU".into()], blocks, groups: vec![] };
        StreamRecord::new(pod, 0, cursor, export)
    }

    /// Writes `records` and deletes `deletes` as one snapshot whose header lists `listed`.
    fn save(store: &Store, listed: &[&StreamRecord], records: &[&StreamRecord], deletes: &[&str]) {
        let puts: Vec<(String, Vec<u8>)> = records.iter().map(|r| (r.key(), format::encode_record(r))).collect();
        let streams =
            listed.iter().map(|r| (r.key(), format::checksum_of(&format::encode_record(r)).unwrap())).collect();
        let header = Header { recipe_version: 1, block_size: 16, created_unix_ms: 1, residencies: 1, streams };
        let deletes: Vec<String> = deletes.iter().map(|d| format::stream_key(d, 0)).collect();
        store.save(&header, &puts, &deletes).unwrap();
    }

    #[test]
    fn a_snapshot_rewrites_what_moved_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.load(1, 16).unwrap().is_none());
        let (a, b, c) = (record("a", 1), record("b", 1), record("c", 1));
        save(&store, &[&a, &b, &c], &[&a, &b, &c], &[]);
        // b moved, c is gone, a stays as it was stored.
        let b2 = record("b", 2);
        save(&store, &[&a, &b2], &[&b2], &["c"]);
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        let mut loaded = store.load(1, 16).unwrap().unwrap().streams;
        loaded.sort_by(|x, y| x.base.cmp(&y.base));
        assert_eq!(loaded, vec![a.clone(), b2]);
        assert!(matches!(store.load(2, 16), Err(LoadError::Recipe { found: 1, expected: 2 })));
        assert!(matches!(store.load(1, 32), Err(LoadError::BlockSize { .. })));
    }

    #[test]
    fn records_the_header_does_not_list_as_stored_refuse_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (a, b) = (record("a", 1), record("b", 1));
        // The header promises b; it is not there.
        save(&store, &[&a, &b], &[&a], &[]);
        assert!(matches!(store.load(1, 16), Err(LoadError::Truncated { expected: 2, found: 1 })));
        // b is there, but not the b the header lists (another snapshot's).
        let b2 = record("b", 2);
        save(&store, &[&a, &b2], &[&b], &[]);
        assert!(matches!(store.load(1, 16), Err(LoadError::Stray { .. })));
        // A record the header does not list at all.
        save(&store, &[&a], &[&b], &[]);
        assert_eq!(store.load(1, 16).map(|_| ()).unwrap_err().label(), "stray");
    }
}
