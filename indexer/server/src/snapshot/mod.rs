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
pub mod capture;
pub mod chunks;
pub mod format;
pub mod import;
pub mod pool;
pub mod restored;
pub mod sibling_export;
pub mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrics::{counter, gauge, histogram};

use self::format::{Header, StreamRecord};
use self::store::{SnapshotBatch, SnapshotDir, Store};
use crate::shutdown::Shutdown;
use crate::state::ServiceState;
use crate::telemetry as m;

pub use crate::protocols::{Captured, Held, HeldMap};
pub use restored::Restored;

/// The snapshot store, and what it holds now.
pub struct Snapshots {
    store: Store,
    /// Held under the lock for a whole snapshot: one snapshot at a time, each starting from
    /// what the last one left.
    held: tokio::sync::Mutex<HeldMap>,
}

impl Snapshots {
    pub fn store(&self) -> &Store {
        &self.store
    }
}

/// Opens the store in the claimed snapshot directory (`crate::bind` claims it: see
/// [`SnapshotDir::claim`]) and loads its snapshot into `state`'s [`Restored`]. Any refusal of
/// the snapshot starts clean (and recreates the store from RocksDB's files only); only an
/// unusable directory is an error.
pub fn open(state: &ServiceState, dir: Option<SnapshotDir>) -> Result<Option<Arc<Snapshots>>, String> {
    let Some(dir) = dir else { return Ok(None) };
    let dir = Arc::new(dir);
    let started = Instant::now();
    let recipe = kvindex::keys::RECIPE_VERSION;
    let block_size = state.config().block_size as u64;
    let opened = Store::open(dir.clone()).and_then(|s| s.load(recipe, block_size).map(|l| (s, l)));
    let mut held = HeldMap::new();
    let store = match opened {
        Ok((store, Some(loaded))) => {
            let streams = loaded.streams.len();
            let residencies = loaded.header.residencies;
            let sums: HashMap<&str, u64> = loaded.header.streams.iter().map(|(k, s)| (k.as_str(), *s)).collect();
            for r in &loaded.streams {
                let key = r.key();
                let checksum = sums.get(key.as_str()).copied().unwrap_or(0);
                held.insert(key, Held { cursor: r.cursor, version: None, checksum, residencies: r.residencies() });
            }
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
    Ok(Some(Arc::new(Snapshots { store, held: tokio::sync::Mutex::new(held) })))
}

/// Takes a snapshot now: every worker exports the streams that moved since the stored
/// snapshot, then one atomic write, on disk when this returns ([`Store::save`]), replaces their
/// records, deletes those of streams that are gone and keeps the rest. The `final_snapshot` of
/// a graceful shutdown also keeps the records no stream has claimed yet.
pub async fn take(state: &Arc<ServiceState>, snapshots: &Arc<Snapshots>, final_snapshot: bool) -> Result<(), String> {
    let mut held = snapshots.held.lock().await;
    let started = Instant::now();
    let shared = Arc::new(held.clone());
    // Every worker captures its own streams at once: each pauses only for its own exports.
    let mut captured = state.queues().capture(shared).await?;
    let capture = started.elapsed();
    // Records of pods whose streams have not started: kept in the final snapshot (a quick
    // restart keeps them), dropped from periodic ones (a pod gone for one interval is gone).
    let unclaimed = if final_snapshot {
        let keys = state.restored().keys();
        let n = keys.len();
        captured.extend(keys.into_iter().map(|key| Captured::Kept { key }));
        n
    } else {
        state.restored().drain()
    };
    let mut next = HeldMap::with_capacity(captured.len());
    let mut fresh = Vec::new();
    for c in captured {
        match c {
            Captured::Kept { key } => {
                if let Some(h) = held.get(&key) {
                    next.insert(key, *h);
                }
            }
            Captured::Fresh { key, version, record } => fresh.push((key, version, record)),
        }
    }
    let (kept, written) = (next.len(), fresh.len());
    let fresh_keys: std::collections::HashSet<&str> = fresh.iter().map(|(k, _, _)| k.as_str()).collect();
    let deletes: Vec<String> =
        held.keys().filter(|k| !next.contains_key(*k) && !fresh_keys.contains(k.as_str())).cloned().collect();
    drop(fresh_keys);
    let deleted = deletes.len();
    let block_size = state.config().block_size as u64;
    let snaps = snapshots.clone();
    let (done, written_rx) = tokio::sync::oneshot::channel();
    pool::pool().spawn(move || {
        let outcome = write_snapshot(&snaps, deletes, fresh, next, block_size);
        // Let go of the store before answering: once answered, shutdown may close it and the
        // process exit, and RocksDB must not be closed by a pool thread racing that exit.
        drop(snaps);
        let _ = done.send(outcome);
    });
    let outcome = written_rx.await.unwrap_or_else(|_| Err("the snapshot write stopped (a panic, see the log)".into()));
    let (bytes, residencies, next) =
        outcome.inspect_err(|_| counter!(m::SNAPSHOT_WRITES, "outcome" => "error").increment(1))?;
    *held = next;
    // The streams before the write count: a reader that sees a write sees its streams.
    counter!(m::SNAPSHOT_STREAMS, "outcome" => "written").increment(written as u64);
    counter!(m::SNAPSHOT_STREAMS, "outcome" => "kept").increment(kept as u64);
    counter!(m::SNAPSHOT_WRITES, "outcome" => "ok").increment(1);
    histogram!(m::SNAPSHOT_SECONDS).record(started.elapsed().as_secs_f64());
    gauge!(m::SNAPSHOT_BYTES).set(bytes as f64);
    gauge!(m::SNAPSHOT_RESIDENCIES).set(residencies as f64);
    tracing::info!(
        written,
        kept,
        deleted,
        residencies,
        bytes,
        unclaimed,
        capture_ms = capture.as_millis() as u64,
        total_ms = started.elapsed().as_millis() as u64,
        "snapshot written"
    );
    Ok(())
}

/// Encodes the fresh records into one batch beside the deletes, and commits it with the header
/// that lists every record the snapshot keeps. Returns bytes written, residencies and the new
/// held map.
fn write_snapshot(
    snaps: &Snapshots,
    deletes: Vec<String>,
    fresh: Vec<(String, Option<u64>, Box<StreamRecord>)>,
    mut next: HeldMap,
    block_size: u64,
) -> Result<(u64, u64, HeldMap), String> {
    let mut batch = SnapshotBatch::default();
    for key in &deletes {
        batch.delete(key);
    }
    // Each record is encoded into the batch and dropped, with its encoding, at once.
    for (key, version, record) in fresh {
        let value = format::encode_record(&record);
        let checksum = format::checksum_of(&value).unwrap_or(0);
        batch.put(&key, &value);
        next.insert(key, Held { cursor: record.cursor, version, checksum, residencies: record.residencies() });
    }
    let mut streams: Vec<(String, u64)> = next.iter().map(|(k, h)| (k.clone(), h.checksum)).collect();
    streams.sort_unstable();
    let header = Header {
        recipe_version: kvindex::keys::RECIPE_VERSION,
        block_size,
        created_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        residencies: next.values().map(|h| h.residencies).sum(),
        streams,
    };
    let bytes = snaps.store.commit(batch, &header).map_err(|e| e.to_string())?;
    Ok((bytes, header.residencies, next))
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
