//! What a writer unlinks (replaced run lists and hash storage, outgrown branch and engine
//! tables, emptied segments), kept beside its lock and freed by the writers themselves once no
//! reader can still hold it.
//!
//! Why not `Guard::defer_destroy`: crossbeam-epoch runs deferred destructors on whichever
//! thread collects, and every thread collects on one pin in 128, readers included, up to 8
//! bags of 64 destructors at a time. A reader that pins once per query would then free
//! writers' garbage (run lists, branch tables of hundreds of kB) inside one query in 128, and
//! take the allocator's locks of the writers' arenas to do it: the read tail under ingest.
//!
//! Here the epoch only tells when a grace period has passed: objects are retired in batches,
//! and each batch closed defers one marker that records the batch as passed (a counter bump,
//! all a collecting reader ever runs for it). The writer that next stores or retires anything
//! under the same lock frees every batch whose marker ran. A marker covers every batch closed
//! before it too (their objects were unlinked before it was deferred), so markers that run out
//! of order are harmless.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_epoch::{Guard, Shared};

/// A batch is closed (its marker deferred) once it holds this many objects, or this many
/// bytes (so a large object waits no longer than a grace period). The open batch waits for
/// more, so this bounds what an idle lock keeps: after a 10M-residency fill (64 shards) at
/// 128 objects 1.7 MB more RSS than freeing at once, at 16 objects 0.6 MB.
const BATCH_OBJECTS: usize = 16;
const BATCH_BYTES: usize = 8 << 10;

/// A thread hands its deferred functions to the global queue once it has closed this many
/// batches, so a bag a collecting reader pops holds at most this many markers, while bags are
/// pushed no more often than crossbeam pushes full ones (64 deferred objects).
const MARKERS_PER_BAG: u32 = 4;

thread_local! {
    /// Batches this thread closed since it last flushed its deferred functions.
    static CLOSED_SINCE_FLUSH: Cell<u32> = const { Cell::new(0) };
}

/// One unlinked object, type-erased: its pointer and how to free it.
struct Garbage {
    ptr: *mut (),
    free: unsafe fn(*mut ()),
}

// SAFETY: built only from `Shared<T>` with `T: Send` (see `Retired::retire`), and owned
// exclusively: nothing else reaches the object once it is retired.
unsafe impl Send for Garbage {}

impl Drop for Garbage {
    fn drop(&mut self) {
        // SAFETY: `free` matches `ptr`'s type, and the object is freed once (here).
        unsafe { (self.free)(self.ptr) }
    }
}

unsafe fn free_boxed<T>(ptr: *mut ()) {
    // SAFETY: `ptr` came from `Box::into_raw` of a `Box<T>` (see `Retired::retire`).
    drop(unsafe { Box::from_raw(ptr.cast::<T>()) });
}

/// The objects one lock's holders unlinked and not yet freed.
pub struct Retired {
    /// Retired objects, oldest first, each with the number of its batch.
    pending: VecDeque<(u64, Garbage)>,
    /// The batch objects are retired into now (not yet closed).
    open: u64,
    open_objects: usize,
    open_bytes: usize,
    /// The newest batch whose marker ran: no reader can hold an object of it or of any batch
    /// before it.
    passed: Arc<AtomicU64>,
}

