//! A per-pod map that scoring reads without taking any lock: the few pods whose score needs
//! more than the plain walk (hybrid engines' KV-cache groups, engine units and cut rules).
//!
//! Writers replace the map whole, copy-on-write under one writer lock, and free the old one
//! once no pinned reader can hold it (`crossbeam-epoch`, as the tree does); a flag says whether
//! the map holds anything, so a score of a fleet with no such pod pays one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::pods::PodId;

pub struct Published<V> {
    current: Atomic<FxHashMap<PodId, V>>,
    writer: Mutex<()>,
    any: AtomicBool,
}

impl<V> Drop for Published<V> {
    fn drop(&mut self) {
        // SAFETY: dropping the owner: no reader remains.
        unsafe {
            drop(self.current.load(Ordering::Relaxed, epoch::unprotected()).try_into_owned());
        }
    }
}

impl<V: Clone + PartialEq> Default for Published<V> {
    fn default() -> Self {
        Published { current: Atomic::new(FxHashMap::default()), writer: Mutex::new(()), any: AtomicBool::new(false) }
    }
}

impl<V: Clone + PartialEq> Published<V> {
    /// Whether any pod has an entry (readers skip the map when none has).
    #[inline]
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// The map, as long as `guard` is pinned.
    pub fn load<'g>(&self, guard: &'g Guard) -> &'g FxHashMap<PodId, V> {
        // SAFETY: replaced only by `set` (swap + defer_destroy), never null.
        unsafe { self.current.load(Ordering::Acquire, guard).deref() }
    }

    /// Sets (or with `None`, removes) `pod`'s entry; nothing is replaced when it is unchanged.
    pub fn set(&self, pod: PodId, value: Option<V>) {
        let _writer = self.writer.lock();
        let guard = epoch::pin();
        let current = self.load(&guard);
        if current.get(&pod) == value.as_ref() {
            return;
        }
        let mut next = current.clone();
        match value {
            Some(v) => next.insert(pod, v),
            None => next.remove(&pod),
        };
        self.any.store(!next.is_empty(), Ordering::Release);
        let old = self.current.swap(Owned::new(next), Ordering::AcqRel, &guard);
        // SAFETY: unlinked by the swap; readers that loaded it are pinned.
        unsafe { guard.defer_destroy(old) };
    }
}
