//! How far behind its sockets the index is, per source: the lag that overload costs instead of
//! state.
//!
//! A source's lag is the age of the oldest live batch received for it at the socket that is
//! not yet visible in the index: one its stream holds back (behind a gap replay, or behind its
//! pod's snapshot export or import), or one waiting in its apply worker's lane. A lane is one
//! FIFO for all of a worker's sources, so its oldest message dates every one of them: a batch
//! any of them sends now waits at least that long. 0 when nothing waits.
//!
//! To date what a stream holds back, every live batch carries its receive time through the
//! sequencer (`write::table::Batch`); the same time gives `kvindex_receive_to_visible_seconds` for a batch
//! that became visible only after a replay, which used to go unmeasured.

use std::time::{Duration, Instant};

use kvindex::sequencer::Step;

use crate::write::table::Batch;

/// The receive time of the oldest live batch among `held` (in the order they came) and the
/// steps `waiting` behind an export or import.
pub fn oldest_held<'a>(held: impl Iterator<Item = &'a Batch>, waiting: &[Step<Batch>]) -> Option<Instant> {
    let held = held.filter_map(|b| b.received).next();
    let waiting = waiting
        .iter()
        .filter_map(|s| match s {
            Step::Apply { batch, .. } => batch.received,
            _ => None,
        })
        .next();
    held.into_iter().chain(waiting).min()
}

/// A source's lag at `now`: the age of the older of its lane's oldest live message and its own
/// oldest held batch (see the module doc).
pub fn source_lag(now: Instant, lane_oldest: Option<Instant>, held_oldest: Option<Instant>) -> Duration {
    lane_oldest.into_iter().chain(held_oldest).map(|at| now.saturating_duration_since(at)).max().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn the_lag_is_the_age_of_the_oldest_batch_not_yet_visible() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(source_lag(at(100), None, None), Duration::ZERO, "nothing waits");
        assert_eq!(source_lag(at(100), Some(at(40)), None), Duration::from_millis(60));
        assert_eq!(source_lag(at(100), Some(at(40)), Some(at(10))), Duration::from_millis(90));
        assert_eq!(source_lag(at(100), Some(at(10)), Some(at(40))), Duration::from_millis(90));
        assert_eq!(source_lag(at(5), Some(at(10)), None), Duration::ZERO, "a clock read before the receive");
    }

    #[test]
    fn only_live_batches_date_what_a_stream_holds() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let b = |ms: Option<u64>| Batch {
            bytes: Bytes::from_static(b"x"),
            received: ms.map(at),
            engine: Default::default(),
        };
        // Held in the order they came: the first live one is the oldest received.
        let held = [b(None), b(Some(20)), b(Some(30))];
        assert_eq!(oldest_held(held.iter(), &[]), Some(at(20)));
        let waiting = [
            Step::Clear { reason: kvindex::sequencer::Reason::Gap },
            Step::Apply { seq: 1, batch: b(None) },
            Step::Apply { seq: 2, batch: b(Some(15)) },
        ];
        assert_eq!(oldest_held(held.iter(), &waiting), Some(at(15)), "the older of the two holds");
        assert_eq!(oldest_held([].iter(), &waiting[..2]), None, "a replayed batch was never received live");
    }
}
