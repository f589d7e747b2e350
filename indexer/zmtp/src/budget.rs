//! The bytes one socket holds at once (`Limits::max_bytes_in_flight`), and one source of a
//! listener (`Limits::max_bytes_in_flight_per_source`): unfinished messages plus messages
//! delivered to the server and not yet dropped.
//!
//! A connection takes a [`Lease`] for every byte it reads before decoding it, shrinks the
//! lease to what its decoder still holds, and hands each finished message its share; the
//! server dropping the message gives the bytes back. When the budget is spent, connections
//! wait for it (TCP pushes back on the peer) instead of allocating: that turns "a peer can
//! make us hold N bytes" into a number the operator chose. The per-source budget keeps one
//! address (many connections, each holding an unfinished message) from spending the whole
//! socket budget and stalling every other publisher.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// A byte budget shared by the connections of one socket.
#[derive(Debug, Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: usize,
    used: AtomicUsize,
    /// Leases waiting in `grow`: a give notifies only when there are some, since
    /// `Notify::notify_waiters` takes a lock and gives happen once per message.
    waiting: AtomicUsize,
    freed: Notify,
}

impl Budget {
    pub fn new(limit: usize) -> Budget {
        Budget {
            inner: Arc::new(Inner {
                limit,
                used: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                freed: Notify::new(),
            }),
        }
    }

    /// Bytes held right now.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// An empty lease on this budget.
    pub fn lease(&self) -> Lease {
        Lease { budget: self.clone(), source: None, bytes: 0 }
    }

    /// An empty lease on this budget and on a source's budget: every byte counts on both.
    pub fn lease_with(&self, source: Budget) -> Lease {
        Lease { budget: self.clone(), source: Some(source), bytes: 0 }
    }

    fn try_take(&self, n: usize) -> bool {
        let inner = &*self.inner;
        let mut used = inner.used.load(Ordering::SeqCst);
        loop {
            if used + n > inner.limit {
                return false;
            }
            match inner.used.compare_exchange_weak(used, used + n, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    fn give(&self, n: usize) {
        if n > 0 {
            // SeqCst pairs with `grow`: either we see its waiting count, or it sees our bytes.
            self.inner.used.fetch_sub(n, Ordering::SeqCst);
            if self.inner.waiting.load(Ordering::SeqCst) > 0 {
                self.inner.freed.notify_waiters();
            }
        }
    }
}

/// Counts a `grow` as waiting on its budgets for as long as it lives (a cancelled `grow`
/// stops counting too).
struct Waiting<'a>([Option<&'a Budget>; 2]);

impl<'a> Waiting<'a> {
    fn new(budgets: [Option<&'a Budget>; 2]) -> Waiting<'a> {
        for b in budgets.iter().flatten() {
            b.inner.waiting.fetch_add(1, Ordering::SeqCst);
        }
        Waiting(budgets)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        for b in self.0.iter().flatten() {
            b.inner.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Bytes taken from a [`Budget`] (and its source's); given back when dropped.
#[derive(Debug)]
pub struct Lease {
    budget: Budget,
    source: Option<Budget>,
    bytes: usize,
}

impl Lease {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Grows the lease by `n` bytes, waiting until the budget has them. Cancel-safe: a
    /// cancelled call has taken nothing.
    pub async fn grow(&mut self, n: usize) {
        if self.try_grow(n) {
            return;
        }
        let (budget, source) = (self.budget.clone(), self.source.clone());
        let _waiting = Waiting::new([Some(&budget), source.as_ref()]);
        loop {
            let freed = budget.inner.freed.notified();
            let source_freed = source.as_ref().map(|s| s.inner.freed.notified());
            tokio::pin!(freed, source_freed);
            freed.as_mut().enable();
            if let Some(s) = source_freed.as_mut().as_pin_mut() {
                s.enable();
            }
            if self.try_grow(n) {
                return;
            }
            match source_freed.as_pin_mut() {
                Some(s) => {
                    tokio::select! {
                        () = freed => {}
                        () = s => {}
                    }
                }
                None => freed.await,
            }
        }
    }

    /// Grows the lease by `n` bytes if the budgets have them now.
    pub fn try_grow(&mut self, n: usize) -> bool {
        if let Some(source) = &self.source {
            if !source.try_take(n) {
                return false;
            }
        }
        if !self.budget.try_take(n) {
            if let Some(source) = &self.source {
                source.give(n);
            }
            return false;
        }
        self.bytes += n;
        true
    }

    /// Gives back everything above `n` bytes.
    pub fn shrink_to(&mut self, n: usize) {
        if self.bytes > n {
            self.give(self.bytes - n);
            self.bytes = n;
        }
    }

    /// Moves `n` bytes (at most all of them) into a new lease.
    pub fn split(&mut self, n: usize) -> Lease {
        let n = n.min(self.bytes);
        self.bytes -= n;
        Lease { budget: self.budget.clone(), source: self.source.clone(), bytes: n }
    }

    fn give(&self, n: usize) {
        self.budget.give(n);
        if let Some(source) = &self.source {
            source.give(n);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.give(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiting_grow_proceeds_when_bytes_come_back() {
        let budget = Budget::new(100);
        let mut a = budget.lease();
        a.grow(80).await;
        let held = a.split(50);
        assert_eq!((a.bytes(), held.bytes(), budget.used()), (30, 50, 80));
        let mut b = budget.lease();
        assert!(!b.try_grow(30));
        let waiter = tokio::spawn(async move {
            b.grow(30).await;
            b
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the budget had no room");
        drop(held);
        let b = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert_eq!((b.bytes(), budget.used()), (30, 60));
        a.shrink_to(0);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_full_source_waits_while_others_proceed() {
        let total = Budget::new(1000);
        let (src_a, src_b) = (Budget::new(100), Budget::new(100));
        let mut a = total.lease_with(src_a.clone());
        a.grow(100).await;
        let mut a2 = total.lease_with(src_a.clone());
        assert!(!a2.try_grow(1), "source a is full");
        assert_eq!(total.used(), 100, "a refused grow takes nothing from the total");
        let mut b = total.lease_with(src_b.clone());
        assert!(b.try_grow(100));
        let waiter = tokio::spawn(async move {
            a2.grow(10).await;
            a2
        });
        drop(a.split(10));
        let a2 = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert_eq!((a2.bytes(), src_a.used(), src_b.used(), total.used()), (10, 100, 100, 200));
    }
}
