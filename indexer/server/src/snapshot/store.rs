//! The snapshot's RocksDB: one header key and one key per stream, replaced whole by one
//! atomic write batch, so a reader sees one snapshot or the previous one, never a mix.
//!
//! RocksDB checksums its own blocks; our values carry their own (see [`super::format`]), and the
//! header says how many stream records it was written with, so a store that lost records, was
//! damaged, or was written by another format or key recipe is refused as a whole.

use std::path::{Path, PathBuf};

use rocksdb::{Options, WriteBatch, WriteOptions, DB};

#[cfg(test)]
use super::format::BlockRecord;
use super::format::{self, FormatError, Header, StreamRecord};

const HEADER_KEY: &[u8] = b"header";
const STREAM_PREFIX: &[u8] = b"stream/";
const STREAM_END: &[u8] = b"stream0"; // '0' follows '/'

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
        let mut values = Vec::new();
        for item in self.db.prefix_iterator(STREAM_PREFIX) {
            let (key, value) = item.map_err(|e| LoadError::Read(e.to_string()))?;
            if !key.starts_with(STREAM_PREFIX) {
                break;
            }
            values.push((key, value));
        }
        let streams = decode_all(&values)?;
        if streams.len() as u64 != header.streams {
            return Err(LoadError::Truncated { expected: header.streams, found: streams.len() as u64 });
        }
        Ok(Some(Loaded { header, streams }))
    }

    /// Replaces the stored snapshot with `streams` in one atomic write; returns bytes written.
    pub fn save(&self, header: &Header, streams: &[StreamRecord], sync: bool) -> Result<u64, rocksdb::Error> {
        let mut batch = WriteBatch::default();
        batch.delete_range(STREAM_PREFIX, STREAM_END);
        let mut bytes = 0u64;
        for (i, s) in streams.iter().enumerate() {
            // Numbered, not named: pod names are peer-chosen strings, and the order is ours.
            let key = [STREAM_PREFIX, format!("{i:010}").as_bytes()].concat();
            let value = format::encode(s);
            bytes += value.len() as u64;
            batch.put(key, value);
        }
        let value = format::encode(header);
        bytes += value.len() as u64;
        batch.put(HEADER_KEY, value);
        let mut opts = WriteOptions::default();
        opts.set_sync(sync);
        self.db.write_opt(batch, &opts)?;
        Ok(bytes)
    }

    /// Flushes memtables to files (graceful shutdown), so the next start reads no WAL.
    pub fn flush(&self) -> Result<(), rocksdb::Error> {
        self.db.flush()
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
                            format::decode(value).map_err(|source| LoadError::Format {
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

    fn header(streams: u64) -> Header {
        Header { recipe_version: 1, block_size: 16, created_unix_ms: 1, streams, residencies: 2 }
    }

    fn record(pod: &str) -> StreamRecord {
        StreamRecord {
            base: pod.into(),
            rank: 0,
            pod: pod.into(),
            model: "m".into(),
            cursor: 3,
            tiers: vec!["GPU".into()],
            blocks: vec![BlockRecord { engine: 5, root: Some(7), parent: None, path: vec![], keys: vec![(10, 1)] }],
            groups: vec![],
        }
    }

    #[test]
    fn saves_replace_the_previous_snapshot_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.load(1, 16).unwrap().is_none());
        store.save(&header(2), &[record("a"), record("b")], false).unwrap();
        store.save(&header(1), &[record("c")], true).unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        let loaded = store.load(1, 16).unwrap().unwrap();
        assert_eq!(loaded.streams, vec![record("c")]);
        assert!(matches!(store.load(2, 16), Err(LoadError::Recipe { found: 1, expected: 2 })));
        assert!(matches!(store.load(1, 32), Err(LoadError::BlockSize { .. })));
    }

    #[test]
    fn a_header_promising_more_streams_than_stored_is_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.save(&header(3), &[record("a")], false).unwrap();
        assert!(matches!(store.load(1, 16), Err(LoadError::Truncated { expected: 3, found: 1 })));
    }
}
