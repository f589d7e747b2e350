//! What a worker reports of its streams every tick: their rows of `/debug/sources`, its
//! share of the source lag (`write::worker::lag`), and which of its sources are too far behind their
//! engine to be credited (`write::worker::staleness`, `max_source_staleness_ms`).

use std::time::Instant;

use metrics::gauge;

use kvindex::wire::parse_topic;

use super::live::applied_seq;
use super::Worker;
use super::{lag, staleness};
use crate::queue::Receiver;
use crate::status::{PageHashCheckDebug, StreamDebug};
use crate::telemetry as m;

/// What a pod the index has no state for holds: nothing.
const EMPTY_POD: kvindex::PodDigest = kvindex::PodDigest { digest: 0, blocks: 0 };

impl Worker {
    /// Refreshes what `/debug/sources` shows of this worker's streams, and its lag.
    pub(super) fn publish_status(&mut self, lane: &Receiver, now: u64) {
        let bound = self.context.settings().max_source_staleness_ms;
        let status = self.context.status();
        let reg = self.context.registry();
        let mut snapshot = Vec::with_capacity(self.table.len());
        let (instant, lane_oldest) = (Instant::now(), lane.oldest_live());
        let mut worst = lag::source_lag(instant, lane_oldest, None);
        let index = self.context.index();
        for (key, st) in self.table.iter_mut() {
            let s = st.seq.stats();
            let lag = lag::source_lag(instant, lane_oldest, lag::oldest_held(st.seq.held(), &st.ext.waiting));
            worst = worst.max(lag);
            let behind = staleness::source_staleness(st.ext.staleness.behind(now), lag);
            let withheld = staleness::past_bound(behind, bound);
            if withheld != st.ext.withheld {
                st.ext.withheld = withheld;
                status.set_withheld(&st.pod, withheld);
                if withheld {
                    tracing::warn!(pod = %st.pod, staleness_ms = behind.as_millis() as u64, bound_ms = bound, "source too far behind its engine: not credited until it catches up");
                } else {
                    tracing::info!(pod = %st.pod, staleness_ms = behind.as_millis() as u64, "source caught up: credited again");
                }
            }
            // Read here, between two batches, so it is the digest at `applied_seq`.
            let settled = st.ext.restore.is_none() && st.ext.importing.is_none();
            let held = settled.then(|| self.context.index().pod_digest(&st.pod)).map(|d| d.unwrap_or(EMPTY_POD));
            snapshot.push((
                key.clone(),
                StreamDebug {
                    pod: st.pod.to_string(),
                    base_pod: key.base.to_string(),
                    dp_rank: key.rank,
                    mode: st.mode.label(),
                    engine: st.rules.engine().as_str(),
                    page_hash_check: st.rules.page_check().map(|c| {
                        let t = c.totals();
                        PageHashCheckDebug {
                            release: c.release().to_string(),
                            format: c.format().as_str(),
                            checked: t.checked,
                            matched: t.matched,
                            mismatched: t.mismatched,
                            unverifiable: t.unverifiable,
                            all_mismatched: c.misconfigured(),
                        }
                    }),
                    topic: st.topic.clone(),
                    topic_id: st.topic.as_deref().map(|t| parse_topic(t).id.to_string()),
                    model: st.model.to_string(),
                    endpoint: st.endpoint.as_deref().map(str::to_string),
                    replay_endpoint: reg.replay_endpoint(&key.base, key.rank),
                    state: st.seq.state().label(),
                    last_seq: applied_seq(st),
                    last_live_seq: st.seq.last_live_seq(),
                    last_event_age_ms: st.seq.last_data_at().map(|at| now.saturating_sub(at)),
                    counters: s.clone(),
                    replay_in_flight: st.seq.replay_in_flight().map(|(_, from)| from),
                    pending: st.seq.pending(),
                    lag_ms: lag.as_secs_f64() * 1e3,
                    staleness_ms: behind.as_secs_f64() * 1e3,
                    stale: withheld,
                    credit_unit_tokens: index.credit_unit(&st.pod).0,
                    eagle: index.credit_unit(&st.pod).1,
                    digest: held.map(|d| d.digest),
                    digest_blocks: held.map_or(0, |d| d.blocks),
                },
            ));
        }
        drop(reg);
        status.publish(snapshot);
        lane.set_lag(worst);
        gauge!(m::SOURCE_LAG).set(self.context.queues().max_lag().as_secs_f64());
    }
}
