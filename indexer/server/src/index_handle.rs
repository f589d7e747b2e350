//! What the read plane shares with the apply workers (mini-redis's `Db` handle): the index,
//! RecordRoute's speculative credits, each pod's source state and the service's clock. The
//! apply workers write them; ScoreTokens, GetPodScores, RecordRoute and `/debug/sources` read
//! them through a clone of this handle, and see nothing else of the service. Its upkeep is
//! here too ([`IndexHandle::upkeep`]): the index-wide gauges and the sweep of expired credits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::gauge;

use kvindex::speculative::SpeculativeCredits;
use kvindex::KvIndex;

use crate::clock::Clock;
use crate::status::SourceStatus;
use crate::telemetry as m;

/// How often `kvindex_index_bytes` is measured (the other gauges follow every upkeep).
const BYTES_EVERY: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct IndexHandle {
    index: Arc<KvIndex>,
    /// RecordRoute's predictions, kept apart from the index (never in `matched_blocks`).
    speculative: Arc<SpeculativeCredits>,
    status: Arc<SourceStatus>,
    clock: Clock,
}

impl IndexHandle {
    pub fn new(index: KvIndex, speculative: SpeculativeCredits, clock: Clock) -> IndexHandle {
        IndexHandle {
            index: Arc::new(index),
            speculative: Arc::new(speculative),
            status: Arc::new(SourceStatus::default()),
            clock,
        }
    }

    pub fn index(&self) -> &KvIndex {
        &self.index
    }

    pub fn speculative(&self) -> &SpeculativeCredits {
        &self.speculative
    }

    /// Each pod's source state and the streams' debug view.
    pub fn status(&self) -> &SourceStatus {
        &self.status
    }

    /// Milliseconds since the service started: the sequencers' and the credits' clock.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Ends `pod`'s speculative credit (its blocks were cleared, its source degraded, or it
    /// was removed), counting the credits dropped under `reason`.
    pub fn end_speculation(&self, pod: &str, reason: &'static str) {
        let dropped = self.speculative.clear_pod(pod);
        if dropped > 0 {
            metrics::counter!(m::SPECULATIVE_CLEARED, "reason" => reason).increment(dropped as u64);
        }
    }
}

/// What the handle's upkeep remembers between two runs.
pub struct Upkeep {
    /// When the index's bytes are next measured: a walk of every segment under each shard's
    /// writer lock, too dear for every tick of a large index.
    bytes_due: Instant,
}

impl Default for Upkeep {
    fn default() -> Self {
        Upkeep { bytes_due: Instant::now() }
    }
}

impl IndexHandle {
    /// The upkeep of what the handle holds, run periodically by one caller (apply worker 0's
    /// tick): the index-wide gauges (entries, keys, bytes), the pods with a source, and the
    /// sweep of expired speculative credits with their gauges.
    pub fn upkeep(&self, upkeep: &mut Upkeep) {
        let table = self.index.table();
        gauge!(m::INDEX_ENTRIES).set(table.entries() as f64);
        gauge!(m::INDEX_KEYS).set(table.keys() as f64);
        if Instant::now() >= upkeep.bytes_due {
            gauge!(m::INDEX_BYTES).set(table.approx_bytes() as f64);
            upkeep.bytes_due = Instant::now() + BYTES_EVERY;
        }
        self.status.publish_pods();
        // Expired credits are already ignored by scoring; sweeping reclaims their memory.
        self.speculative.sweep_every(1_000, self.now_ms());
        gauge!(m::SPECULATIVE_ENTRIES).set(self.speculative.entries() as f64);
        gauge!(m::SPECULATIVE_BYTES).set(self.speculative.approx_bytes() as f64);
    }
}
