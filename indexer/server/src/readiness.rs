//! `/readyz`: the servers are listening and every start-up sync is done (or failed). Its own
//! leaf so that whoever starts a sync (a pod's registration, discovery's first list, an apply
//! worker finishing it) and whoever answers the probe share this alone.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

#[derive(Default)]
pub struct Readiness {
    listening: AtomicBool,
    initial_syncs: AtomicUsize,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.listening.load(Ordering::Acquire) && self.initial_syncs.load(Ordering::Acquire) == 0
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
