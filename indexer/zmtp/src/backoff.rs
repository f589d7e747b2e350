//! Reconnect delays for a dialling SUB: exponential from `initial` to `max`, each delay drawn
//! uniformly from its upper half ("equal jitter"), so a fleet of indexers re-dialling a
//! restarted engine (or one indexer re-dialling 64 engines after a network blip) spreads out
//! instead of arriving in lock-step.

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

impl Backoff {
    /// The delay before retry number `attempt` (0 = the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.initial.saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX)).min(self.max);
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
}
