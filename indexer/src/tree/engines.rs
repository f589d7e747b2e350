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
//! different pods rarely meet; readers (scoring) never come here.

use parking_lot::Mutex;

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

struct Shard {
    /// 0 = empty; else `tag << 46 | (pos46 + 1)`.
    slots: Vec<u64>,
    bits: u32,
    len: usize,
}

impl Shard {
    fn new() -> Self {
        Shard { slots: vec![0; 1 << MIN_BITS], bits: MIN_BITS, len: 0 }
    }

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
            let s = self.slots[i];
            if s == 0 {
                return None;
            }
            if s >> POS_BITS == tag && recorded(block_of((s & ((1 << POS_BITS) - 1)) - 1)) == engine {
                return Some(i);
            }
            i = (i + 1) & self.mask();
        }
    }

    fn place(&mut self, slot: u64) {
        let mut i = self.home(slot >> POS_BITS);
        while self.slots[i] != 0 {
            i = (i + 1) & self.mask();
        }
        self.slots[i] = slot;
    }

    fn grow(&mut self) -> bool {
        if self.bits >= TAG_BITS {
            return false;
        }
        let old = std::mem::replace(&mut self.slots, vec![0; 1 << (self.bits + 1)]);
        self.bits += 1;
        for s in old.into_iter().filter(|&s| s != 0) {
            self.place(s);
        }
        true
    }

    /// Removes the entry at `i`, shifting back the entries after it that probed past it.
    fn remove_at(&mut self, mut i: usize) {
        let mask = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s == 0 {
                break;
            }
            let home = self.home(s >> POS_BITS);
            // Move `s` into the hole at `i` unless its home lies cyclically in (i, j].
            let stays = if i <= j { i < home && home <= j } else { i < home || home <= j };
            if !stays {
                self.slots[i] = s;
                i = j;
            }
        }
        self.slots[i] = 0;
        self.len -= 1;
    }
}

pub struct EngineTable {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for EngineTable {
    fn default() -> Self {
        EngineTable { shards: (0..1 << SHARD_BITS).map(|_| Mutex::new(Shard::new())).collect() }
    }
}

impl EngineTable {
    #[inline]
    fn shard(&self, engine: u64) -> &Mutex<Shard> {
        &self.shards[(engine >> (64 - SHARD_BITS)) as usize]
    }

    /// The block recorded for `engine`. `recorded(block)` reads a block's recorded hash.
    pub fn get(&self, engine: u64, recorded: impl Fn(u64) -> u64) -> Option<u64> {
        let shard = self.shard(engine).lock();
        shard.find(engine, &recorded).map(|i| block_of((shard.slots[i] & ((1 << POS_BITS) - 1)) - 1))
    }

    /// Records `block` for `engine` unless another block has it; `set` writes the block's
    /// recorded hash (under the shard lock, before the entry is findable). Returns whether it
    /// was recorded (false also when the shard is at its size limit: then the block is only
    /// reachable by pods' exceptions, never wrongly).
    pub fn insert(&self, engine: u64, block: u64, recorded: impl Fn(u64) -> u64, set: impl FnOnce()) -> bool {
        let mut shard = self.shard(engine).lock();
        if shard.find(engine, &recorded).is_some() {
            return false;
        }
        if (shard.len + 1) * 5 > shard.slots.len() * 4 && !shard.grow() {
            return false;
        }
        set();
        shard.place((tag_of(engine) << POS_BITS) | (pos46(block) + 1));
        shard.len += 1;
        true
    }

    /// Forgets `engine` → `block`; the caller clears the block's recorded hash afterwards.
    pub fn remove(&self, engine: u64, block: u64) -> bool {
        let mut shard = self.shard(engine).lock();
        let want = (tag_of(engine) << POS_BITS) | (pos46(block) + 1);
        let mut i = shard.home(tag_of(engine));
        loop {
            let s = shard.slots[i];
            if s == 0 {
                return false;
            }
            if s == want {
                shard.remove_at(i);
                return true;
            }
            i = (i + 1) & shard.mask();
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| (s.lock().slots.capacity() * 8) as u64).sum()
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
            let ok = table.insert(engine, b, rec, || {});
            assert_eq!(ok, !model.contains_key(&engine));
            if ok {
                recorded.insert(b, engine);
                model.insert(engine, b);
                keys.push(engine);
            }
            if i % 3 == 0 {
                let victim = keys.swap_remove((next() % keys.len() as u64) as usize);
                let b = model.remove(&victim).unwrap();
                assert!(table.remove(victim, b));
                recorded.remove(&b);
            }
        }
        assert_eq!(table.len(), model.len());
        for (&engine, &b) in &model {
            assert_eq!(table.get(engine, |blk| recorded.get(&blk).copied().unwrap_or(0)), Some(b));
        }
        assert_eq!(table.get(12345, |_| 0), None);
    }
}
