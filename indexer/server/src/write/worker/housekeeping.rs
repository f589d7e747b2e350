//! Housekeeping of the shared data: the index-wide gauges (entries, keys, bytes), the queue,
//! readiness and pod gauges, and the sweep of expired speculative credits. One apply worker
//! (worker 0) runs it on its tick; it touches no stream, so it lives apart from the stream table.

use std::time::{Duration, Instant};

use metrics::gauge;

use crate::telemetry as m;
use crate::write::context::ServiceState;

/// How often `kvindex_index_bytes` is measured (the other gauges follow every tick).
const BYTES_EVERY: Duration = Duration::from_secs(5);

pub struct Housekeeping {
    /// When the index's bytes are next measured: a walk of every segment under each shard's
    /// writer lock, too dear for every tick of a large index.
    bytes_due: Instant,
}

impl Default for Housekeeping {
    fn default() -> Self {
        Housekeeping::new()
    }
}

impl Housekeeping {
    pub fn new() -> Housekeeping {
        Housekeeping { bytes_due: Instant::now() }
    }

    pub fn tick(&mut self, state: &ServiceState) {
        let table = state.index().table();
        gauge!(m::INDEX_ENTRIES).set(table.entries() as f64);
        gauge!(m::INDEX_KEYS).set(table.keys() as f64);
        if Instant::now() >= self.bytes_due {
            gauge!(m::INDEX_BYTES).set(table.approx_bytes() as f64);
            self.bytes_due = Instant::now() + BYTES_EVERY;
        }
        gauge!(m::QUEUE_DEPTH).set(state.queues().depth().max(0) as f64);
        gauge!(m::READY).set(if state.readiness().is_ready() { 1.0 } else { 0.0 });
        gauge!(m::PODS).set(state.status().pods() as f64);
        let speculative = state.speculative();
        // Expired credits are already ignored by scoring; sweeping reclaims their memory.
        speculative.sweep_every(1_000, state.now_ms());
        gauge!(m::SPECULATIVE_ENTRIES).set(speculative.entries() as f64);
        gauge!(m::SPECULATIVE_BYTES).set(speculative.approx_bytes() as f64);
    }
}
