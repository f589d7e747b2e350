//! A segment: a chain of blocks stored one after another (one store event's new blocks, grown
//! in place while the chain continues), and the directory that numbers segments.
//!
//! Readers see a segment through two epoch-managed parts: its `storage` (the blocks' hashes,
//! and the engine hash recorded for each block, which only writers read) and its `runs` (who
//! holds which positions). A position's hash is written once, before any run list that covers
//! it is published, and never rewritten while the segment lives: a segment that lost its tail
//! is sealed and never grows again. So a reader that loads the run list, then the storage,
//! always reads the hashes of the blocks that run list describes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

use super::retired::Retired;
use super::runs::Runs;

/// Segment numbers within a shard: 22 bits (4M segments per shard).
pub const LOCAL_BITS: u32 = 22;
const CHUNK_BITS: u32 = 12;
const CHUNKS: usize = 1 << (LOCAL_BITS - CHUNK_BITS);

/// A block's place: its segment (global number: shard in the bits above `LOCAL_BITS`) and
/// offset. Packed into a u64 for the engine table and branch keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pos {
    pub seg: u32,
    pub off: u32,
}

impl Pos {
    pub fn pack(self) -> u64 {
        (u64::from(self.seg) << 32) | u64::from(self.off)
    }
    pub fn unpack(v: u64) -> Pos {
        Pos { seg: (v >> 32) as u32, off: v as u32 }
    }
    pub fn shard(self) -> usize {
        (self.seg >> LOCAL_BITS) as usize
    }
    pub fn local(self) -> u32 {
        self.seg & ((1 << LOCAL_BITS) - 1)
    }
}

pub fn global(shard: usize, local: u32) -> u32 {
    ((shard as u32) << LOCAL_BITS) | local
}

/// What a retired run list is counted as (its usual size; batches are bounded by count too).
const RUNS_BYTES: usize = 64;

/// Hashes in `[0, cap)`, recorded engine hashes in `[cap, 2·cap)`.
pub struct Storage {
    words: Box<[AtomicU64]>,
}

// `Storage::from_words` reinterprets `u64`s as `AtomicU64`s.
const _: () = assert!(
    std::mem::size_of::<AtomicU64>() == std::mem::size_of::<u64>()
        && std::mem::align_of::<AtomicU64>() == std::mem::align_of::<u64>()
);

impl Storage {
    /// A storage of exactly `hashes`, no engine hash recorded yet (a new segment's).
    pub fn of(hashes: &[u64]) -> Self {
        let mut words = Vec::with_capacity(hashes.len() * 2);
        words.extend_from_slice(hashes);
        words.resize(hashes.len() * 2, 0);
        Self::from_words(words)
    }

    /// A copy of the first `len` positions in a storage of `cap` positions, followed by
    /// `more` (at most `cap - len` hashes, no engine hash recorded yet).
    ///
    /// Only the writer that holds the segment's shard lock calls it: it is the only one that
    /// writes a storage's words, so copying them without atomic loads races with nothing (a
    /// reader only loads them too).
    pub fn copied(&self, len: usize, cap: usize, more: &[u64]) -> Self {
        let len = len.min(self.cap()).min(cap);
        let more = &more[..more.len().min(cap - len)];
        let old = self.cap();
        // SAFETY: `AtomicU64` has `u64`'s layout (asserted above); no one writes these words
        // while the caller holds the lock (see above), so plain reads race with nothing.
        let (hashes, engines) = unsafe {
            let base = self.words.as_ptr().cast::<u64>();
            (std::slice::from_raw_parts(base, len), std::slice::from_raw_parts(base.add(old), len))
        };
        let mut words = Vec::with_capacity(cap * 2);
        words.extend_from_slice(hashes);
        words.extend_from_slice(more);
        words.resize(cap, 0);
        words.extend_from_slice(engines);
        words.resize(cap * 2, 0);
        Self::from_words(words)
    }

