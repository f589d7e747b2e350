//! Capturing a snapshot on an apply worker: its streams are taken one at a time, each at a
//! point between two of its own batches, so each record is exact at its cursor. A stream that
//! needs an export is handed to the snapshot pool, at most one per pool thread at once, and
//! only that stream's steps wait meanwhile (in its `waiting`, see `apply::live`); the worker
//! goes on applying every other stream's. Lives beside the store it feeds; it reaches into the
//! worker only for the streams it takes.

use std::sync::Arc;

use super::format::{self, StreamRecord};
use super::{Captured, HeldMap};
use crate::apply::live::Live;
use crate::apply::Worker;
use crate::ingest::Stream;
use crate::protocols::StreamKey;

/// A snapshot being captured by a worker (see the module doc).
pub struct Capture {
    /// What the store holds: a stream whose record is still exact is kept, not exported.
    held: Arc<HeldMap>,
    /// Streams not taken yet.
    queue: Vec<StreamKey>,
    /// Exports on the pool.
    running: usize,
    out: Vec<Captured>,
    reply: tokio::sync::oneshot::Sender<Vec<Captured>>,
    done_tx: std::sync::mpsc::Sender<(StreamKey, Option<Captured>)>,
    done: std::sync::mpsc::Receiver<(StreamKey, Option<Captured>)>,
}

/// What a stream gives a snapshot at this point of its sequence.
enum Part {
    /// Nothing: it has applied no batch yet.
    Nothing,
    Now(Captured),
    /// Its pod's residencies must be exported: (store key, pod, model, cursor, pod version).
    Export(String, Arc<str>, Arc<str>, u64, Option<u64>),
}

impl Worker {
    /// Starts capturing a snapshot of this worker's streams (`held`: what the store holds).
    /// One capture at a time (`snapshot::take` waits for every reply); were another still
    /// running, it is finished first.
    pub(crate) fn start_capture(&mut self, held: Arc<HeldMap>, reply: tokio::sync::oneshot::Sender<Vec<Captured>>) {
        while self.capture.is_some() {
            self.wait_export_any();
            self.advance_capture();
        }
        let queue = self.table.keys();
        let (done_tx, done) = std::sync::mpsc::channel();
        self.capture = Some(Capture { held, queue, running: 0, out: Vec::new(), reply, done_tx, done });
        self.advance_capture();
    }

    /// Finished exports in; then streams out to the pool while it has threads free, or taken
    /// at once where no export is needed. Answers the snapshot when every stream is in.
    pub(crate) fn advance_capture(&mut self) {
        let Some(capture) = self.capture.as_mut() else { return };
        let mut finished = Vec::new();
        while let Ok(done) = capture.done.try_recv() {
            finished.push(done);
        }
        for (key, captured) in finished {
            self.export_finished(&key, captured);
        }
        let Some(capture) = self.capture.as_mut() else { return };
        while capture.running < super::pool::threads() {
            let Some(key) = capture.queue.pop() else { break };
            let Some(st) = self.table.get_mut(&key) else { continue };
            match stream_part(&key, st, &capture.held, self.state.index()) {
                Part::Nothing => {}
                Part::Now(captured) => capture.out.push(captured),
                Part::Export(skey, pod, model, cursor, version) => {
                    st.ext.exporting = Some(cursor);
                    capture.running += 1;
                    let (tx, state) = (capture.done_tx.clone(), self.state.clone());
                    super::pool::pool().spawn(move || {
                        let export = || {
                            let export = state.index().export_pod(&pod).unwrap_or_else(|| kvindex::PodExport {
                                pod: pod.to_string(),
                                model: model.to_string(),
                                ..Default::default()
                            });
                            (export.model == *model).then(|| {
                                let record = StreamRecord::new(&key.base, key.rank, cursor, export);
                                Captured::Fresh { key: skey, version, record: Box::new(record) }
                            })
                        };
                        // Always answered, so the stream's held-back steps always run: an export
                        // that panicked (it never should) leaves the pod out of this snapshot.
                        let captured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(export))
                            .unwrap_or_else(|_| {
                                tracing::error!(pod = %pod, "snapshot export failed: the pod is left out of this snapshot");
                                None
                            });
                        // The service state goes first, as the snapshot write lets go of the
                        // store: nothing of the service outlives the answer on a pool thread.
                        drop(state);
                        let _ = tx.send((key, captured));
                    });
                }
            }
        }
        if capture.running == 0 && capture.queue.is_empty() {
            if let Some(capture) = self.capture.take() {
                let _ = capture.reply.send(capture.out);
            }
        }
    }

    /// A stream's export is in: counted in the snapshot, and the stream's held-back steps run.
    fn export_finished(&mut self, key: &StreamKey, captured: Option<Captured>) {
        if let Some(capture) = self.capture.as_mut() {
            capture.running -= 1;
            capture.out.extend(captured);
        }
        if let Some(st) = self.table.get_mut(key) {
            st.ext.exporting = None;
            if st.ext.importing.is_none() {
                self.run_waiting(key);
            }
        }
    }

    /// Blocks until one running export of the capture is in (none running: returns at once).
    pub(crate) fn wait_export_any(&mut self) {
        let Some(capture) = self.capture.as_ref() else { return };
        if capture.running == 0 {
            return;
        }
        match capture.done.recv() {
            Ok((key, captured)) => self.export_finished(&key, captured),
            // The capture keeps a sender, so this is only reachable if that changes: what was
            // held back runs, and the snapshot is answered without those streams.
            Err(_) => {
                let exporting: Vec<StreamKey> =
                    self.table.iter().filter(|(_, st)| st.ext.exporting.is_some()).map(|(k, _)| k.clone()).collect();
                for key in exporting {
                    self.export_finished(&key, None);
                }
                if let Some(capture) = self.capture.as_mut() {
                    capture.running = 0;
                }
            }
        }
    }

    /// Blocks until `key`'s stream is not being exported.
    pub(crate) fn wait_export(&mut self, key: &StreamKey) {
        while self.table.get(key).is_some_and(|st| st.ext.exporting.is_some()) && self.capture.is_some() {
            self.wait_export_any();
        }
    }
}

/// What `st` gives a snapshot now: the pod's residencies at its last applied seq or, for a
/// stream still waiting to prove its snapshot record, that record again. A stream whose stored
/// record (`held`) is still exact (same cursor, the pod unchanged since it was exported) is
/// kept, not exported again.
fn stream_part(key: &StreamKey, st: &Stream<Live>, held: &HeldMap, index: &kvindex::KvIndex) -> Part {
    let skey = format::stream_key(&key.base, key.rank);
    let stored = held.get(&skey);
    if let Some(import) = &st.ext.importing {
        // Its record is going in: the stored one stands (none is, if it was not stored).
        return if stored.is_some_and(|h| h.cursor == import.cursor) {
            Part::Now(Captured::Kept { key: skey })
        } else {
            Part::Nothing
        };
    }
    if let Some(record) = &st.ext.restore {
        return Part::Now(if stored.is_some_and(|h| h.cursor == record.cursor) {
            Captured::Kept { key: skey }
        } else {
            Captured::Fresh { key: skey, version: None, record: Box::new(record.clone()) }
        });
    }
    let Some(cursor) = st.seq.last_seq() else { return Part::Nothing };
    // Read before the export: a change in between makes the next snapshot export again.
    let version = index.pod_version(&st.pod);
    if stored.is_some_and(|h| h.cursor == cursor && version.is_some() && h.version == version) {
        return Part::Now(Captured::Kept { key: skey });
    }
    Part::Export(skey, st.pod.clone(), st.model.clone(), cursor, version)
}
