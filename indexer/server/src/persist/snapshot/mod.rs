//! Warm restarts: the index's logical content and each stream's seq cursor, persisted to an
//! embedded RocksDB ([`store`]) periodically and on graceful shutdown, and loaded at start.
//!
//! A snapshot is taken by the apply workers themselves, between two batches of each stream, so
//! every pod's residencies are exactly those of its cursor. A worker never stops for it: it
//! hands its moved pods' exports to the snapshot [`pool`] a few at a time, and only the pod
//! being exported waits (its batches queue behind the export, in order) while the worker
//! applies every other pod's. The encoding and the RocksDB write run on the same pool, whose
//! threads run below ingest's CPU priority. It is incremental: a
//! stream whose cursor and pod are where the stored record has them (`KvIndex::pod_version`)
//! keeps that record, unexported and unwritten; only the streams that moved are exported again.
//! Each exported record goes into the store at once ([`Sink`]), under the snapshot's
//! generation, which no committed header lists yet, and is let go: a snapshot holds a record
//! per pool thread and RocksDB's bounded memtables, not the whole index a second time. The
//! header that lists the new records commits them, in one atomic write with the deletes of
//! the records they replace; until then the previous snapshot stands whole.
//!
//! Loading never makes the index claim anything unproven. The loaded records wait in
//! [`Restored`]; a stream picks its pod's record up when it starts, resumes its sequencer from
//! the cursor (a replay from `cursor + 1` where the engine has a replay socket) and imports the
//! residencies only when the next batch applies, i.e. once the engine's stream has continued
//! exactly where the snapshot stopped. A replay that no longer reaches the cursor, a restarted
//! engine or any other loss clears the pod (DEGRADED) and the record is dropped. A snapshot that
//! cannot be read, fails a checksum, is truncated or was made under another format, key recipe
//! or block size is refused whole: the service starts clean, says so in one log line, counts it
//! (`kvindex_snapshot_load_errors_total`) and overwrites it with its next snapshot. The
//! directory itself is never given up that way: one another process holds, or one that holds
//! files kvindex did not write, stops the start ([`store::SnapshotDir`]).

pub mod bootstrap;
pub mod chunks;
pub mod format;
pub mod pool;
pub mod restored;
pub mod sibling_export;
pub mod store;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrics::{counter, gauge, histogram};

use self::format::{Header, StreamRecord};
use self::store::{RecreateError, SnapshotBatch, SnapshotDir, Store};
use crate::queue::captures::CaptureError;
use crate::shutdown::Shutdown;
use crate::telemetry as m;
use crate::write::context::ServiceState;

use crate::protocols::{Captured, Held, HeldMap, RecordSink};

/// The snapshot store, and what it holds now.
pub struct Snapshots {
    store: Store,
    /// Held under the lock for a whole snapshot: one snapshot at a time, each starting from
    /// what the last one left.
    held: tokio::sync::Mutex<Stored>,
}

/// What the store holds beside the committed snapshot's records.
struct Stored {
    held: HeldMap,
    /// The highest generation written (committed or not): the next snapshot's is above it.
    generation: u64,
    /// Records no header lists (of a snapshot that failed or never committed): the next
    /// commit deletes them.
    leftovers: Vec<String>,
}

impl Snapshots {
    pub fn store(&self) -> &Store {
        &self.store
    }
}

/// Where a snapshot's capture writes each record as soon as it is exported: encoded and put
/// into the store under the snapshot's generation, then let go, so a snapshot holds a few
/// records at a time instead of every one until its write ([`Store::put`]: none of them is
/// part of the stored snapshot until the header that lists them is committed).
pub struct Sink {
    snapshots: Arc<Snapshots>,
    generation: u64,
    /// Every record key written, for the snapshot to delete again if it fails.
    written: parking_lot::Mutex<Vec<String>>,
}

impl Sink {
    fn new(snapshots: Arc<Snapshots>, generation: u64) -> Self {
        Sink { snapshots, generation, written: parking_lot::Mutex::new(Vec::new()) }
    }
}

impl RecordSink for Sink {
    /// Writes stream `key`'s `record` (the pod exported at `version`).
    fn write(&self, key: String, version: Option<u64>, record: &StreamRecord) -> Captured {
        let value = format::encode_record(record);
        let stored = format::record_key(self.generation, &key);
        match self.snapshots.store.put(&stored, &value) {
            Ok(()) => {
                self.written.lock().push(stored);
                let held = Held {
                    cursor: record.cursor,
                    version,
                    checksum: format::checksum_of(&value).unwrap_or(0),
                    residencies: record.residencies(),
                    generation: self.generation,
                };
                Captured::Written { key, held, bytes: value.len() as u64 }
            }
            Err(e) => Captured::Failed { key, error: e.to_string() },
        }
    }
}

