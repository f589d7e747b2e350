//! Capturing a snapshot on an apply worker: its streams are taken one at a time, each at a
//! point between two of its own batches, so each record is exact at its cursor. A stream that
//! needs an export is handed to the snapshot pool, at most one per pool thread at once, and
//! only that stream's steps wait meanwhile (in its `waiting`, see `write::worker::live`); the worker
//! goes on applying every other stream's, and runs a stream's held-back steps when its export
//! is in (`write::worker::held`). Lives with the worker that runs it and feeds the snapshot store
//! (`persist::snapshot`) through the pool; it sees the worker's streams only through the table
//! it is handed.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use crate::index_handle::IndexHandle;
use crate::persist::snapshot::format::{self, StreamRecord};
use crate::persist::snapshot::pool;
use crate::protocols::RecordSink;
use crate::protocols::StreamKey;
use crate::protocols::{Captured, HeldMap};
use crate::write::table::{Stream, StreamTable};
use crate::write::worker::live::Live;

/// A snapshot being captured by a worker (see the module doc).
pub struct Capture {
    /// What the store holds: a stream whose record is still exact is kept, not exported.
    held: Arc<HeldMap>,
    /// Where an exported record is written as soon as it is encoded (None: it is answered).
    sink: Option<Arc<dyn RecordSink>>,
    /// Streams not taken yet.
    queue: Vec<StreamKey>,
    /// Exports on the pool.
    running: usize,
    out: Vec<Captured>,
    reply: tokio::sync::oneshot::Sender<Vec<Captured>>,
    done_tx: Sender<(StreamKey, Option<Captured>)>,
    done: Receiver<(StreamKey, Option<Captured>)>,
}

/// What a stream gives a snapshot at this point of its sequence.
enum Part {
    /// Nothing: it has applied no batch yet.
    Nothing,
    Now(Captured),
    /// Its pod's residencies must be exported: (store key, pod, model, cursor, pod version).
    Export(String, Arc<str>, Arc<str>, u64, Option<u64>),
}

impl Capture {
    /// A capture of the streams `queue` (`held`: what the store holds), answered on `reply`.
    pub fn new(
        held: Arc<HeldMap>,
        sink: Option<Arc<dyn RecordSink>>,
        reply: tokio::sync::oneshot::Sender<Vec<Captured>>,
        queue: Vec<StreamKey>,
    ) -> Capture {
        let (done_tx, done) = std::sync::mpsc::channel();
        Capture { held, sink, queue, running: 0, out: Vec::new(), reply, done_tx, done }
    }

    /// Takes the finished exports in; the streams they held back are pushed to `finished`
    /// (their waiting steps may run).
    pub fn collect(&mut self, table: &mut StreamTable<Live>, finished: &mut Vec<StreamKey>) {
        while let Ok((key, captured)) = self.done.try_recv() {
            self.landed(table, key, captured, finished);
        }
    }

    /// Hands streams out to the pool while it has threads free, or takes them at once where no
    /// export is needed. True when every stream is in: [`Capture::answer`].
    pub fn hand_out(&mut self, table: &mut StreamTable<Live>, index: &IndexHandle) -> bool {
        while self.running < pool::threads() {
            let Some(key) = self.queue.pop() else { break };
            let Some(st) = table.get_mut(&key) else { continue };
            match stream_part(&key, st, &self.held, index.index()) {
                Part::Nothing => {}
                Part::Now(captured) => self.out.push(captured),
                Part::Export(skey, pod, model, cursor, version) => {
                    st.ext.exporting = Some(cursor);
                    self.running += 1;
                    let (tx, index, sink) = (self.done_tx.clone(), index.clone(), self.sink.clone());
                    pool::pool().spawn(move || {
                        let export = || {
                            let export = index.index().export_pod(&pod).unwrap_or_else(|| kvindex::PodExport {
                                pod: pod.to_string(),
                                model: model.to_string(),
                                ..Default::default()
                            });
                            (export.model == *model).then(|| {
                                let record = StreamRecord::new(&key.base, key.rank, cursor, export);
                                match &sink {
                                    // Written and let go at once: a snapshot holds at most one
                                    // record per pool thread, however large the index.
                                    Some(sink) => sink.write(skey, version, &record),
                                    None => Captured::Fresh { key: skey, version, record: Box::new(record) },
                                }
                            })
                        };
                        // Always answered, so the stream's held-back steps always run: an export
                        // that panicked (it never should) leaves the pod out of this snapshot.
                        let captured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(export))
                            .unwrap_or_else(|_| {
                                tracing::error!(pod = %pod, "snapshot export failed: the pod is left out of this snapshot");
                                None
                            });
                        // The index handle goes first, as the snapshot write lets go of the
                        // store: nothing of the service outlives the answer on a pool thread.
                        drop((index, sink));
                        let _ = tx.send((key, captured));
                    });
                }
            }
        }
        self.running == 0 && self.queue.is_empty()
    }

    /// Answers the snapshot with every stream's part.
    pub fn answer(self) {
        let _ = self.reply.send(self.out);
    }

    /// Whether any export is on the pool.
    pub fn running(&self) -> bool {
        self.running > 0
    }

    /// Blocks until one running export is in (none running: returns at once).
    pub fn wait_any(&mut self, table: &mut StreamTable<Live>, finished: &mut Vec<StreamKey>) {
        if self.running == 0 {
            return;
        }
        match self.done.recv() {
            Ok((key, captured)) => self.landed(table, key, captured, finished),
            // The capture keeps a sender, so this is only reachable if that changes: what was
            // held back runs, and the snapshot is answered without those streams.
            Err(_) => {
                let exporting: Vec<StreamKey> =
                    table.iter().filter(|(_, st)| st.ext.exporting.is_some()).map(|(k, _)| k.clone()).collect();
                for key in exporting {
                    self.landed(table, key, None, finished);
                }
                self.running = 0;
            }
        }
    }

    /// A stream's export is in: counted in the snapshot, and the stream no longer exporting.
    fn landed(
        &mut self,
        table: &mut StreamTable<Live>,
        key: StreamKey,
        captured: Option<Captured>,
        finished: &mut Vec<StreamKey>,
    ) {
        self.running = self.running.saturating_sub(1);
        self.out.extend(captured);
        if let Some(st) = table.get_mut(&key) {
            st.ext.exporting = None;
            finished.push(key);
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
