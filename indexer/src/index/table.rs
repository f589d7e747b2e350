//! The block table: prefix key → the pods (and tiers) holding that block.
//!
//! Layout, chosen for memory (37.5 bytes of tables per resident (block, pod) entry at 10M
//! entries, measured by `cargo bench -p kvindex --bench footprint`):
//! - Each block is a 16-byte *slot* (its key and two inline holders) in a per-shard arena.
//!   Keys are found through a table of 4-byte slot numbers. Shards are `RwLock`ed and chosen
//!   by key bits, so a reader takes one shard's read lock per key and never waits long.
//! - Holders are 4 bytes each (pod id and tier bits). One or two sit inline; more spill to a
//!   side arena.
//! - The engine's block hash of a slot (scoped by the pod's model and KV-cache group) is
//!   recorded once per *block*, not per pod: fleets normally share one hash configuration, so
//!   pods holding the same block share the entry. A pod whose engine hashed the block
//!   differently keeps its own exception (see `ingest`).
//!
//! Writers (event application) serialize on one mutex that owns the engine table; readers
//! (scoring) never touch it. The index knows nothing about events; `ingest` drives it.

use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard, RwLock};

use super::pods::PodId;
use crate::keys::PrefixKey;

/// One pod's residency of one block: pod id in the high 24 bits, tier bits in the low 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct Holder(u32);

/// Holder values no pod can produce (pod ids stay below `pods::MAX_PODS`).
const EMPTY: Holder = Holder(u32::MAX);
const SPILLED: Holder = Holder(u32::MAX - 1);

impl Holder {
    pub fn new(pod: PodId, tiers: u8) -> Self {
        Holder((pod.0 << 8) | u32::from(tiers))
    }
    pub fn pod(self) -> PodId {
        PodId(self.0 >> 8)
    }
    pub fn tiers(self) -> u8 {
        self.0 as u8
    }
}

/// A block slot's global number: shard in the high bits, position in the shard below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(pub u32);

/// A block: its key and holders. `[EMPTY, _]` marks a free slot; `[SPILLED, i]` points to
/// `spill[i]` (more than two holders, sorted by pod).
#[derive(Debug, Clone, Copy)]
struct Slot {
    key: PrefixKey,
    holders: [Holder; 2],
}

#[derive(Default)]
struct KeyShard {
    slots: Vec<Slot>,
    free: Vec<u32>,
    by_key: HashTable<u32>,
    spill: Vec<Vec<Holder>>,
    spill_free: Vec<u32>,
}

/// Prefix keys are XXH3 outputs, already uniform; the table hashes them as they are.
#[inline]
fn key_hash(key: PrefixKey) -> u64 {
    key
}

impl KeyShard {
    fn find(&self, key: PrefixKey) -> Option<u32> {
        let slots = &self.slots;
        self.by_key.find(key_hash(key), |&i| slots[i as usize].key == key).copied()
    }

    fn holders(&self, local: u32) -> &[Holder] {
        let slot = &self.slots[local as usize];
        match slot.holders {
            [EMPTY, _] => &[],
            [SPILLED, Holder(i)] => &self.spill[i as usize],
            [_, EMPTY] => &slot.holders[..1],
            _ => &slot.holders[..],
        }
    }

    fn set_holders(&mut self, local: u32, holders: &[Holder]) {
        let old = self.slots[local as usize].holders;
        if let [SPILLED, Holder(i)] = old {
            if holders.len() > 2 {
                let v = &mut self.spill[i as usize];
                v.clear();
                v.extend_from_slice(holders);
                return;
            }
            self.spill[i as usize] = Vec::new();
            self.spill_free.push(i);
        }
        self.slots[local as usize].holders = match holders {
            [] => [EMPTY, EMPTY],
            [a] => [*a, EMPTY],
            [a, b] => [*a, *b],
            many => {
                let i = match self.spill_free.pop() {
                    Some(i) => {
                        self.spill[i as usize] = many.to_vec();
                        i
                    }
                    None => {
                        self.spill.push(many.to_vec());
                        (self.spill.len() - 1) as u32
                    }
                };
                [SPILLED, Holder(i)]
            }
        };
    }

