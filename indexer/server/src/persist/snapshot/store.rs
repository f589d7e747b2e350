//! The snapshot's RocksDB: one header key and one key per stream record, named by the
//! generation of the snapshot that wrote it (`format::record_key`). A snapshot puts the
//! records of the streams that moved under its new generation as they are exported
//! ([`Store::put`]), then replaces the header and deletes the records it supersedes and those
//! of streams that are gone, in one atomic write batch ([`Store::commit`]), so a reader sees
//! one snapshot or the previous one, never a mix: records of a generation no header lists are
//! left over from a snapshot that never committed, and are not loaded.
//!
//! RocksDB checksums its own blocks; our values carry their own (see [`super::format`]), and the
//! header lists every stream record with its checksum, so a store that lost records, holds one
//! it should not, was damaged, or was written by another format or key recipe is refused as a
//! whole.
//!
//! The directory is the operator's ([`SnapshotDir`]): claimed with a lock held as long as the
//! store is open, so a second kvindex on the same directory (a rolling update on a shared
//! volume) fails at start instead of replacing the first one's live store, and refused only
//! ever by deleting the files RocksDB and kvindex themselves write in it. A directory holding
//! anything else is not used at all.

use std::collections::HashMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{Env, Options, WriteBatch, WriteOptions, DB};

use super::format::{self, FormatError, Header, StreamRecord};

const HEADER_KEY: &[u8] = b"header";
/// Version-5 records, under their stream keys.
const STREAM_PREFIX: &[u8] = b"stream/";
/// A memtable's size (see `options`).
const WRITE_BUFFER_BYTES: usize = 32 << 20;

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

/// Why the snapshot directory cannot be used. The server does not start: unlike a refused
/// snapshot, nothing here may be deleted or overwritten to start clean.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error(
        "{dir}: another kvindex holds this snapshot directory ({lock} is locked by another process); \
         nothing in it was touched. Give each server its own snapshot_dir"
    )]
    Held { dir: String, lock: String },
    #[error(
        "{dir} holds {names}, which kvindex did not write: it deletes only its own files and does not \
         share the directory. Move them out, or give snapshot_dir a directory of its own"
    )]
    Foreign { dir: String, names: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Why a refused store could not be replaced by an empty one. The server does not start.
#[derive(Debug, thiserror::Error)]
pub enum RecreateError {
    #[error(transparent)]
    Lock(#[from] DirError),
    #[error("{path}: another process opened the store since start; not removing it")]
    Reopened { path: String },
    #[error("{path}: {source}")]
    List { path: String, source: std::io::Error },
    #[error("cannot remove {path}: {source}")]
    Remove { path: String, source: std::io::Error },
    #[error(transparent)]
    Open(#[from] LoadError),
}

/// The lock file kvindex holds in the snapshot directory while its store is open.
pub const LOCK_FILE: &str = "kvindex.lock";

/// What a fresh ext4 volume's root holds: left alone, neither foreign nor ever deleted.
const LOST_AND_FOUND: &str = "lost+found";

/// Whether `name` is one RocksDB writes in its directory (RocksDB's `ParseFileName`: the
/// fixed names, the info logs, numbered manifests and options files, and numbered table,
/// log, blob and temporary files).
fn written_by_rocksdb(name: &str) -> bool {
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if matches!(name, "CURRENT" | "IDENTITY" | "LOCK" | "LOG") || name.starts_with("LOG.old.") {
        return true;
    }
    if let Some(rest) = ["MANIFEST-", "OPTIONS-", "METADB-"].iter().find_map(|p| name.strip_prefix(p)) {
        return number(rest.strip_suffix(".dbtmp").unwrap_or(rest));
    }
    let name = name.strip_suffix(".trash").unwrap_or(name);
    name.split_once('.').is_some_and(|(n, ext)| number(n) && matches!(ext, "sst" | "ldb" | "log" | "blob" | "dbtmp"))
}

/// The entries of `dir` neither RocksDB nor kvindex wrote (a link counts, whatever its name),
/// sorted by name.
fn foreign_entries(dir: &Path) -> Result<Vec<String>, DirError> {
    let io = |source| DirError::Io { path: dir.display().to_string(), source };
    let mut foreign = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let kind = entry.file_type().map_err(io)?;
        let name = entry.file_name();
        let ours = match name.to_str() {
            Some(LOCK_FILE) => kind.is_file(),
            Some(LOST_AND_FOUND) => kind.is_dir(),
            Some(n) => kind.is_file() && written_by_rocksdb(n),
            None => false,
        };
        if !ours {
            foreign.push(format!("{:?}", name.to_string_lossy()));
        }
    }
    foreign.sort_unstable();
    Ok(foreign)
}

/// Whether another process holds RocksDB's own lock on `lock` (RocksDB takes a POSIX write
/// lock on the whole file while a database is open): a kvindex from before [`LOCK_FILE`], or
/// any other RocksDB user. Tested, never taken: an open-file-description lock query, so
/// closing the file releases nothing this process holds.
fn rocksdb_lock_held(lock: &Path) -> Result<bool, DirError> {
    let io = |source| DirError::Io { path: lock.display().to_string(), source };
    let file = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(lock) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(e)),
    };
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct; the fields that
    // matter are set below.
    let mut query: libc::flock = unsafe { std::mem::zeroed() };
    query.l_type = libc::F_WRLCK as _;
    query.l_whence = libc::SEEK_SET as _;
    #[cfg(target_os = "linux")]
    let cmd = libc::F_OFD_GETLK;
    #[cfg(not(target_os = "linux"))]
    let cmd = libc::F_GETLK;
    use std::os::fd::AsRawFd;
    // SAFETY: `file` is open for the duration of the call and `query` is a valid `flock`.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut query) } != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    Ok(i32::from(query.l_type) != libc::F_UNLCK)
}

