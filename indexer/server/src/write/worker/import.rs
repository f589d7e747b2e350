//! Importing a restored pod's snapshot record once its stream has proven continuity (the first
//! batch after the record's cursor applies): off the apply worker, on the import pool, so the
//! pods of one worker's streams come back on every core and the worker goes on meanwhile.

use metrics::counter;

use crate::index_handle::IndexHandle;
use crate::persist::snapshot::format::StreamRecord;
use crate::telemetry as m;

/// A pod's snapshot record being imported off the worker (see [`start_import`]).
pub struct Importing {
    /// The record's cursor (a snapshot meanwhile keeps the stored record).
    pub cursor: u64,
    pub done: std::sync::mpsc::Receiver<()>,
}

/// Imports a pod's snapshot record on the import pool (rayon's: one thread per core), so that
/// the pods of one worker's streams come back on every core, and the worker goes on with its
/// other streams meanwhile. The receiver hears when it is done.
pub fn start_import(index: &IndexHandle, record: StreamRecord) -> Importing {
    let (tx, done) = std::sync::mpsc::channel();
    let cursor = record.cursor;
    let index = index.clone();
    rayon::spawn(move || {
        let pod = record.pod().to_string();
        // An import never panics; if it did, the pool must not take the process down: the pod
        // is cleared instead (it under-reports until its blocks come again).
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| restore_pod(&index, record))).is_err() {
            index.index().clear_pod(&pod);
            tracing::error!(pod = %pod, "snapshot record import failed: pod cleared");
        }
        let _ = tx.send(());
    });
    Importing { cursor, done }
}

/// Imports a pod's snapshot record into the index (its stream has just proven continuity).
fn restore_pod(index: &IndexHandle, record: StreamRecord) {
    let (pod, cursor) = (record.pod().to_string(), record.cursor);
    let report = index.index().import_pod(&record.into_export());
    counter!(m::SNAPSHOT_RESTORES, "outcome" => "imported").increment(1);
    tracing::info!(
        pod = %pod,
        cursor,
        blocks = report.blocks,
        refused = report.refused,
        "snapshot record restored: the stream continued from its cursor"
    );
}