    fn bytes(&self) -> u64 {
        let spilled: usize = self.spill.iter().map(|v| v.capacity() * 4 + 24).sum();
        (self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.free.capacity() * 4
            + self.by_key.capacity() * 5
            + spilled
            + self.spill_free.capacity() * 4) as u64
    }
}

/// Writer-side state: the engine hash recorded for each slot and the table over it.
#[derive(Default)]
pub struct EngineTable {
    /// Per shard, per local slot: the scoped engine hash recorded for the slot (0 = none).
    slot_engine: Vec<Vec<u64>>,
    by_engine: HashTable<u32>,
}

impl EngineTable {
    fn engine(&self, shard_bits: u32, slot: SlotId) -> u64 {
        let (shard, local) = split(shard_bits, slot);
        self.slot_engine[shard].get(local as usize).copied().unwrap_or(0)
    }

    fn bytes(&self) -> u64 {
        let engines: usize = self.slot_engine.iter().map(|v| v.capacity() * 8).sum();
        (engines + self.by_engine.capacity() * 5) as u64
    }
}

fn split(shard_bits: u32, slot: SlotId) -> (usize, u32) {
    if shard_bits == 0 {
        (0, slot.0)
    } else {
        ((slot.0 >> (32 - shard_bits)) as usize, slot.0 & (u32::MAX >> shard_bits))
    }
}

/// Sharded key → holders index with a bound on resident (block, pod) entries.
pub struct BlockTable {
    shards: Box<[RwLock<KeyShard>]>,
    shard_bits: u32,
    writer: Mutex<EngineTable>,
    entries: AtomicU64,
    keys: AtomicU64,
    max_entries: u64,
}

/// What [`Writer::insert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inserted {
    pub slot: SlotId,
    /// Tiers the pod held the block in before (0 = a new residency).
    pub prev_tiers: u8,
    /// Whether the slot's recorded engine hash is the one given (else the caller keeps its
    /// own mapping for it).
    pub engine_recorded: bool,
}

impl BlockTable {
    /// `shards` is rounded up to a power of two (at most 256); `max_entries` bounds (block, pod)
    /// residencies.
    pub fn new(shards: usize, max_entries: u64) -> Self {
        let shards = shards.clamp(1, 256).next_power_of_two();
        let shard_bits = shards.trailing_zeros();
        BlockTable {
            shards: (0..shards).map(|_| RwLock::new(KeyShard::default())).collect(),
            shard_bits,
            writer: Mutex::new(EngineTable { slot_engine: vec![Vec::new(); shards], by_engine: HashTable::new() }),
            entries: AtomicU64::new(0),
            keys: AtomicU64::new(0),
            max_entries,
        }
    }

    #[inline]
    fn shard_of(&self, key: PrefixKey) -> usize {
        // The table buckets by the low bits and tags with the top 7; shard by the bits below
        // the tag so neither is constant within a shard.
        if self.shard_bits == 0 {
            0
        } else {
            ((key << 7) >> (64 - self.shard_bits)) as usize
        }
    }

    fn slot_id(&self, shard: usize, local: u32) -> SlotId {
        SlotId(if self.shard_bits == 0 { local } else { ((shard as u32) << (32 - self.shard_bits)) | local })
    }

    fn max_local(&self) -> u32 {
        u32::MAX >> self.shard_bits
    }

    /// Resident (block, pod) entries.
    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// Distinct blocks with at least one holder.
    pub fn keys(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    pub fn max_entries(&self) -> u64 {
        self.max_entries
    }

    /// Calls `f` with the holders of `key` (sorted by pod), under the shard's read lock.
    #[inline]
    pub fn with_holders<R>(&self, key: PrefixKey, f: impl FnOnce(&[Holder]) -> R) -> R {
        let shard = self.shards[self.shard_of(key)].read();
        match shard.find(key) {
            Some(local) => f(shard.holders(local)),
            None => f(&[]),
        }
    }

    /// The tiers `pod` holds `key` in (0 = not held).
    pub fn tiers_of(&self, key: PrefixKey, pod: PodId) -> u8 {
        self.with_holders(key, |hs| hs.binary_search_by_key(&pod, |h| h.pod()).map(|i| hs[i].tiers()).unwrap_or(0))
    }

    /// Exclusive write access. Writers serialize here; readers are unaffected.
    pub fn writer(&self) -> Writer<'_> {
        Writer { table: self, engines: self.writer.lock() }
    }