/// Opens the store in the claimed snapshot directory (`crate::bind` claims it: see
/// [`SnapshotDir::claim`]) and loads its snapshot into `state`'s [`Restored`]. Any refusal of
/// the snapshot starts clean (and recreates the store from RocksDB's files only); only an
/// unusable directory is an error.
pub fn open(state: &ServiceState, dir: Option<SnapshotDir>) -> Result<Option<Arc<Snapshots>>, RecreateError> {
    let Some(dir) = dir else { return Ok(None) };
    let dir = Arc::new(dir);
    let started = Instant::now();
    let recipe = kvindex::keys::RECIPE_VERSION;
    let block_size = state.config().block_size as u64;
    let opened = Store::open(dir.clone()).and_then(|s| s.load(recipe, block_size).map(|l| (s, l)));
    let mut held = HeldMap::new();
    let (mut generation, mut leftovers) = (0, Vec::new());
    let store = match opened {
        Ok((store, Some(loaded))) => {
            let streams = loaded.streams.len();
            let residencies = loaded.header.residencies;
            let listed: HashMap<&str, (u64, u64)> = loaded
                .header
                .streams
                .iter()
                .enumerate()
                .map(|(i, (k, sum))| (k.as_str(), (*sum, loaded.header.generations.get(i).copied().unwrap_or(0))))
                .collect();
            for r in &loaded.streams {
                let key = r.key();
                let (checksum, generation) = listed.get(key.as_str()).copied().unwrap_or((0, 0));
                let residencies = r.residencies();
                held.insert(key, Held { cursor: r.cursor, version: None, checksum, residencies, generation });
            }
            (generation, leftovers) = (loaded.generation, loaded.leftovers);
            state.restored().fill(loaded.streams);
            counter!(m::SNAPSHOT_LOADS, "outcome" => "loaded").increment(1);
            histogram!(m::SNAPSHOT_LOAD_SECONDS).record(started.elapsed().as_secs_f64());
            tracing::info!(
                dir = %dir.path().display(),
                streams,
                residencies,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "snapshot loaded: pods come back as their streams continue from the snapshot's cursors"
            );
            store
        }
        Ok((store, None)) => {
            counter!(m::SNAPSHOT_LOADS, "outcome" => "empty").increment(1);
            tracing::info!(dir = %dir.path().display(), "no snapshot yet: starting clean");
            store
        }
        Err(e) => {
            counter!(m::SNAPSHOT_LOADS, "outcome" => "refused").increment(1);
            counter!(m::SNAPSHOT_LOAD_ERRORS, "reason" => e.label()).increment(1);
            tracing::error!(dir = %dir.path().display(), error = %e, "snapshot refused: starting clean");
            Store::recreate(dir)?
        }
    };
    let stored = Stored { held, generation, leftovers };
    Ok(Some(Arc::new(Snapshots { store, held: tokio::sync::Mutex::new(stored) })))
}

