//! The bound on request bytes buffered over all ext_proc streams. Every body is buffered until
//! its end (the pick needs the whole prompt), so without a shared bound a gateway opening many
//! streams could make us hold `streams × --max-body-bytes`; past the bound a stream is shed
//! (429) instead.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub struct Budget {
    used: AtomicUsize,
    max: usize,
}

impl Budget {
    pub fn new(max: usize) -> Arc<Budget> {
        Arc::new(Budget { used: AtomicUsize::new(0), max })
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// Bytes one stream holds; given back when dropped.
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Reservation {
    pub fn new(budget: Arc<Budget>) -> Reservation {
        Reservation { budget, bytes: 0 }
    }

    /// Takes `more` bytes, or returns false (nothing taken) when the budget would be exceeded.
    pub fn grow(&mut self, more: usize) -> bool {
        let taken = self.budget.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(more).filter(|&n| n <= self.budget.max)
        });
        if taken.is_ok() {
            self.bytes += more;
        }
        taken.is_ok()
    }

    /// Gives everything back (the body was sent on).
    pub fn release(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        self.bytes = 0;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_share_the_bound_and_give_it_back() {
        let budget = Budget::new(100);
        let mut a = Reservation::new(budget.clone());
        let mut b = Reservation::new(budget.clone());
        assert!(a.grow(60));
        assert!(!b.grow(50), "past the bound");
        assert!(b.grow(40));
        assert_eq!(budget.used(), 100);
        drop(a);
        assert!(b.grow(50));
        b.release();
        assert_eq!(budget.used(), 0);
    }
}