    fn from_words(words: Vec<u64>) -> Self {
        let raw = Box::into_raw(words.into_boxed_slice());
        // SAFETY: `AtomicU64` has the size, alignment and bit validity of `u64` (asserted
        // above), and the box is unique.
        Storage { words: unsafe { Box::from_raw(raw as *mut [AtomicU64]) } }
    }

    #[inline]
    pub fn cap(&self) -> usize {
        self.words.len() / 2
    }
    #[inline]
    pub fn hash(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Relaxed)
    }
    #[inline]
    pub fn engine(&self, i: usize) -> u64 {
        self.words[self.cap() + i].load(Ordering::Relaxed)
    }
    pub fn set_hash(&self, i: usize, h: u64) {
        self.words[i].store(h, Ordering::Relaxed)
    }
    pub fn set_engine(&self, i: usize, e: u64) {
        self.words[self.cap() + i].store(e, Ordering::Relaxed)
    }
    pub fn bytes(&self) -> usize {
        self.words.len() * 8 + 16
    }
}

/// A chain of blocks and who holds them. `parent`, `from_root` and `first` never change.
pub struct Segment {
    /// The packed position of the block before this chain, or the namespace root's key.
    pub parent: u64,
    pub from_root: bool,
    /// The first block's hash (the branch key), readable without loading the storage.
    pub first: u64,
    pub storage: Atomic<Storage>,
    pub runs: Atomic<Runs>,
}

impl Segment {
    #[inline]
    pub fn runs<'g>(&self, guard: &'g Guard) -> &'g Runs {
        // SAFETY: a run list is replaced only through `swap` followed by `Retired::retire`, so
        // the list loaded under `guard` stays allocated while the guard lives; a segment always
        // has one (set at creation, never null).
        unsafe { self.runs.load(Ordering::Acquire, guard).deref() }
    }

    #[inline]
    pub fn storage<'g>(&self, guard: &'g Guard) -> &'g Storage {
        // SAFETY: as for `runs`: replaced only by swap + retire, never null.
        unsafe { self.storage.load(Ordering::Acquire, guard).deref() }
    }

    /// Publishes a new run list; the old one is freed once no reader can hold it. The caller
    /// holds the segment's shard lock, which `retired` belongs to.
    pub fn set_runs(&self, runs: Runs, retired: &mut Retired, guard: &Guard) {
        let old = self.runs.swap(Owned::new(runs), Ordering::AcqRel, guard);
        // SAFETY: `old` is unlinked by the swap (never null) and retired once; readers that
        // loaded it are pinned.
        unsafe { retired.retire(old, RUNS_BYTES, guard) };
    }

    pub fn set_storage(&self, storage: Storage, retired: &mut Retired, guard: &Guard) {
        let old = self.storage.swap(Owned::new(storage), Ordering::AcqRel, guard);
        // SAFETY: as in `set_runs`.
        let bytes = unsafe { old.deref() }.bytes();
        // SAFETY: as in `set_runs`.
        unsafe { retired.retire(old, bytes, guard) };
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: a segment is dropped only when unreachable (retired, or with the whole
        // tree), so no reader holds its parts.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            drop(self.runs.load(Ordering::Relaxed, guard).try_into_owned());
            drop(self.storage.load(Ordering::Relaxed, guard).try_into_owned());
        }
    }
}

/// Segment number → segment, for one shard. Chunks are allocated on first use and never move,
/// so a reader resolves a number with two loads and no lock.
pub struct SegmentDir {
    chunks: Box<[OnceLock<Chunk>]>,
}

type Chunk = Box<[Atomic<Segment>]>;

impl Default for SegmentDir {
    fn default() -> Self {
        SegmentDir { chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect() }
    }
}

impl SegmentDir {
    pub const MAX: u32 = 1 << LOCAL_BITS;