/// Refuses `dir` when it holds a file neither RocksDB nor kvindex wrote. Reads only.
fn check_foreign(dir: &Path) -> Result<(), DirError> {
    let foreign = foreign_entries(dir)?;
    if foreign.is_empty() {
        return Ok(());
    }
    const SHOWN: usize = 8;
    let mut names = foreign.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if foreign.len() > SHOWN {
        names.push_str(&format!(" and {} more", foreign.len() - SHOWN));
    }
    Err(DirError::Foreign { dir: dir.display().to_string(), names })
}

/// Refuses `dir` when another process holds RocksDB's own lock in it. Reads only.
fn check_rocksdb_lock(dir: &Path) -> Result<(), DirError> {
    let rocksdb_lock = dir.join("LOCK");
    if rocksdb_lock_held(&rocksdb_lock)? {
        return Err(DirError::Held { dir: dir.display().to_string(), lock: rocksdb_lock.display().to_string() });
    }
    Ok(())
}

/// [`LOCK_FILE`], opened (never through a link); created only when `create`.
fn open_lock(path: &Path, create: bool) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).create(create).truncate(false).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Locks `lock` (`flock`, exclusive) or says who holds it.
fn take_lock(dir: &Path, path: &Path, lock: &File) -> Result<(), DirError> {
    match lock.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => {
            Err(DirError::Held { dir: dir.display().to_string(), lock: path.display().to_string() })
        }
        Err(TryLockError::Error(source)) => Err(DirError::Io { path: path.display().to_string(), source }),
    }
}

/// The snapshot directory, claimed by this process: its [`LOCK_FILE`] locked (`flock`) for as
/// long as this value lives (the store keeps it), and checked to hold nothing but what
/// RocksDB and kvindex write (and an empty volume's `lost+found`).
#[derive(Debug)]
pub struct SnapshotDir {
    path: PathBuf,
    _lock: File,
}

