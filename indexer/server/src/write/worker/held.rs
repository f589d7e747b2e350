//! The worker's side of a snapshot capture (`write::worker::capture`): it starts and advances the
//! capture, waits for exports where it must, and runs a stream's held-back steps once its
//! pod's export is in.

use std::sync::Arc;

use super::Worker;
use crate::protocols::{Captured, HeldMap, RecordSink, StreamKey};
use crate::write::worker::capture::Capture;

impl Worker {
    /// Starts capturing a snapshot of this worker's streams (`held`: what the store holds;
    /// `sink`: where exported records go at once).
    /// One capture at a time (`persist::snapshot::take` waits for every reply); were another still
    /// running, it is finished first.
    pub(crate) fn start_capture(
        &mut self,
        held: Arc<HeldMap>,
        sink: Option<Arc<dyn RecordSink>>,
        reply: tokio::sync::oneshot::Sender<Vec<Captured>>,
    ) {
        while self.capture.is_some() {
            self.wait_export_any();
            self.advance_capture();
        }
        self.capture = Some(Capture::new(held, sink, reply, self.table.keys()));
        self.advance_capture();
    }

    /// Finished exports in (their streams' held-back steps run); then streams out to the pool.
    /// Answers the snapshot when every stream is in.
    pub(crate) fn advance_capture(&mut self) {
        let Some(capture) = self.capture.as_mut() else { return };
        let mut finished = Vec::new();
        capture.collect(&mut self.table, &mut finished);
        self.exports_done(finished);
        let Some(capture) = self.capture.as_mut() else { return };
        if capture.hand_out(&mut self.table, self.context.index_handle()) {
            if let Some(capture) = self.capture.take() {
                capture.answer();
            }
        }
    }

    /// Blocks until one running export of the capture is in (none running: returns at once).
    pub(crate) fn wait_export_any(&mut self) {
        let Some(capture) = self.capture.as_mut() else { return };
        if !capture.running() {
            return;
        }
        let mut finished = Vec::new();
        capture.wait_any(&mut self.table, &mut finished);
        self.exports_done(finished);
    }

    /// Blocks until `key`'s stream is not being exported.
    pub(crate) fn wait_export(&mut self, key: &StreamKey) {
        while self.table.get(key).is_some_and(|st| st.ext.exporting.is_some()) && self.capture.is_some() {
            self.wait_export_any();
        }
    }

    /// Runs the held-back steps of the streams whose export is in (unless an import still
    /// holds them).
    fn exports_done(&mut self, keys: Vec<StreamKey>) {
        for key in keys {
            if self.table.get(&key).is_some_and(|st| st.ext.importing.is_none()) {
                self.run_waiting(&key);
            }
        }
    }
}
