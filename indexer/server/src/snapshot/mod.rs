//! Warm restarts: the index's logical content and each stream's seq cursor, persisted to an
//! embedded RocksDB ([`store`]) periodically and on graceful shutdown, and loaded at start.
//!
//! A snapshot is taken by the apply workers themselves, between two batches of each stream, so
//! every pod's residencies are exactly those of its cursor. Workers export into memory; encoding
//! and the RocksDB write run on a blocking thread, off the ingest path.
//!
//! Loading never makes the index claim anything unproven. The loaded records wait in
//! [`Restored`]; a stream picks its pod's record up when it starts, resumes its sequencer from
//! the cursor (a replay from `cursor + 1` where the engine has a replay socket) and imports the
//! residencies only when the next batch applies, i.e. once the engine's stream has continued
//! exactly where the snapshot stopped. A replay that no longer reaches the cursor, a restarted
//! engine or any other loss clears the pod (DEGRADED) and the record is dropped. A snapshot that
//! cannot be read, fails a checksum, is truncated or was made under another format, key recipe
//! or block size is refused whole: the service starts clean, says so in one log line, counts it
//! (`kvindex_snapshot_load_errors_total`) and overwrites it with its next snapshot.

pub mod format;
pub mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrics::{counter, gauge, histogram};
use parking_lot::Mutex;
use tokio::sync::watch;

use self::format::{Header, StreamRecord};
use self::store::Store;
use crate::apply::Work;
use crate::state::ServiceState;
use crate::telemetry as m;

/// Loaded records not yet picked up by a stream, by DP-resolved pod id.
#[derive(Default)]
pub struct Restored {
    records: Mutex<HashMap<String, StreamRecord>>,
}

impl Restored {
    /// The record of `pod`, once: the stream that takes it owns it.
    pub fn take(&self, pod: &str) -> Option<StreamRecord> {
        self.records.lock().remove(pod)
    }

    pub fn len(&self) -> usize {
        self.records.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn fill(&self, records: Vec<StreamRecord>) {
        let mut map = self.records.lock();
        for r in records {
            map.insert(r.pod.clone(), r);
        }
    }

    fn cloned(&self) -> Vec<StreamRecord> {
        self.records.lock().values().cloned().collect()
    }

    /// Records no stream asked for: their engines did not come back in time.
    fn drain(&self) -> Vec<StreamRecord> {
        self.records.lock().drain().map(|(_, r)| r).collect()
    }
}

/// Opens the store at the configured directory and loads its snapshot into `state`'s
/// [`Restored`]. Any refusal starts clean (and recreates the store); only an unusable
/// directory is an error.
pub fn open(state: &ServiceState) -> Result<Option<Arc<Store>>, String> {
    let Some(dir) = state.config().snapshot_dir.clone() else { return Ok(None) };
    let started = Instant::now();
    let recipe = kvindex::keys::RECIPE_VERSION;
    let block_size = state.config().block_size as u64;
    let opened = Store::open(&dir).and_then(|s| s.load(recipe, block_size).map(|l| (s, l)));
    let store = match opened {
        Ok((store, Some(loaded))) => {
            let streams = loaded.streams.len();
            let residencies = loaded.header.residencies;
            state.restored().fill(loaded.streams);
            counter!(m::SNAPSHOT_LOADS, "outcome" => "loaded").increment(1);
            histogram!(m::SNAPSHOT_LOAD_SECONDS).record(started.elapsed().as_secs_f64());
            tracing::info!(
                dir = %dir.display(),
                streams,
                residencies,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "snapshot loaded: pods come back as their streams continue from the snapshot's cursors"
            );
            store
        }
        Ok((store, None)) => {
            counter!(m::SNAPSHOT_LOADS, "outcome" => "empty").increment(1);
            tracing::info!(dir = %dir.display(), "no snapshot yet: starting clean");
            store
        }
        Err(e) => {
            counter!(m::SNAPSHOT_LOADS, "outcome" => "refused").increment(1);
            counter!(m::SNAPSHOT_LOAD_ERRORS, "reason" => e.label()).increment(1);
            tracing::error!(dir = %dir.display(), error = %e, "snapshot refused: starting clean");
            Store::recreate(&dir)?
        }
    };
    Ok(Some(Arc::new(store)))
}

/// Takes a snapshot now: every worker exports its streams, then one atomic write (synced to
/// disk for the `final_snapshot` of a graceful shutdown).
pub async fn take(state: &Arc<ServiceState>, store: &Arc<Store>, final_snapshot: bool) -> Result<(), String> {
    let started = Instant::now();
    let mut streams = Vec::new();
    for worker in 0..state.queues().workers() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !state.queues().send(worker, Work::Snapshot { reply: tx }).await {
            return Err("an apply worker is gone".into());
        }
        streams.extend(rx.await.map_err(|_| "an apply worker stopped during the snapshot".to_string())?);
    }
    let captured = started.elapsed();
    // Records of pods whose streams have not started: carried into the final snapshot (a quick
    // restart keeps them), dropped from periodic ones (a pod gone for one interval is gone).
    let unclaimed = if final_snapshot { state.restored().cloned() } else { state.restored().drain() };
    let unclaimed_count = unclaimed.len();
    if final_snapshot {
        streams.extend(unclaimed);
    }
    let header = Header {
        recipe_version: kvindex::keys::RECIPE_VERSION,
        block_size: state.config().block_size as u64,
        created_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        streams: streams.len() as u64,
        residencies: streams.iter().map(StreamRecord::residencies).sum(),
    };
    let store = store.clone();
    let count = streams.len();
    let residencies = header.residencies;
    let bytes = tokio::task::spawn_blocking(move || store.save(&header, &streams, final_snapshot))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| {
            counter!(m::SNAPSHOT_WRITES, "outcome" => "error").increment(1);
            e.to_string()
        })?;
    counter!(m::SNAPSHOT_WRITES, "outcome" => "ok").increment(1);
    histogram!(m::SNAPSHOT_SECONDS).record(started.elapsed().as_secs_f64());
    gauge!(m::SNAPSHOT_BYTES).set(bytes as f64);
    gauge!(m::SNAPSHOT_RESIDENCIES).set(residencies as f64);
    tracing::info!(
        streams = count,
        residencies,
        bytes,
        unclaimed = unclaimed_count,
        capture_ms = captured.as_millis() as u64,
        total_ms = started.elapsed().as_millis() as u64,
        "snapshot written"
    );
    Ok(())
}

/// Snapshots every `snapshot_interval` until `stop`.
pub async fn periodic(state: Arc<ServiceState>, store: Arc<Store>, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(state.config().snapshot_interval_ms);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        let stopping = tokio::select! {
            _ = ticks.tick() => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopping {
            return;
        }
        if let Err(e) = take(&state, &store, false).await {
            tracing::warn!(error = %e, "snapshot failed");
        }
    }
}
