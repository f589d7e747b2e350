//! Engine hash (scoped by model and KV-cache group) → the block it names.
//!
//! Needed only by writers: a `BlockStored`'s parent and a `BlockRemoved` name blocks by the
//! engine's hash. One entry per *block*, not per holder: pods that hash alike share it, and a
//! pod that hashes differently keeps a per-pod exception (see `ingest`). The block records its
//! engine hash in its segment; the table finds it.
//!
//! A store records an engine hash for every block, so the table's insert is on the write path
//! of every block; it is built to cost one cache line. Each entry is 8 bytes: the block's
//! position (46 bits) and 18 bits of the engine hash, the very bits that choose its home slot.
//! Linear probing with backward-shift deletion keeps no tombstones, and growing rehashes from
//! those stored bits alone, so nothing outside the table is read except to confirm a match
//! (the block's recorded hash), which only lookups of present keys pay.
//!
//! Sharded by the hash's top bits (512 shards, each behind its own lock), so writers of
//! different pods rarely meet; readers (scoring) never come here. A store's blocks land in
//! random slots, so a writer touches them all first ([`EngineTable::prefetch`], without the
//! locks: slot arrays are atomics, replaced under the epoch when a shard grows) and their
//! cache misses overlap instead of queueing one after another.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crossbeam_epoch::{Atomic, Guard, Owned};
use parking_lot::Mutex;

use super::retired::Retired;

/// Bits of the engine hash kept in an entry: they hold the home slot for tables of up to
/// 2^TAG_BITS slots per shard.
const TAG_BITS: u32 = 18;
const SHARD_BITS: u32 = 9;
const POS_BITS: u32 = 46;
const MIN_BITS: u32 = 4;

/// Offsets a position can carry (segments are cut at this length).
pub const MAX_OFFSET: u32 = 1 << 16;

/// The 18 hash bits below the shard bits.
#[inline]
fn tag_of(engine: u64) -> u64 {
    (engine >> (64 - SHARD_BITS - TAG_BITS)) & ((1 << TAG_BITS) - 1)
}

/// A block position as 46 bits: segment (30 bits) and offset (16 bits).
#[inline]
fn pos46(block: u64) -> u64 {
    let (seg, off) = (block >> 32, block & 0xffff_ffff);
    debug_assert!(seg < 1 << 30 && off < u64::from(MAX_OFFSET));
    (seg << 16) | off
}

#[inline]
fn block_of(pos: u64) -> u64 {
    ((pos >> 16) << 32) | (pos & 0xffff)
}

/// A shard's slot array: 0 = empty; else `tag << 46 | (pos46 + 1)`.
struct Slots(Box<[AtomicU64]>);

impl Slots {
    fn new(bits: u32) -> Self {
        Slots((0..1usize << bits).map(|_| AtomicU64::new(0)).collect())
    }
    #[inline]
    fn get(&self, i: usize) -> u64 {
        self.0[i].load(Ordering::Relaxed)
    }
}

/// A shard's slots as its lock holder sees them.
struct Shard<'a> {
    slots: &'a [AtomicU64],
    bits: u32,
    len: usize,
}

trait SlotAccess {
    fn slot(&self, i: usize) -> u64;
    fn put(&self, i: usize, v: u64);
}

impl SlotAccess for [AtomicU64] {
    #[inline]
    fn slot(&self, i: usize) -> u64 {
        self[i].load(Ordering::Relaxed)
    }
    #[inline]
    fn put(&self, i: usize, v: u64) {
        self[i].store(v, Ordering::Relaxed)
    }
}

impl Shard<'_> {
    #[inline]
    fn home(&self, tag: u64) -> usize {
        (tag >> (TAG_BITS - self.bits)) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Index of the entry for `engine` (confirmed by `recorded(block)`), if any.
    fn find(&self, engine: u64, recorded: &impl Fn(u64) -> u64) -> Option<usize> {
        let tag = tag_of(engine);
        let mut i = self.home(tag);
        loop {
            let s = self.slots.slot(i);
            if s == 0 {
                return None;
            }
            if s >> POS_BITS == tag && recorded(block_of((s & ((1 << POS_BITS) - 1)) - 1)) == engine {
                return Some(i);
            }
            i = (i + 1) & self.mask();
        }
    }

    fn place(&self, slot: u64) {
        let mut i = self.home(slot >> POS_BITS);
        while self.slots.slot(i) != 0 {
            i = (i + 1) & self.mask();
        }
        self.slots.put(i, slot);
    }

    /// Removes the entry at `i`, shifting back the entries after it that probed past it.
    fn remove_at(&mut self, mut i: usize) {
        let mask = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots.slot(j);
            if s == 0 {
                break;
            }
            let home = self.home(s >> POS_BITS);
            // Move `s` into the hole at `i` unless its home lies cyclically in (i, j].
            let stays = if i <= j { i < home && home <= j } else { i < home || home <= j };
            if !stays {
                self.slots.put(i, s);
                i = j;
            }
        }
        self.slots.put(i, 0);
        self.len -= 1;
    }
}