    #[inline]
    pub fn load<'g>(&self, local: u32, guard: &'g Guard) -> Shared<'g, Segment> {
        match self.chunks[(local >> CHUNK_BITS) as usize].get() {
            Some(chunk) => chunk[(local & ((1 << CHUNK_BITS) - 1)) as usize].load(Ordering::Acquire, guard),
            None => Shared::null(),
        }
    }

    #[inline]
    pub fn get<'g>(&self, local: u32, guard: &'g Guard) -> Option<&'g Segment> {
        // SAFETY: segments leave the directory by `take` + retire only.
        unsafe { self.load(local, guard).as_ref() }
    }

    fn slot(&self, local: u32) -> &Atomic<Segment> {
        let chunk = self.chunks[(local >> CHUNK_BITS) as usize]
            .get_or_init(|| (0..1 << CHUNK_BITS).map(|_| Atomic::null()).collect());
        &chunk[(local & ((1 << CHUNK_BITS) - 1)) as usize]
    }

    /// Publishes `seg` at an unused number.
    pub fn put(&self, local: u32, seg: Segment) {
        self.slot(local).store(Owned::new(seg), Ordering::Release);
    }

    /// Unlinks the segment at `local`; it is freed once no reader can hold it.
    pub fn take(&self, local: u32, retired: &mut Retired, guard: &Guard) {
        let old = self.slot(local).swap(Shared::null(), Ordering::AcqRel, guard);
        // SAFETY: checked non-null; the guard keeps it allocated.
        if let Some(seg) = unsafe { old.as_ref() } {
            let bytes = std::mem::size_of::<Segment>() + RUNS_BYTES + seg.storage(guard).bytes();
            // SAFETY: unlinked by the swap and retired once; pinned readers keep it alive until
            // they unpin.
            unsafe { retired.retire(old, bytes, guard) };
        }
    }

    pub fn directory_bytes(&self) -> usize {
        self.chunks.len() * std::mem::size_of::<OnceLock<Chunk>>()
            + self.chunks.iter().filter(|c| c.get().is_some()).count() * (8 << CHUNK_BITS)
    }
}

impl Drop for SegmentDir {
    fn drop(&mut self) {
        // SAFETY: dropping the directory means the tree is gone: no reader remains.
        let guard = unsafe { crossbeam_epoch::unprotected() };
        for chunk in self.chunks.iter().filter_map(OnceLock::get) {
            for slot in chunk.iter() {
                let s = slot.load(Ordering::Relaxed, guard);
                if !s.is_null() {
                    drop(unsafe { s.into_owned() });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_keeps_hashes_and_recorded_engine_hashes_and_appends_new_blocks_unrecorded() {
        let st = Storage::of(&[1, 2, 3]);
        assert_eq!(st.cap(), 3);
        assert_eq!((0..3).map(|i| (st.hash(i), st.engine(i))).collect::<Vec<_>>(), [(1, 0), (2, 0), (3, 0)]);
        st.set_engine(1, 22);
        st.set_engine(2, 33);
        let grown = st.copied(3, 6, &[4, 5]);
        assert_eq!(grown.cap(), 6);
        let grown_words: Vec<_> = (0..6).map(|i| (grown.hash(i), grown.engine(i))).collect();
        assert_eq!(grown_words, [(1, 0), (2, 22), (3, 33), (4, 0), (5, 0), (0, 0)]);
        // A shrinking copy keeps the first `len` positions; blocks past the capacity are dropped.
        let cut = grown.copied(2, 2, &[]);
        assert_eq!((0..2).map(|i| (cut.hash(i), cut.engine(i))).collect::<Vec<_>>(), [(1, 0), (2, 22)]);
        let full = cut.copied(2, 3, &[7, 8]);
        assert_eq!((0..3).map(|i| (full.hash(i), full.engine(i))).collect::<Vec<_>>(), [(1, 0), (2, 22), (7, 0)]);
        assert_eq!(full.bytes(), 3 * 16 + 16);
    }
}
