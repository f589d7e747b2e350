//! Waiting on a condition with a deadline: tests poll for what they need instead of sleeping
//! and hoping, and a timeout fails the test naming what it waited for.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(10);

/// Polls `check` until it returns `Some`, panicking with `what` once `timeout` has passed.
pub fn until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        std::thread::sleep(POLL);
    }
}

/// [`until`] for an async condition (on a tokio runtime).
pub async fn until_async<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_returns_the_value_once_the_condition_holds() {
        let mut calls = 0;
        let got = until("the third call", Duration::from_secs(5), || {
            calls += 1;
            (calls == 3).then_some(calls)
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "waiting for: nothing")]
    fn until_fails_at_the_deadline() {
        until("nothing", Duration::from_millis(30), || None::<()>);
    }
}