    /// Heap bytes held by the tables (slots, key and engine tables, spilled holders).
    pub fn approx_bytes(&self) -> u64 {
        let shards: u64 = self.shards.iter().map(|s| s.read().bytes()).sum();
        shards + self.writer.lock().bytes()
    }

    fn reserve_entry(&self) -> bool {
        let prev = self.entries.fetch_add(1, Ordering::Relaxed);
        if prev >= self.max_entries {
            self.entries.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// Write access to the table: holds the writer mutex.
pub struct Writer<'a> {
    table: &'a BlockTable,
    engines: MutexGuard<'a, EngineTable>,
}

impl Writer<'_> {
    /// The slot recorded for scoped engine hash `engine`, if any.
    pub fn slot_of_engine(&self, engine: u64) -> Option<SlotId> {
        if engine == 0 {
            return None;
        }
        let bits = self.table.shard_bits;
        let engines = &*self.engines;
        engines.by_engine.find(engine, |&s| engines.engine(bits, SlotId(s)) == engine).map(|&s| SlotId(s))
    }

    /// The scoped engine hash recorded for a slot (0 = none).
    pub fn engine_of(&self, slot: SlotId) -> u64 {
        self.engines.engine(self.table.shard_bits, slot)
    }

    /// The key of a live slot.
    pub fn key_of(&self, slot: SlotId) -> Option<PrefixKey> {
        let (shard, local) = split(self.table.shard_bits, slot);
        let shard = self.table.shards[shard].read();
        let s = shard.slots.get(local as usize)?;
        (s.holders[0] != EMPTY).then_some(s.key)
    }

    /// Records that `pod` holds `key` in `tier_bit`, creating the block's slot if needed and
    /// recording `engine` (a scoped engine hash, 0 = none) for a new slot. `None` when the entry
    /// bound refuses a new residency.
    pub fn insert(&mut self, key: PrefixKey, engine: u64, pod: PodId, tier_bit: u8) -> Option<Inserted> {
        let table = self.table;
        let shard_idx = table.shard_of(key);
        let mut shard = table.shards[shard_idx].write();
        let KeyShard { slots, by_key, free, .. } = &mut *shard;
        let (local, created) = match by_key.entry(
            key_hash(key),
            |&i| slots[i as usize].key == key,
            |&i| key_hash(slots[i as usize].key),
        ) {
            hashbrown::hash_table::Entry::Occupied(e) => (*e.get(), false),
            hashbrown::hash_table::Entry::Vacant(v) => {
                if !table.reserve_entry() {
                    return None;
                }
                let local = match free.pop() {
                    Some(local) => {
                        slots[local as usize] = Slot { key, holders: [EMPTY, EMPTY] };
                        local
                    }
                    None => {
                        if slots.len() as u64 > u64::from(table.max_local()) {
                            table.entries.fetch_sub(1, Ordering::Relaxed);
                            return None;
                        }
                        slots.push(Slot { key, holders: [EMPTY, EMPTY] });
                        (slots.len() - 1) as u32
                    }
                };
                v.insert(local);
                table.keys.fetch_add(1, Ordering::Relaxed);
                (local, true)
            }
        };
        let slot = table.slot_id(shard_idx, local);
        let mut holders: smallvec::SmallVec<[Holder; 4]> = shard.holders(local).into();
        let prev_tiers = match holders.binary_search_by_key(&pod, |h| h.pod()) {
            Ok(i) => {
                let prev = holders[i].tiers();
                if prev & tier_bit == 0 {
                    holders[i] = Holder::new(pod, prev | tier_bit);
                    shard.set_holders(local, &holders);
                }
                prev
            }
            Err(i) => {
                if !created && !table.reserve_entry() {
                    return None;
                }
                holders.insert(i, Holder::new(pod, tier_bit));
                shard.set_holders(local, &holders);
                0
            }
        };
        drop(shard);
        let engine_recorded = if created {
            self.record_engine(shard_idx, local, slot, engine)
        } else {
            engine != 0 && self.engines.engine(table.shard_bits, slot) == engine
        };
        Some(Inserted { slot, prev_tiers, engine_recorded })
    }

    fn record_engine(&mut self, shard: usize, local: u32, slot: SlotId, engine: u64) -> bool {
        let bits = self.table.shard_bits;
        let EngineTable { slot_engine, by_engine } = &mut *self.engines;
        let column = &mut slot_engine[shard];
        if column.len() <= local as usize {
            column.resize(local as usize + 1, 0);
        }
        column[local as usize] = 0;
        if engine == 0 {
            return false;
        }
        let engine_of = |s: u32| {
            let (sh, l) = split(bits, SlotId(s));
            slot_engine[sh].get(l as usize).copied().unwrap_or(0)
        };
        match by_engine.entry(engine, |&s| engine_of(s) == engine, |&s| engine_of(s)) {
            hashbrown::hash_table::Entry::Occupied(_) => return false,
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(slot.0);
            }
        }
        slot_engine[shard][local as usize] = engine;
        true
    }

