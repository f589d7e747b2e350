//! Captures of every worker's streams at once, for a snapshot or for a sibling's export
//! (`crate::persist::snapshot`): each worker answers with each of its streams' records, exact at the
//! stream's cursor, without stopping its other streams (`write::worker::capture`). One capture at a
//! time: a worker asked for a second while the first runs would wait for the first's exports,
//! which is the pause captures exist to avoid.

use std::sync::Arc;

use super::Queues;
use crate::protocols::{Captured, HeldMap, RecordSink, Work};

/// Why a capture did not complete: a worker is gone or stopped (the service is stopping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    #[error("an apply worker is gone")]
    WorkerGone,
    #[error("an apply worker stopped during the capture")]
    WorkerStopped,
}

impl Queues {
    /// Every worker's part of a capture (`held`: what a snapshot store holds, whose records
    /// still exact are kept, not exported; empty: every stream is exported; `sink`: where
    /// each exported record is written at once, see `protocols::RecordSink`), after any capture
    /// already running.
    pub async fn capture(
        &self,
        held: Arc<HeldMap>,
        sink: Option<Arc<dyn RecordSink>>,
    ) -> Result<Vec<Captured>, CaptureError> {
        let _one_at_a_time = self.captures.lock().await;
        let mut replies = Vec::new();
        for worker in 0..self.workers() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            if !self.send(worker, Work::Snapshot { held: held.clone(), sink: sink.clone(), reply: tx }).await {
                return Err(CaptureError::WorkerGone);
            }
            replies.push(rx);
        }
        let mut captured = Vec::new();
        for rx in replies {
            captured.extend(rx.await.map_err(|_| CaptureError::WorkerStopped)?);
        }
        Ok(captured)
    }
}