impl Default for Retired {
    fn default() -> Self {
        Retired {
            pending: VecDeque::new(),
            open: 1,
            open_objects: 0,
            open_bytes: 0,
            passed: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Retired {
    /// Keeps `old` (about `bytes` large) until no reader can hold it, and frees what has
    /// become unreachable meanwhile.
    ///
    /// # Safety
    /// `old` must be non-null, unlinked from everything readers reach before this call, and
    /// retired once; the caller holds the lock this `Retired` belongs to.
    pub unsafe fn retire<T: Send + 'static>(&mut self, old: Shared<'_, T>, bytes: usize, guard: &Guard) {
        self.free_passed();
        // SAFETY: the caller's contract: unlinked, and ours alone to free.
        let boxed = unsafe { old.into_owned() }.into_box();
        self.pending.push_back((self.open, Garbage { ptr: Box::into_raw(boxed).cast(), free: free_boxed::<T> }));
        self.open_objects += 1;
        self.open_bytes += bytes;
        if self.open_objects >= BATCH_OBJECTS || self.open_bytes >= BATCH_BYTES {
            self.close(guard);
        }
    }

    /// Closes the open batch: a marker deferred to the epoch records it as passed once every
    /// reader pinned now has unpinned. Every few markers the thread's deferred functions are
    /// handed to the global queue, so a marker waits for a few more batches of this thread,
    /// not for 63 more deferred functions.
    pub fn close(&mut self, guard: &Guard) {
        if self.open_objects == 0 {
            return;
        }
        let (passed, batch) = (Arc::clone(&self.passed), self.open);
        guard.defer(move || passed.fetch_max(batch, Ordering::Release));
        let closed = CLOSED_SINCE_FLUSH.with(|c| {
            c.set(c.get() + 1);
            c.get()
        });
        if closed >= MARKERS_PER_BAG {
            CLOSED_SINCE_FLUSH.with(|c| c.set(0));
            guard.flush();
        }
        self.open += 1;
        self.open_objects = 0;
        self.open_bytes = 0;
    }

    /// Frees the objects of every batch whose marker ran.
    pub fn free_passed(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let passed = self.passed.load(Ordering::Acquire);
        while self.pending.front().is_some_and(|(batch, _)| *batch <= passed) {
            self.pending.pop_front();
        }
    }

    /// Objects retired and not yet freed.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use crossbeam_epoch::{self as epoch, Atomic, Owned};

    use super::*;

    /// Counts its drops, and which thread ran them.
    struct Tracked {
        drops: Arc<AtomicUsize>,
        dropped_on: Arc<Mutex<Vec<std::thread::ThreadId>>>,
    }

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::SeqCst);
            self.dropped_on.lock().unwrap().push(std::thread::current().id());
        }
    }

    #[test]
    fn readers_that_pin_never_free_retired_objects_and_writers_free_them_after_a_grace_period() {
        let drops = Arc::new(AtomicUsize::new(0));
        let dropped_on = Arc::new(Mutex::new(Vec::new()));
        let slot: Atomic<Tracked> = Atomic::null();
        let mut retired = Retired::default();
        let total = 40 * BATCH_OBJECTS + 3;
        // A reader holds the first object while it is replaced: it must outlive the reader's pin.
        let held = epoch::pin();
        slot.store(Owned::new(Tracked { drops: drops.clone(), dropped_on: dropped_on.clone() }), Ordering::Release);
        let seen = slot.load(Ordering::Acquire, &held);
        for _ in 0..total {
            let guard = epoch::pin();
            let fresh = Owned::new(Tracked { drops: drops.clone(), dropped_on: dropped_on.clone() });
            let old = slot.swap(fresh, Ordering::AcqRel, &guard);
            // SAFETY: unlinked by the swap, retired once.
            unsafe { retired.retire(old, 16, &guard) };
        }
        retired.close(&held);
        for _ in 0..1_000 {
            epoch::pin().flush();
            retired.free_passed();
        }
        // SAFETY: `held` still pins the thread that loaded `seen`.
        assert!(unsafe { seen.as_ref() }.is_some());
        assert_eq!(drops.load(Ordering::SeqCst), 0, "nothing is freed while a reader that saw it is pinned");
        drop(held);
        // Readers pin many times (every 128th pin collects, running what expired): they run
        // the markers, never a destructor.
        let reader = std::thread::spawn(move || {
            for _ in 0..100_000 {
                drop(epoch::pin());
            }
            std::thread::current().id()
        });
        let reader = reader.join().unwrap();
        // The writer frees them once their markers ran (pins and flushes advance the epoch).
        let deadline = Instant::now() + Duration::from_secs(30);
        while retired.len() > 0 && Instant::now() < deadline {
            epoch::pin().flush();
            retired.free_passed();
        }
        assert_eq!(retired.len(), 0, "every batch passed its grace period");
        assert_eq!(drops.load(Ordering::SeqCst), total);
        assert!(!dropped_on.lock().unwrap().contains(&reader), "a reader's pin never runs a destructor");
        // SAFETY: the test owns the last object; no reader remains.
        drop(unsafe { slot.load(Ordering::Relaxed, epoch::unprotected()).try_into_owned() });
    }
}