    /// Removes the tiers in `tier_mask` of `pod`'s residency of `slot`, freeing the slot when
    /// no pod holds it any more. Returns the pod's tiers before and after.
    pub fn remove(&mut self, slot: SlotId, pod: PodId, tier_mask: u8) -> (u8, u8) {
        let table = self.table;
        let (shard_idx, local) = split(table.shard_bits, slot);
        let mut shard = table.shards[shard_idx].write();
        if shard.slots.get(local as usize).is_none_or(|s| s.holders[0] == EMPTY) {
            return (0, 0);
        }
        let mut holders: smallvec::SmallVec<[Holder; 4]> = shard.holders(local).into();
        let Ok(i) = holders.binary_search_by_key(&pod, |h| h.pod()) else { return (0, 0) };
        let prev = holders[i].tiers();
        let left = prev & !tier_mask;
        if left == prev {
            return (prev, left);
        }
        if left != 0 {
            holders[i] = Holder::new(pod, left);
        } else {
            holders.remove(i);
            table.entries.fetch_sub(1, Ordering::Relaxed);
        }
        shard.set_holders(local, &holders);
        if holders.is_empty() {
            let key = shard.slots[local as usize].key;
            if let Ok(entry) = shard.by_key.find_entry(key_hash(key), |&l| l == local) {
                entry.remove();
            }
            shard.free.push(local);
            table.keys.fetch_sub(1, Ordering::Relaxed);
            drop(shard);
            self.forget_engine(shard_idx, local, slot);
        }
        (prev, left)
    }

