//! What the read plane shares with the apply workers (mini-redis's `Db` handle): the index,
//! RecordRoute's speculative credits, each pod's source state and the service's clock. The
//! apply workers write them; ScoreTokens, GetPodScores, RecordRoute and `/debug/sources` read
//! them through a clone of this handle, and see nothing else of the service.

use std::sync::Arc;

use kvindex::speculative::SpeculativeCredits;
use kvindex::KvIndex;

use crate::clock::Clock;
use crate::status::SourceStatus;
use crate::telemetry as m;

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
