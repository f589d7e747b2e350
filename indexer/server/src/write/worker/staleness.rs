//! How far behind its engine a source is, publisher's backlog included: the one rule under
//! lag is that a source too far behind is not credited (`max_source_staleness_ms`).
//!
//! `write::worker::lag` dates only what the server has read and not applied. Under read-side
//! backpressure most of the backlog waits on the publisher's side (its send queue, the TCP
//! buffers), where no receive time dates it; the engine evicts blocks meanwhile, so an EXACT
//! source far behind would be credited with blocks the pod may no longer hold. Every batch
//! carries the engine's `ts` (its wall clock, `time.time()`), so a batch's *offset*, our receive
//! time minus `ts`, is its wait since the engine made it plus the clocks' skew. Engines' clocks
//! are not ours: the skew is estimated as the lowest offset seen for the source (a batch that
//! came with no backlog), and a batch's backlog is its offset above that baseline.
//!
//! - The baseline rises by [`DRIFT_PER_S`] per second since it was set, so clocks drifting apart
//!   do not accumulate into false staleness; a lower offset (an engine clock stepping forward, a
//!   backlog draining) lowers it at once.
//! - Under a backlog, batches come back to back and `ts` never goes back. A `ts` earlier than
//!   the previous batch's is the engine's clock stepping back: the baseline is moved so that
//!   the batch is as far behind as the one before it (the step is not read as lag).
//! - A batch that comes after [`IDLE_MS`] without one and was applied without waiting behind
//!   others found the path from the engine empty: it is fresh, and the baseline is set to its
//!   offset (recorded frames with old `ts` sent at a test's pace, or clocks that drifted).
//! - A source with nothing new for [`HOLD_MS`] has nothing in flight: its backlog is 0.
//! - A new publisher process (restart, epoch, reconnect) starts over ([`Staleness::reset`]).
//!
//! A source's staleness is its last batch's backlog (while held) plus the receive-side lag for
//! what was read and not applied. Clocks here are the service's monotonic milliseconds, so our
//! own wall clock stepping changes nothing. Replayed batches are not observed (their `ts` is as
//! old as the gap), and `kvindex replay` has no wall clock: staleness does not apply there.

use std::time::Duration;

/// How fast the skew baseline may rise, in ms per second of our clock (1000 ppm: ten times a
/// free-running crystal's drift).
pub const DRIFT_PER_S: f64 = 1.0;
/// A batch this long after the previous one, applied within as long of its receipt, is fresh.
pub const IDLE_MS: u64 = 100;
/// A `ts` this much earlier than the previous batch's is the engine's clock stepping back (less
/// is rounding: batches made in one engine step carry one `ts`).
const STEP_BACK_MS: f64 = 1.0;
/// A source's last backlog counts this long after its batch came; past it nothing is in flight.
pub const HOLD_MS: u64 = 1_000;

/// How a live batch arrived: received at `received_ms` (the service's clock), applied
/// `waited_ms` later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub received_ms: u64,
    pub waited_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct Baseline {
    offset_ms: f64,
    set_at_ms: u64,
}

impl Baseline {
    fn at(&self, now_ms: u64) -> f64 {
        self.offset_ms + DRIFT_PER_S * now_ms.saturating_sub(self.set_at_ms) as f64 / 1e3
    }
}

#[derive(Debug, Clone, Copy)]
struct Last {
    received_ms: u64,
    ts_ms: f64,
    behind_ms: f64,
}

/// One source's backlog estimate (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Staleness {
    baseline: Option<Baseline>,
    last: Option<Last>,
}

impl Staleness {
    /// Takes a batch the source published at `ts` (engine seconds) into account. `arrival`:
    /// `None` for a replayed batch, which changes nothing.
    pub fn observe(&mut self, arrival: Option<Arrival>, ts: f64) {
        let Some(Arrival { received_ms, waited_ms }) = arrival else { return };
        let ts_ms = ts * 1e3;
        // A `ts` no clock reads (NaN, infinite, beyond year 30000) dates nothing.
        if !ts_ms.is_finite() || ts_ms.abs() > 1e15 {
            return;
        }
        // Live batches apply in the order they came; a clock read out of order must not undo that.
        let received_ms = received_ms.max(self.last.map_or(0, |l| l.received_ms));
        let offset_ms = received_ms as f64 - ts_ms;
        let behind_ms = match (self.baseline, self.last) {
            (Some(b), Some(last)) => {
                let idle = received_ms.saturating_sub(last.received_ms) >= IDLE_MS && waited_ms <= IDLE_MS;
                let base = b.at(received_ms);
                if idle || offset_ms <= base {
                    self.baseline = Some(Baseline { offset_ms, set_at_ms: received_ms });
                    0.0
                } else if ts_ms + STEP_BACK_MS < last.ts_ms {
                    // The engine's clock stepped back: as far behind as the batch before.
                    self.baseline = Some(Baseline { offset_ms: offset_ms - last.behind_ms, set_at_ms: received_ms });
                    last.behind_ms
                } else {
                    offset_ms - base
                }
            }
            _ => {
                self.baseline = Some(Baseline { offset_ms, set_at_ms: received_ms });
                0.0
            }
        };
        self.last = Some(Last { received_ms, ts_ms, behind_ms });
    }