    fn forget_engine(&mut self, shard: usize, local: u32, slot: SlotId) {
        let engines = &mut *self.engines;
        let Some(engine) = engines.slot_engine[shard].get_mut(local as usize) else { return };
        let e = std::mem::take(engine);
        if e != 0 {
            if let Ok(entry) = engines.by_engine.find_entry(e, |&s| s == slot.0) {
                entry.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: u8 = 1;
    const CPU: u8 = 2;

    fn pods_of(idx: &BlockTable, key: u64) -> Vec<u32> {
        idx.with_holders(key, |h| h.iter().map(|h| h.pod().0).collect())
    }

    #[test]
    fn holders_stay_sorted_through_spill_and_shrink() {
        let idx = BlockTable::new(4, u64::MAX);
        let mut w = idx.writer();
        let mut slot = None;
        for p in [5, 1, 9, 3, 7] {
            let ins = w.insert(42, 0, PodId(p), GPU).unwrap();
            assert_eq!(ins.prev_tiers, 0);
            assert_eq!(*slot.get_or_insert(ins.slot), ins.slot, "one slot per key");
        }
        drop(w);
        assert_eq!(pods_of(&idx, 42), [1, 3, 5, 7, 9]);
        let slot = slot.unwrap();
        let mut w = idx.writer();
        for p in [1, 9, 5] {
            assert_eq!(w.remove(slot, PodId(p), GPU), (GPU, 0));
        }
        drop(w);
        assert_eq!(pods_of(&idx, 42), [3, 7]);
        assert_eq!(idx.entries(), 2);
        let mut w = idx.writer();
        w.remove(slot, PodId(3), GPU);
        w.remove(slot, PodId(7), GPU);
        assert_eq!(w.key_of(slot), None, "freed");
        drop(w);
        assert_eq!((idx.entries(), idx.keys()), (0, 0));
        assert!(pods_of(&idx, 42).is_empty());
    }

    #[test]
    fn tiers_are_bits_of_one_residency() {
        let idx = BlockTable::new(1, u64::MAX);
        let mut w = idx.writer();
        let s = w.insert(1, 0, PodId(0), GPU).unwrap().slot;
        assert_eq!(w.insert(1, 0, PodId(0), CPU).unwrap().prev_tiers, GPU);
        assert_eq!(w.insert(1, 0, PodId(0), CPU).unwrap().prev_tiers, GPU | CPU);
        drop(w);
        assert_eq!(idx.entries(), 1);
        assert_eq!(idx.tiers_of(1, PodId(0)), GPU | CPU);
        let mut w = idx.writer();
        assert_eq!(w.remove(s, PodId(0), CPU), (GPU | CPU, GPU));
        assert_eq!(w.remove(s, PodId(0), GPU), (GPU, 0));
        assert_eq!(w.remove(s, PodId(0), GPU), (0, 0), "removing twice is harmless");
        drop(w);
        assert_eq!(idx.tiers_of(1, PodId(0)), 0);
    }

    #[test]
    fn entry_bound_refuses_new_residencies_only() {
        let idx = BlockTable::new(2, 2);
        let mut w = idx.writer();
        assert!(w.insert(1, 0, PodId(0), GPU).is_some());
        assert!(w.insert(2, 0, PodId(0), GPU).is_some());
        assert!(w.insert(3, 0, PodId(0), GPU).is_none());
        assert!(w.insert(1, 0, PodId(1), GPU).is_none());
        assert_eq!(w.insert(1, 0, PodId(0), CPU).unwrap().prev_tiers, GPU, "a new tier is not a new entry");
        drop(w);
        assert_eq!(idx.entries(), 2);
        assert_eq!(idx.keys(), 2);
        assert_eq!(idx.tiers_of(3, PodId(0)), 0);
    }

    #[test]
    fn engine_hash_is_recorded_once_per_block_and_freed_with_it() {
        let idx = BlockTable::new(4, u64::MAX);
        let mut w = idx.writer();
        let a = w.insert(100, 0xe1, PodId(0), GPU).unwrap();
        assert!(a.engine_recorded);
        let b = w.insert(100, 0xe1, PodId(1), GPU).unwrap();
        assert!(b.engine_recorded, "same engine hash from another pod shares the entry");
        let c = w.insert(100, 0xe2, PodId(2), GPU).unwrap();
        assert!(!c.engine_recorded, "a different engine hash is the caller's exception");
        assert_eq!(w.slot_of_engine(0xe1), Some(a.slot));
        assert_eq!(w.slot_of_engine(0xe2), None);
        let d = w.insert(200, 0xe1, PodId(3), GPU).unwrap();
        assert!(!d.engine_recorded, "an engine hash already naming another block is not moved");
        for p in 0..3 {
            w.remove(a.slot, PodId(p), GPU);
        }
        assert_eq!(w.slot_of_engine(0xe1), None, "freed with its slot");
        let e = w.insert(300, 0xe1, PodId(0), GPU).unwrap();
        assert!(e.engine_recorded);
        assert_eq!(w.key_of(e.slot), Some(300));
    }

    #[test]
    fn keys_spread_over_shards() {
        let idx = BlockTable::new(16, u64::MAX);
        let shards: std::collections::HashSet<usize> =
            (0..1000u64).map(|k| idx.shard_of(xxhash_rust::xxh3::xxh3_64(&k.to_le_bytes()))).collect();
        assert_eq!(shards.len(), 16);
    }

    #[test]
    fn freed_slots_are_reused() {
        let idx = BlockTable::new(1, u64::MAX);
        let mut w = idx.writer();
        let s = w.insert(1, 0, PodId(0), GPU).unwrap().slot;
        w.remove(s, PodId(0), GPU);
        let t = w.insert(2, 0, PodId(0), GPU).unwrap().slot;
        assert_eq!(s, t);
        assert_eq!(w.key_of(t), Some(2));
        drop(w);
        assert!(pods_of(&idx, 1).is_empty());
        assert_eq!(pods_of(&idx, 2), [0]);
    }
}