/// Lock-held counters of a shard, and the slot arrays it outgrew, freed by its writers once no
/// prefetcher can hold them.
struct Meta {
    bits: u32,
    len: usize,
    retired: Retired,
}

struct EngineShard {
    meta: Mutex<Meta>,
    /// Owns the slot array (replaced on growth, freed under the epoch).
    slots: Atomic<Slots>,
    /// The current array's first slot and size, kept beside the lock so that reaching a slot
    /// costs no load of the array's own header. Written under the lock after `slots`.
    first: AtomicPtr<AtomicU64>,
    bits: AtomicU32,
}

impl EngineShard {
    fn new() -> Self {
        let shard = EngineShard {
            meta: Mutex::new(Meta { bits: MIN_BITS, len: 0, retired: Retired::default() }),
            slots: Atomic::new(Slots::new(MIN_BITS)),
            first: AtomicPtr::new(std::ptr::null_mut()),
            bits: AtomicU32::new(MIN_BITS),
        };
        // SAFETY: just created, never null; nobody else sees the shard yet.
        let slots = unsafe { shard.slots.load(Ordering::Relaxed, crossbeam_epoch::unprotected()).deref() };
        shard.first.store(slots.0.as_ptr().cast_mut(), Ordering::Relaxed);
        shard
    }

    fn slots<'g>(&self, guard: &'g Guard) -> &'g Slots {
        // SAFETY: replaced only by swap + retire (under the lock), never null.
        unsafe { self.slots.load(Ordering::Acquire, guard).deref() }
    }

    /// The slots, for the lock holder (`meta` proves it), without loading the array's header.
    fn view<'a>(&'a self, meta: &Meta, _guard: &'a Guard) -> Shard<'a> {
        let first = self.first.load(Ordering::Relaxed);
        // SAFETY: under the lock, `first` and `meta.bits` describe the current array (both are
        // written under the lock when it is replaced), which the guard keeps allocated.
        let slots = unsafe { std::slice::from_raw_parts(first.cast_const(), 1 << meta.bits) };
        Shard { slots, bits: meta.bits, len: meta.len }
    }

    /// Doubles the slot array (under the lock); false at the size limit.
    fn grow(&self, meta: &mut Meta, guard: &Guard) -> bool {
        if meta.bits >= TAG_BITS {
            return false;
        }
        let old = self.slots(guard);
        let new = Slots::new(meta.bits + 1);
        let view = Shard { slots: &new.0, bits: meta.bits + 1, len: meta.len };
        for i in 0..old.0.len() {
            let s = old.get(i);
            if s != 0 {
                view.place(s);
            }
        }
        meta.bits += 1;
        let first = new.0.as_ptr().cast_mut();
        let old = self.slots.swap(Owned::new(new), Ordering::AcqRel, guard);
        self.first.store(first, Ordering::Release);
        self.bits.store(meta.bits, Ordering::Release);
        // SAFETY: unlinked by the swap (never null) and retired once; prefetchers that loaded
        // it are pinned. Its batch is closed at once: a table waits no longer than a grace period.
        unsafe { meta.retired.retire(old, 8 << (meta.bits - 1), guard) };
        meta.retired.close(guard);
        guard.flush();
        true
    }
}