    /// The backlog of the source's last batch, while it counts (see [`HOLD_MS`]).
    pub fn behind(&self, now_ms: u64) -> Duration {
        match self.last {
            Some(l) if now_ms.saturating_sub(l.received_ms) <= HOLD_MS => Duration::from_secs_f64(l.behind_ms / 1e3),
            _ => Duration::ZERO,
        }
    }

    /// A new publisher process: its clock and its backlog are learnt again.
    pub fn reset(&mut self) {
        *self = Staleness::default();
    }
}

/// A source's staleness: its publisher-side backlog plus what was read and not applied
/// (`write::worker::lag`).
pub fn source_staleness(behind: Duration, receive_lag: Duration) -> Duration {
    behind + receive_lag
}

/// Whether a source this stale is withheld from scores under `bound_ms` (0 = never).
pub fn past_bound(staleness: Duration, bound_ms: u64) -> bool {
    bound_ms > 0 && staleness > Duration::from_millis(bound_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine whose wall clock reads ours plus `skew_s`, and a server reading its socket.
    struct Run {
        s: Staleness,
        now_ms: u64,
        skew_s: f64,
        /// The last batch's real backlog.
        backlog_ms: u64,
    }

    impl Run {
        fn new(skew_s: f64) -> Run {
            Run { s: Staleness::default(), now_ms: 1_000, skew_s, backlog_ms: 0 }
        }
        /// Our clock as wall seconds (any epoch: only differences count).
        fn wall(&self) -> f64 {
            1.7e9 + self.now_ms as f64 / 1e3
        }
        /// A batch made `backlog_ms` ago arrives now (`step_ms` after the last) and is applied at
        /// once; returns the estimate.
        fn batch(&mut self, step_ms: u64, backlog_ms: u64) -> u64 {
            self.now_ms += step_ms;
            self.backlog_ms = backlog_ms;
            let ts = self.wall() - backlog_ms as f64 / 1e3 + self.skew_s;
            self.s.observe(Some(Arrival { received_ms: self.now_ms, waited_ms: 0 }), ts);
            self.behind()
        }
        /// A backlog building up to `to_ms`: batches 10 ms apart, all made when it began (a
        /// publisher's queue the server reads slower than it fills).
        fn build(&mut self, to_ms: u64) -> u64 {
            while self.backlog_ms < to_ms {
                self.batch(10, self.backlog_ms + 10);
            }
            self.behind()
        }
        /// The backlog now, to the nearest ms (the baseline drifts by fractions of one).
        fn behind(&self) -> u64 {
            (self.s.behind(self.now_ms).as_secs_f64() * 1e3).round() as u64
        }
    }

    /// `got` is `want` less the baseline's drift allowance over the few seconds it took.
    #[track_caller]
    fn near(got: u64, want: u64) {
        assert!(got <= want && want - got <= 5, "{got} ms behind, not about {want}");
    }

    #[test]
    fn a_backlog_that_builds_is_seen_whatever_the_skew() {
        for skew in [0.0, 3600.0, -3600.0, 1e6] {
            let mut r = Run::new(skew);
            for _ in 0..20 {
                assert_eq!(r.batch(10, 0), 0, "skew {skew}: steady, fresh");
            }
            // 2x overload: each batch waits 5 ms longer than the one before (10 ms apart).
            let mut last = 0;
            for i in 1..=2_000 {
                last = r.batch(10, 5 * i);
            }
            // Less the baseline's drift allowance over those 20 s.
            assert!((9_970..=10_000).contains(&last), "skew {skew}: {last} ms behind");
            // It drains: less behind, then fresh.
            assert!(r.batch(1, 2_000) <= 2_000);
            assert_eq!(r.batch(1, 0), 0);
        }
    }

    #[test]
    fn recorded_timestamps_far_in_the_past_are_a_skew_not_a_lag() {
        let mut r = Run::new(-5e8);
        assert_eq!(r.batch(0, 0), 0);
        assert_eq!(r.batch(10, 0), 0);
        near(r.build(500), 500);
    }

    #[test]
    fn an_engine_clock_stepping_forward_lowers_the_baseline() {
        let mut r = Run::new(0.0);
        r.batch(10, 0);
        r.skew_s = 3600.0;
        assert_eq!(r.batch(10, 0), 0);
        near(r.build(300), 300);
    }

    #[test]
    fn an_engine_clock_stepping_back_is_not_read_as_lag() {
        let mut r = Run::new(0.0);
        r.batch(10, 0);
        r.batch(10, 0);
        r.skew_s = -3600.0;
        assert_eq!(r.batch(10, 0), 0, "a step back during no backlog");
        assert_eq!(r.batch(10, 0), 0);
        // And during one: the backlog carries over the step.
        near(r.build(400), 400);
        r.skew_s = -7200.0;
        near(r.batch(10, 410), 400); // as far behind as the batch before
        near(r.build(450), 450 - 10);
    }

    #[test]
    fn slow_drift_is_absorbed_but_a_backlog_is_not() {
        let mut r = Run::new(0.0);
        // Our clock runs 100 ppm faster than the engine's for ten minutes, batches every 50 ms.
        for _ in 0..12_000 {
            r.skew_s -= 50e-3 * 100e-6;
            assert!(r.batch(50, 0) < 10, "drift is not lag");
        }
        near(r.build(3_000), 3_000);
    }

    #[test]
    fn a_source_with_nothing_new_is_not_stale_and_its_next_batch_after_idle_is_fresh() {
        let mut r = Run::new(0.0);
        r.batch(10, 0);
        near(r.build(800), 800);
        r.now_ms += HOLD_MS;
        near(r.behind(), 800); // held while more may come
        r.now_ms += 1;
        assert_eq!(r.behind(), 0, "nothing in flight");
        // Recorded frames sent at a test's pace: ts moves 16 ms per frame, we wait 200 ms.
        let mut r = Run::new(-5e8);
        for i in 0..500 {
            r.now_ms += 200;
            let ts = 1_718_000_000.125 + 0.016 * i as f64;
            r.s.observe(Some(Arrival { received_ms: r.now_ms, waited_ms: 3 }), ts);
            assert_eq!(r.behind(), 0, "frame {i}");
        }
    }

    #[test]
    fn a_batch_that_waited_behind_others_is_not_taken_for_fresh() {
        let mut r = Run::new(0.0);
        r.batch(10, 0);
        near(r.build(3_000), 3_000);
        // The next one (made with the others) came 500 ms later, after 400 ms in our queue.
        r.now_ms += 500;
        let ts = r.wall() - 3.5;
        r.s.observe(Some(Arrival { received_ms: r.now_ms, waited_ms: 400 }), ts);
        near(r.behind(), 3_500);
    }

    #[test]
    fn a_reset_forgets_the_old_process_clock() {
        let mut r = Run::new(0.0);
        r.batch(10, 0);
        r.build(2_000);
        r.s.reset();
        assert_eq!(r.behind(), 0);
        r.skew_s = 42.0;
        assert_eq!(r.batch(10, 0), 0, "the new process's first batch is its baseline");
        near(r.build(700), 700);
    }

    #[test]
    fn replayed_batches_and_unreadable_timestamps_change_nothing() {
        let mut r = Run::new(0.0);
        r.batch(10, 0);
        r.build(600);
        // A replayed batch from an hour ago.
        r.s.observe(None, r.wall() - 3600.0);
        for ts in [f64::NAN, f64::INFINITY, -1e300] {
            r.s.observe(Some(Arrival { received_ms: r.now_ms, waited_ms: 0 }), ts);
        }
        near(r.behind(), 600);
        near(r.build(610), 610);
    }

    #[test]
    fn the_bound_counts_both_sides_and_zero_is_off() {
        let ms = Duration::from_millis;
        assert_eq!(source_staleness(ms(7_000), ms(4_000)), ms(11_000));
        assert!(past_bound(ms(11_000), 10_000));
        assert!(!past_bound(ms(10_000), 10_000));
        assert!(!past_bound(ms(1 << 40), 0));
    }
}
