//! Reconnect delays for a dialling SUB: exponential from `initial` to `max`, each delay drawn
//! uniformly from its upper half ("equal jitter"), so a fleet of indexers re-dialling a
//! restarted engine (or one indexer re-dialling 64 engines after a network blip) spreads out
//! instead of arriving in lock-step.
//!
//! A refused connect (nothing listens yet: an engine still starting) is retried within
//! [`REFUSED_CEILING`] however long it has been refused: the kernel answers it at once, so it
//! costs the engine nothing (libzmq retries every 100 ms), and an engine that binds its PUB
//! after minutes of loading is joined within a second, not the `max` later the backoff has
//! grown to by then (what it publishes before we join is caught up from its replay socket, but
//! only once we are connected).

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry (libzmq's `ZMQ_RECONNECT_IVL` default is also 100 ms).
    pub initial: Duration,
    /// Cap on the delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(5) }
    }
}

/// The longest delay before retrying a refused connect.
pub const REFUSED_CEILING: Duration = Duration::from_secs(1);

impl Backoff {
    /// The delay before retry number `attempt` (0 = the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        self.jittered(self.ceiling(attempt))
    }

    /// The delay before retry number `attempt` after a refused connect: as [`Backoff::delay`],
    /// within [`REFUSED_CEILING`].
    pub fn delay_refused(&self, attempt: u32) -> Duration {
        self.jittered(self.ceiling(attempt).min(REFUSED_CEILING))
    }

    fn ceiling(&self, attempt: u32) -> Duration {
        self.initial.saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX)).min(self.max)
    }

    fn jittered(&self, ceiling: Duration) -> Duration {
        let half = ceiling / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_in_the_upper_half() {
        let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(2) };
        for attempt in 0..40 {
            let ceiling = (Duration::from_millis(100) * 2u32.saturating_pow(attempt.min(20))).min(b.max);
            let d = b.delay(attempt);
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "attempt {attempt}: {d:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
        let spread: std::collections::HashSet<_> = (0..20).map(|_| b.delay(3)).collect();
        assert!(spread.len() > 1, "delays are jittered");
    }

    #[test]
    fn a_refused_connect_is_retried_within_a_second_however_long_it_was_refused() {
        let b = Backoff::default();
        assert!(b.delay(10) >= Duration::from_millis(2_500), "a failing dial backs off to the cap");
        assert!(b.delay_refused(0) <= b.initial, "the first retry is as soon as any");
        for attempt in 0..40 {
            let d = b.delay_refused(attempt);
            assert!(d <= REFUSED_CEILING, "attempt {attempt}: {d:?}");
        }
        assert!(b.delay_refused(20) >= REFUSED_CEILING / 2, "still jittered in the upper half");
    }
}
