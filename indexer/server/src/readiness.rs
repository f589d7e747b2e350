//! `/readyz`: the servers are listening and every start-up sync is done (or failed). Its own
//! leaf so that whoever starts a sync (a pod's registration, discovery's first list, an apply
//! worker finishing it) and whoever answers the probe share this alone.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::telemetry as m;

#[derive(Default)]
pub struct Readiness {
    listening: AtomicBool,
    initial_syncs: AtomicUsize,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.listening.load(Ordering::Acquire) && self.initial_syncs.load(Ordering::Acquire) == 0
    }

    /// Sets `kvindex_ready` to what `/readyz` says now (called periodically: apply worker 0's
    /// tick).
    pub fn publish(&self) {
        metrics::gauge!(m::READY).set(if self.is_ready() { 1.0 } else { 0.0 });
    }

    /// Start-up replays not finished yet.
    pub fn outstanding(&self) -> usize {
        self.initial_syncs.load(Ordering::Acquire)
    }

    pub(crate) fn set_listening(&self) {
        self.listening.store(true, Ordering::Release);
    }

    pub(crate) fn sync_started(&self) {
        self.initial_syncs.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn sync_finished(&self) {
        self.initial_syncs.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One start-up sync made of many parts (the records of a sibling's bootstrap, each until its
/// stream has proven or dropped it): `/readyz` waits until every part is done or the hold is
/// released (its deadline), whichever comes first.
pub struct SharedHold {
    readiness: Arc<Readiness>,
    /// Parts not done yet, plus one for the maker until it [`seal`](SharedHold::seal)s.
    left: AtomicUsize,
    released: AtomicBool,
}

/// One part of a [`SharedHold`]: done when dropped.
pub struct HoldPart(Arc<SharedHold>);

impl SharedHold {
    /// A hold that `/readyz` waits for from now on.
    pub fn new(readiness: Arc<Readiness>) -> Arc<SharedHold> {
        readiness.sync_started();
        Arc::new(SharedHold { readiness, left: AtomicUsize::new(1), released: AtomicBool::new(false) })
    }

    /// One more part to wait for.
    pub fn part(self: &Arc<Self>) -> HoldPart {
        self.left.fetch_add(1, Ordering::AcqRel);
        HoldPart(self.clone())
    }

    /// Every part is made: the hold ends with the last one (at once if there is none).
    pub fn seal(&self) {
        self.done_one();
    }

    /// Stops waiting, whatever parts are left (idempotent).
    pub fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.readiness.sync_finished();
        }
    }

    /// Whether `/readyz` no longer waits for it.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    fn done_one(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.release();
        }
    }
}

impl Drop for HoldPart {
    fn drop(&mut self) {
        self.0.done_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_hold_ends_with_its_last_part_or_its_release() {
        let readiness = Arc::new(Readiness::default());
        readiness.set_listening();
        let hold = SharedHold::new(readiness.clone());
        let (a, b) = (hold.part(), hold.part());
        hold.seal();
        drop(a);
        assert!(!readiness.is_ready());
        drop(b);
        assert!(readiness.is_ready());
        let hold = SharedHold::new(readiness.clone());
        let part = hold.part();
        hold.seal();
        hold.release();
        assert!(readiness.is_ready(), "released at its deadline");
        drop(part);
        assert!(readiness.is_ready() && readiness.outstanding() == 0, "finished once");
        let empty = SharedHold::new(readiness.clone());
        empty.seal();
        assert!(readiness.is_ready());
    }
}