impl Drop for EngineShard {
    fn drop(&mut self) {
        // SAFETY: the table is being dropped: nobody else holds it.
        unsafe {
            drop(self.slots.load(Ordering::Relaxed, crossbeam_epoch::unprotected()).try_into_owned());
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch(p: *const i8) {
    // SAFETY: a prefetch is a hint: it never faults and reads nothing the program sees; `p`
    // points into a slot array kept alive by the caller's epoch guard.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn prefetch(_: *const i8) {}

pub struct EngineTable {
    shards: Box<[EngineShard]>,
}

impl Default for EngineTable {
    fn default() -> Self {
        EngineTable { shards: (0..1 << SHARD_BITS).map(|_| EngineShard::new()).collect() }
    }
}

impl EngineTable {
    #[inline]
    fn shard(&self, engine: u64) -> &EngineShard {
        &self.shards[(engine >> (64 - SHARD_BITS)) as usize]
    }

    /// The block recorded for `engine`. `recorded(block)` reads a block's recorded hash.
    pub fn get(&self, engine: u64, recorded: impl Fn(u64) -> u64, guard: &Guard) -> Option<u64> {
        let shard = self.shard(engine);
        let meta = shard.meta.lock();
        let view = shard.view(&meta, guard);
        view.find(engine, &recorded).map(|i| block_of((view.slots.slot(i) & ((1 << POS_BITS) - 1)) - 1))
    }

    /// Records `block` for `engine` unless another block has it; `set` writes the block's
    /// recorded hash (under the shard lock, before the entry is findable). Returns whether it
    /// was recorded (false also when the shard is at its size limit: then the block is only
    /// reachable by pods' exceptions, never wrongly).
    pub fn insert(
        &self,
        engine: u64,
        block: u64,
        recorded: impl Fn(u64) -> u64,
        set: impl FnOnce(),
        guard: &Guard,
    ) -> bool {
        let shard = self.shard(engine);
        let mut meta = shard.meta.lock();
        // A shard that stopped growing still frees the array it outgrew last.
        meta.retired.free_passed();
        if shard.view(&meta, guard).find(engine, &recorded).is_some() {
            return false;
        }
        if (meta.len + 1) * 5 > (1usize << meta.bits) * 4 && !shard.grow(&mut meta, guard) {
            return false;
        }
        set();
        shard.view(&meta, guard).place((tag_of(engine) << POS_BITS) | (pos46(block) + 1));
        meta.len += 1;
        true
    }

    /// Forgets `engine` → `block`; the caller clears the block's recorded hash afterwards.
    pub fn remove(&self, engine: u64, block: u64, guard: &Guard) -> bool {
        let shard = self.shard(engine);
        let mut meta = shard.meta.lock();
        let mut view = shard.view(&meta, guard);
        let want = (tag_of(engine) << POS_BITS) | (pos46(block) + 1);
        let mut i = view.home(tag_of(engine));
        loop {
            let s = view.slots.slot(i);
            if s == 0 {
                return false;
            }
            if s == want {
                view.remove_at(i);
                meta.len = view.len;
                return true;
            }
            i = (i + 1) & view.mask();
        }
    }

    /// Asks the CPU to fetch the home slot of `engine` (without locks; a hint that reads
    /// nothing), so that the cache misses of a store's inserts overlap with each other and
    /// with the store's own work.
    #[inline]
    pub fn prefetch(&self, engine: u64) {
        let shard = self.shard(engine);
        // Unlocked: the pointer and size may come from different arrays while a shard grows;
        // then the hint points somewhere useless, never anywhere harmful (a prefetch reads
        // nothing, and `wrapping_add` computes an address without using it).
        let first = shard.first.load(Ordering::Acquire);
        let bits = shard.bits.load(Ordering::Acquire).min(TAG_BITS);
        let home = first.wrapping_add((tag_of(engine) >> (TAG_BITS - bits)) as usize);
        prefetch(home.cast());
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.meta.lock().len).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| (8usize << s.meta.lock().bits) as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn block(seg: u64, off: u64) -> u64 {
        (seg << 32) | off
    }

    #[test]
    fn insert_find_remove_against_a_map_through_growth_and_shifts() {
        let table = EngineTable::default();
        let guard = crossbeam_epoch::pin();
        let mut recorded: HashMap<u64, u64> = HashMap::new();
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut keys = Vec::new();
        for i in 0..20_000u64 {
            // Few top bits so a handful of shards grow large; many keys share tags.
            let engine = (next() >> 12) | (1 << 60) | (i % 7);
            let b = block(i / 100, i % 100);
            let rec = |blk: u64| recorded.get(&blk).copied().unwrap_or(0);
            let ok = table.insert(engine, b, rec, || {}, &guard);
            assert_eq!(ok, !model.contains_key(&engine));
            if ok {
                recorded.insert(b, engine);
                model.insert(engine, b);
                keys.push(engine);
            }
            if i % 3 == 0 {
                let victim = keys.swap_remove((next() % keys.len() as u64) as usize);
                let b = model.remove(&victim).unwrap();
                assert!(table.remove(victim, b, &guard));
                recorded.remove(&b);
            }
        }
        assert_eq!(table.len(), model.len());
        for (&engine, &b) in &model {
            assert_eq!(table.get(engine, |blk| recorded.get(&blk).copied().unwrap_or(0), &guard), Some(b));
        }
        assert_eq!(table.get(12345, |_| 0, &guard), None);
    }
}