/// Why a snapshot was not taken: the stored one stays, and the next snapshot tries again.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    /// The workers' capture failed (a worker is gone or stopped: the service is stopping).
    #[error("{0}")]
    Capture(#[from] CaptureError),
    #[error("the snapshot write stopped (a panic, see the log)")]
    WriteStopped,
    /// A stream's record could not be encoded or written.
    #[error("{key}: {error}")]
    Record { key: String, error: String },
    #[error("{0}")]
    Commit(#[from] rocksdb::Error),
}

/// Takes a snapshot now: every worker exports the streams that moved since the stored
/// snapshot and writes their records into the store as they come ([`Sink`]), under a new
/// generation; then one atomic write, on disk when this returns ([`Store::commit`]), adds the
/// header that lists them, deletes the records they replace and those of streams that are
/// gone, and keeps the rest. The `final_snapshot` of a graceful shutdown also keeps the
/// records no stream has claimed yet.
pub async fn take(
    state: &Arc<ServiceState>,
    snapshots: &Arc<Snapshots>,
    final_snapshot: bool,
) -> Result<(), TakeError> {
    let mut stored = snapshots.held.lock().await;
    let started = Instant::now();
    stored.generation += 1;
    let generation = stored.generation;
    let sink = Arc::new(Sink::new(snapshots.clone(), generation));
    let shared = Arc::new(stored.held.clone());
    // Every worker captures its own streams at once: each pauses only for its own exports.
    let captured = state.queues().capture(shared, Some(sink.clone() as Arc<dyn RecordSink>)).await;
    let capture = started.elapsed();
    let outcome = match captured {
        Ok(mut captured) => {
            // Records of pods whose streams have not started: kept in the final snapshot (a
            // quick restart keeps them), dropped from periodic ones (a pod gone for one
            // interval is gone).
            let unclaimed = if final_snapshot {
                let keys = state.restored().keys();
                let n = keys.len();
                captured.extend(keys.into_iter().map(|key| Captured::Kept { key }));
                n
            } else {
                state.restored().drain()
            };
            let block_size = state.config().block_size as u64;
            let (sink, held, leftovers) = (sink.clone(), stored.held.clone(), stored.leftovers.clone());
            let (done, written_rx) = tokio::sync::oneshot::channel();
            pool::pool().spawn(move || {
                let outcome = write_snapshot(&sink, captured, held, leftovers, block_size);
                // Let go of the store before answering: once answered, shutdown may close it
                // and the process exit, and RocksDB must not be closed by a pool thread racing
                // that exit.
                drop(sink);
                let _ = done.send(outcome);
            });
            written_rx.await.unwrap_or(Err(TakeError::WriteStopped)).map(|w| (w, unclaimed))
        }
        Err(e) => Err(e.into()),
    };
    let (w, unclaimed) = match outcome {
        Ok(done) => done,
        Err(e) => {
            // Its records stay out of every header: the next commit deletes them.
            stored.leftovers.extend(std::mem::take(&mut *sink.written.lock()));
            counter!(m::SNAPSHOT_WRITES, "outcome" => "error").increment(1);
            return Err(e);
        }
    };
    stored.held = w.next;
    stored.leftovers.clear();
    // The streams before the write count: a reader that sees a write sees its streams.
    counter!(m::SNAPSHOT_STREAMS, "outcome" => "written").increment(w.written as u64);
    counter!(m::SNAPSHOT_STREAMS, "outcome" => "kept").increment(w.kept as u64);
    counter!(m::SNAPSHOT_WRITES, "outcome" => "ok").increment(1);
    histogram!(m::SNAPSHOT_SECONDS).record(started.elapsed().as_secs_f64());
    gauge!(m::SNAPSHOT_BYTES).set(w.bytes as f64);
    gauge!(m::SNAPSHOT_RESIDENCIES).set(w.residencies as f64);
    tracing::info!(
        generation,
        written = w.written,
        kept = w.kept,
        deleted = w.deleted,
        residencies = w.residencies,
        bytes = w.bytes,
        unclaimed,
        capture_ms = capture.as_millis() as u64,
        total_ms = started.elapsed().as_millis() as u64,
        "snapshot written"
    );
    Ok(())
}

/// What a committed snapshot wrote.
struct Written {
    next: HeldMap,
    written: usize,
    kept: usize,
    deleted: usize,
    /// Bytes of the records written by this snapshot and its header.
    bytes: u64,
    residencies: u64,
}

/// Writes the records the capture answered rather than wrote (restored records no export
/// replaced), then commits the header that lists every record the snapshot keeps, with the
/// deletes of the records it replaced, of streams that are gone and of `leftovers`.
fn write_snapshot(
    sink: &Sink,
    captured: Vec<Captured>,
    held: HeldMap,
    leftovers: Vec<String>,
    block_size: u64,
) -> Result<Written, TakeError> {
    let mut next = HeldMap::with_capacity(captured.len());
    let (mut kept, mut written, mut bytes) = (0, 0, 0u64);
    for c in captured {
        let c = match c {
            Captured::Fresh { key, version, record } => sink.write(key, version, &record),
            c => c,
        };
        match c {
            Captured::Kept { key } => {
                if let Some(h) = held.get(&key) {
                    next.insert(key, *h);
                    kept += 1;
                }
            }
            Captured::Written { key, held, bytes: b } => {
                next.insert(key, held);
                (written, bytes) = (written + 1, bytes + b);
            }
            Captured::Failed { key, error } => return Err(TakeError::Record { key, error }),
            Captured::Fresh { .. } => unreachable!("written above"),
        }
    }
    // Every record the stored snapshot lists that the new one does not list as it is stored.
    let mut deletes = leftovers;
    for (key, h) in &held {
        if next.get(key).is_none_or(|n| n.generation != h.generation) {
            deletes.push(stored_key(key, h));
        }
    }
    let deleted = deletes.len();
    let mut batch = SnapshotBatch::default();
    for key in &deletes {
        batch.delete(key);
    }
    let mut listed: Vec<(&String, &Held)> = next.iter().collect();
    listed.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let header = Header {
        recipe_version: kvindex::keys::RECIPE_VERSION,
        block_size,
        created_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        residencies: next.values().map(|h| h.residencies).sum(),
        streams: listed.iter().map(|(k, h)| ((*k).clone(), h.checksum)).collect(),
        generation: sink.generation,
        generations: listed.iter().map(|(_, h)| h.generation).collect(),
    };
    drop(listed);
    bytes += sink.snapshots.store.commit(batch, &header)?;
    Ok(Written { residencies: header.residencies, next, written, kept, deleted, bytes })
}

/// Where the store keeps stream `key`'s record `h`.
fn stored_key(key: &str, h: &Held) -> String {
    match h.generation {
        0 => key.to_string(),
        generation => format::record_key(generation, key),
    }
}

/// Snapshots every `snapshot_interval` until `shutdown`. The interval counts from the end of the
/// previous snapshot, not on a fixed clock: a snapshot that takes longer than the interval (a
/// large index on busy cores) is never followed at once by another, so ingest always gets a
/// whole interval between two.
pub async fn periodic(state: Arc<ServiceState>, snapshots: Arc<Snapshots>, mut shutdown: Shutdown) {
    let every = Duration::from_millis(state.config().snapshot_interval_ms);
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(every) => false,
            _ = shutdown.recv() => true,
        };
        if stopping {
            return;
        }
        if let Err(e) = take(&state, &snapshots, false).await {
            tracing::warn!(error = %e, "snapshot failed");
        }
    }
}