impl SnapshotDir {
    /// Creates `dir` if need be (a symlink to a directory is used as it is, never replaced)
    /// and claims it. Refused, with nothing touched, when another process holds it (our lock
    /// file, or RocksDB's own lock) or when it holds a file kvindex did not write. The checks
    /// come before [`LOCK_FILE`] is created, so a refused directory (or a symlink's target)
    /// does not get one either; a lock file this call creates is checked for again once held,
    /// against a process that claimed the directory in between.
    pub fn claim(dir: &Path) -> Result<SnapshotDir, DirError> {
        std::fs::create_dir_all(dir).map_err(|source| DirError::Io { path: dir.display().to_string(), source })?;
        let lock_path = dir.join(LOCK_FILE);
        let io = |source| DirError::Io { path: lock_path.display().to_string(), source };
        check_foreign(dir)?;
        let lock = match open_lock(&lock_path, false) {
            Ok(lock) => {
                take_lock(dir, &lock_path, &lock)?;
                check_rocksdb_lock(dir)?;
                lock
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                check_rocksdb_lock(dir)?;
                let lock = open_lock(&lock_path, true).map_err(io)?;
                take_lock(dir, &lock_path, &lock)?;
                check_foreign(dir)?;
                check_rocksdb_lock(dir)?;
                lock
            }
            Err(e) => return Err(io(e)),
        };
        Ok(SnapshotDir { path: dir.to_path_buf(), _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A loaded snapshot.
#[derive(Debug)]
pub struct Loaded {
    pub header: Header,
    pub streams: Vec<StreamRecord>,
    /// Records of a later snapshot that never committed its header (a crash while it was
    /// written): not loaded, deleted by the next snapshot.
    pub leftovers: Vec<String>,
    /// The highest generation the store holds a record or header of: the next snapshot's is
    /// above it.
    pub generation: u64,
}

pub struct Store {
    // Dropped (closed) before the claim on its directory is let go.
    db: DB,
    dir: Arc<SnapshotDir>,
}

/// Records at least this large live in blob files, not in the LSM tree's tables.
const MIN_BLOB_BYTES: u64 = 4096;

fn options() -> Options {
    let mut o = Options::default();
    o.create_if_missing(true);
    o.set_paranoid_checks(true);
    // A snapshot rewrites most of its large records: kept in blob files, a flush writes each
    // once, sequentially, and compactions move only keys and blob references instead of
    // rewriting every record again and again; old blob files go once no key refers to them
    // (blob garbage collection relocates the few records of the oldest files still live).
    // Block keys and engine hashes are random 64-bit numbers: compressing them costs CPU and
    // saves nothing.
    o.set_enable_blob_files(true);
    o.set_min_blob_size(MIN_BLOB_BYTES);
    o.set_enable_blob_gc(true);
    o.set_blob_compression_type(rocksdb::DBCompressionType::None);
    o.set_compression_type(rocksdb::DBCompressionType::None);
    // Records stream in while a snapshot is exported (`Store::put`): at most this many
    // memtables of this size are held before RocksDB makes the writer wait for a flush, which
    // bounds the memory a snapshot adds, however large the index.
    o.set_write_buffer_size(WRITE_BUFFER_BYTES);
    o.set_max_write_buffer_number(2);
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
    /// Opens (or creates) the store in the claimed `dir`.
    pub fn open(dir: Arc<SnapshotDir>) -> Result<Store, LoadError> {
        let db = DB::open(&options(), dir.path()).map_err(|e| LoadError::Open(e.to_string()))?;
        Ok(Store { db, dir })
    }

    /// Deletes the files of a refused store in `dir` (those RocksDB writes; nothing else, and
    /// never the directory, which may be a mount point or a symlink) and opens an empty store.
    pub fn recreate(dir: Arc<SnapshotDir>) -> Result<Store, RecreateError> {
        let path = dir.path();
        if rocksdb_lock_held(&path.join("LOCK"))? {
            return Err(RecreateError::Reopened { path: path.display().to_string() });
        }
        let list = |source| RecreateError::List { path: path.display().to_string(), source };
        for entry in std::fs::read_dir(path).map_err(list)? {
            let entry = entry.map_err(list)?;
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            if is_file && entry.file_name().to_str().is_some_and(written_by_rocksdb) {
                std::fs::remove_file(entry.path())
                    .map_err(|source| RecreateError::Remove { path: entry.path().display().to_string(), source })?;
            }
        }
        Ok(Store::open(dir)?)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
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
        let listed: HashMap<String, u64> = header.record_keys().map(|(stored, _, sum)| (stored, sum)).collect();
        let expected = header.streams.len() as u64;
        if listed.len() as u64 != expected
            || (!header.generations.is_empty() && header.generations.len() != header.streams.len())
        {
            return Err(LoadError::Format {
                key: "header".into(),
                source: FormatError::Decode(
                    "a stream listed twice, or generations that do not match the streams".into(),
                ),
            });
        }
        let mut values = Vec::with_capacity(header.streams.len());
        let (mut leftovers, mut generation) = (Vec::new(), header.generation);
        for prefix in [STREAM_PREFIX, format::RECORD_PREFIX.as_bytes()] {
            for item in self.db.prefix_iterator(prefix) {
                let (key, value) = item.map_err(|e| LoadError::Read(e.to_string()))?;
                if !key.starts_with(prefix) {
                    break;
                }
                let name = String::from_utf8_lossy(&key);
                match listed.get(name.as_ref()) {
                    // Only the records the header lists, each with the checksum it was listed with.
                    Some(&sum) if format::checksum_of(&value) == Some(sum) => values.push((key, value)),
                    // A record of a later snapshot whose header never came: not this snapshot's.
                    None if format::record_generation(&key).is_some_and(|g| g > header.generation) => {
                        generation = generation.max(format::record_generation(&key).unwrap_or(0));
                        leftovers.push(name.into_owned());
                    }
                    // Listed with another checksum, or unlisted though as old as the header:
                    // this snapshot should have deleted it.
                    _ => return Err(LoadError::Stray { key: name.into_owned() }),
                }
            }
        }
        if values.len() as u64 != expected {
            return Err(LoadError::Truncated { expected, found: values.len() as u64 });
        }
        let streams = decode_all(&values)?;
        Ok(Some(Loaded { header, streams, leftovers, generation }))
    }

    /// Writes one record of a snapshot being taken, under a key no committed header lists
    /// ([`format::record_key`] of the new generation): nothing the stored snapshot holds
    /// changes until [`commit`](Self::commit) writes the header that lists it. Skips the
    /// write-ahead log as `save` does; the commit's flush puts it on disk.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), rocksdb::Error> {
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        self.db.put_opt(key.as_bytes(), value, &opts)
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
        let export = PodExport {
            pod: pod.into(),
            model: "m".into(),
            tiers: vec!["GPU".into()],
            blocks,
            groups: vec![],
            units: vec![],
        };
        StreamRecord::new(pod, 0, cursor, export)
    }

    /// Writes `records` and deletes `deletes` as one snapshot whose header lists `listed`.
    fn save(store: &Store, listed: &[&StreamRecord], records: &[&StreamRecord], deletes: &[&str]) {
        let puts: Vec<(String, Vec<u8>)> = records.iter().map(|r| (r.key(), format::encode_record(r))).collect();
        let streams =
            listed.iter().map(|r| (r.key(), format::checksum_of(&format::encode_record(r)).unwrap())).collect();
        let header = Header {
            recipe_version: 1,
            block_size: 16,
            created_unix_ms: 1,
            residencies: 1,
            streams,
            generation: 0,
            generations: Vec::new(),
        };
        let deletes: Vec<String> = deletes.iter().map(|d| format::stream_key(d, 0)).collect();
        store.save(&header, &puts, &deletes).unwrap();
    }

    fn open(dir: &Path) -> Store {
        Store::open(Arc::new(SnapshotDir::claim(dir).unwrap())).unwrap()
    }

    #[test]
    fn a_snapshot_rewrites_what_moved_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        assert!(store.load(1, 16).unwrap().is_none());
        let (a, b, c) = (record("a", 1), record("b", 1), record("c", 1));
        save(&store, &[&a, &b, &c], &[&a, &b, &c], &[]);
        // b moved, c is gone, a stays as it was stored.
        let b2 = record("b", 2);
        save(&store, &[&a, &b2], &[&b2], &["c"]);
        drop(store);
        let store = open(dir.path());
        let mut loaded = store.load(1, 16).unwrap().unwrap().streams;
        loaded.sort_by(|x, y| x.base.cmp(&y.base));
        assert_eq!(loaded, vec![a.clone(), b2]);
        assert!(matches!(store.load(2, 16), Err(LoadError::Recipe { found: 1, expected: 2 })));
        assert!(matches!(store.load(1, 32), Err(LoadError::BlockSize { .. })));
    }

    #[test]
    fn records_the_header_does_not_list_as_stored_refuse_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
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

    /// Records written by a snapshot whose header never came (a crash mid-snapshot) are not
    /// loaded and do not refuse the snapshot; a record the committed header should have
    /// deleted (as old as the header, unlisted) does.
    #[test]
    fn records_of_an_uncommitted_generation_are_left_over_not_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let (a, b) = (record("a", 1), record("b", 1));
        let (va, vb) = (format::encode_record(&a), format::encode_record(&b));
        store.put(&format::record_key(3, &a.key()), &va).unwrap();
        store.put(&format::record_key(3, &b.key()), &vb).unwrap();
        let header = Header {
            recipe_version: 1,
            block_size: 16,
            created_unix_ms: 1,
            residencies: 2,
            streams: vec![(a.key(), format::checksum_of(&va).unwrap()), (b.key(), format::checksum_of(&vb).unwrap())],
            generation: 3,
            generations: vec![3, 3],
        };
        store.commit(SnapshotBatch::default(), &header).unwrap();
        // Generation 4 rewrites a and is cut off before its header.
        let a2 = record("a", 2);
        store.put(&format::record_key(4, &a2.key()), &format::encode_record(&a2)).unwrap();
        store.db.flush().unwrap();
        drop(store);
        let store = open(dir.path());
        let loaded = store.load(1, 16).unwrap().unwrap();
        let mut streams = loaded.streams;
        streams.sort_by(|x, y| x.base.cmp(&y.base));
        assert_eq!(streams, vec![a.clone(), b.clone()], "generation 3, whole");
        assert_eq!(loaded.leftovers, vec![format::record_key(4, &a2.key())]);
        assert_eq!(loaded.generation, 4, "the next snapshot writes above the leftover");
        // A record of generation 2, which generation 3's commit deleted: its presence means
        // the store is not the snapshot its header says.
        store.put(&format::record_key(2, &a.key()), &va).unwrap();
        assert!(matches!(store.load(1, 16), Err(LoadError::Stray { .. })));
    }

    #[test]
    fn rocksdb_file_names_are_told_from_others() {
        for name in [
            "CURRENT",
            "IDENTITY",
            "LOCK",
            "LOG",
            "LOG.old.1733112000123456",
            "MANIFEST-000005",
            "OPTIONS-000007",
            "OPTIONS-000009.dbtmp",
            "000012.sst",
            "000013.log",
            "000014.blob",
            "000015.dbtmp",
            "000016.sst.trash",
        ] {
            assert!(written_by_rocksdb(name), "{name}");
        }
        for name in [
            "notes.txt",
            "CURRENT.bak",
            "MANIFEST-",
            "MANIFEST-x",
            "backup.sst",
            "12.txt",
            ".sst",
            "LOCK2",
            "",
            "kvindex.lock",
        ] {
            assert!(!written_by_rocksdb(name), "{name}");
        }
    }

    #[test]
    fn a_directory_with_a_foreign_file_is_refused_and_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path()));
        std::fs::write(dir.path().join("notes.txt"), "the operator's").unwrap();
        std::fs::create_dir(dir.path().join("backup")).unwrap();
        let before = listing(dir.path());
        let e = SnapshotDir::claim(dir.path()).unwrap_err();
        assert!(matches!(e, DirError::Foreign { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("\"notes.txt\"") && msg.contains("\"backup\""), "{msg}");
        assert!(!msg.contains("CURRENT"), "RocksDB's files are not foreign: {msg}");
        assert_eq!(listing(dir.path()), before);
        assert_eq!(std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(), "the operator's");
    }

    #[test]
    fn a_refused_directory_gets_no_lock_file_nor_does_a_links_target() {
        let root = tempfile::tempdir().unwrap();
        let (real, link) = (root.path().join("real"), root.path().join("link"));
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("notes.txt"), "the operator's").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        for dir in [&real, &link] {
            let e = SnapshotDir::claim(dir).unwrap_err();
            assert!(matches!(e, DirError::Foreign { .. }), "{e}");
            assert_eq!(listing(&real), ["notes.txt"], "refused through {dir:?}: nothing written");
        }
        // Held by another RocksDB user (RocksDB's own lock, no kvindex lock file): the same.
        let held = root.path().join("held");
        let db = DB::open(&options(), &held).unwrap();
        let before = listing(&held);
        assert!(!before.contains(&LOCK_FILE.to_string()));
        let e = SnapshotDir::claim(&held).unwrap_err();
        assert!(matches!(&e, DirError::Held { lock, .. } if lock.ends_with("/LOCK")), "{e}");
        assert_eq!(listing(&held), before, "nothing written into a held directory");
        drop(db);
        SnapshotDir::claim(&held).expect("free once the other lets go");
        assert!(held.join(LOCK_FILE).is_file(), "a claimed directory gets its lock file");
    }

    #[test]
    fn a_claimed_directory_cannot_be_claimed_twice() {
        let dir = tempfile::tempdir().unwrap();
        let first = SnapshotDir::claim(dir.path()).unwrap();
        let e = SnapshotDir::claim(dir.path()).unwrap_err();
        assert!(matches!(&e, DirError::Held { lock, .. } if lock.ends_with(LOCK_FILE)), "{e}");
        assert!(e.to_string().contains("another kvindex holds"), "{e}");
        drop(first);
        SnapshotDir::claim(dir.path()).expect("free again once the first lets go");
    }

    #[test]
    fn recreating_through_a_symlink_deletes_only_rocksdb_files_and_keeps_the_link() {
        let root = tempfile::tempdir().unwrap();
        let (real, link) = (root.path().join("real"), root.path().join("link"));
        std::fs::create_dir(&real).unwrap();
        std::fs::create_dir(real.join(LOST_AND_FOUND)).unwrap();
        std::fs::write(real.join(LOST_AND_FOUND).join("#1234"), "fsck's").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let store = open(&link);
        let a = record("a", 1);
        save(&store, &[&a], &[&a], &[]);
        drop(store);
        let claimed = Arc::new(SnapshotDir::claim(&link).unwrap());
        let store = Store::recreate(claimed).unwrap();
        assert!(store.load(1, 16).unwrap().is_none(), "the refused snapshot is gone");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is still a link");
        assert_eq!(std::fs::read_to_string(real.join(LOST_AND_FOUND).join("#1234")).unwrap(), "fsck's");
        assert!(real.join("CURRENT").is_file(), "the new store lives in the link's target");
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }
}
