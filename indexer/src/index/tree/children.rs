//! Branch links of one tree shard: (parent position, first block's hash) → child segment.
//!
//! A chain continues inside its segment while blocks follow one another; where two chains
//! diverge (or a chain starts under a namespace root), the continuation is a child segment
//! found here. One open-addressing table per shard, not a map per node, so a shared prefix
//! with thousands of continuations costs no per-node map and a reader one probe.
//!
//! Readers never lock: each slot is one `AtomicU64` holding a 32-bit fingerprint of the key
//! and the child's segment number, so a reader sees a whole slot or none. A fingerprint match
//! is confirmed against the child segment itself (its parent and first hash never change), so
//! a stale or colliding slot can only make a reader miss, never follow a wrong branch. The one
//! writer (the shard's lock holder) inserts in place, deletes by tombstone, and grows or
//! cleans by building a new table that replaces the old one under the epoch.

use std::sync::atomic::{AtomicU64, Ordering};

const EMPTY: u64 = 0;
const TOMBSTONE: u64 = 1;

/// Where a branch hangs: under a namespace root, or after a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentKey {
    Root(u64),
    Block(u64),
}

impl ParentKey {
    fn word(self) -> u64 {
        match self {
            ParentKey::Root(r) => r ^ 0x9e37_79b9_7f4a_7c15,
            ParentKey::Block(p) => p,
        }
    }
}

/// The table's hash of a branch key: uniform bits for the slot index and the fingerprint.
#[inline]
pub fn branch_hash(parent: ParentKey, first: u64) -> u64 {
    let x = parent.word().wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ first.rotate_left(31);
    let x = (x ^ (x >> 29)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 32)
}

pub struct ChildTable {
    slots: Box<[AtomicU64]>,
}

impl ChildTable {
    pub fn with_capacity(cap: usize) -> Self {
        let cap = cap.max(16).next_power_of_two();
        ChildTable { slots: (0..cap).map(|_| AtomicU64::new(EMPTY)).collect() }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    #[inline]
    fn slot_of(hash: u64, local: u32) -> u64 {
        ((hash >> 32) << 32) | (u64::from(local) + 2)
    }

    /// Calls `confirm(local)` for every child whose fingerprint matches, until it returns true;
    /// returns that child's local segment number.
    #[inline]
    pub fn find(&self, hash: u64, mut confirm: impl FnMut(u32) -> bool) -> Option<u32> {
        let mask = self.mask();
        let mut i = hash as usize & mask;
        let fp = hash >> 32;
        loop {
            let v = self.slots[i].load(Ordering::Acquire);
            if v == EMPTY {
                return None;
            }
            if v != TOMBSTONE && v >> 32 == fp {
                let local = (v as u32) - 2;
                if confirm(local) {
                    return Some(local);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Inserts a link the caller knows is absent. Returns whether a tombstone was reused.
    pub fn insert(&self, hash: u64, local: u32) -> bool {
        let mask = self.mask();
        let mut i = hash as usize & mask;
        loop {
            let v = self.slots[i].load(Ordering::Relaxed);
            if v == EMPTY || v == TOMBSTONE {
                self.slots[i].store(Self::slot_of(hash, local), Ordering::Release);
                return v == TOMBSTONE;
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes the link to `local` filed under `hash`. Returns whether it was there.
    pub fn remove(&self, hash: u64, local: u32) -> bool {
        let mask = self.mask();
        let want = Self::slot_of(hash, local);
        let mut i = hash as usize & mask;
        loop {
            let v = self.slots[i].load(Ordering::Relaxed);
            if v == EMPTY {
                return false;
            }
            if v == want {
                self.slots[i].store(TOMBSTONE, Ordering::Release);
                return true;
            }
            i = (i + 1) & mask;
        }
    }

    /// Live links, for rebuilding: `(local)` of every child (the caller recomputes each hash).
    pub fn live(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots.iter().filter_map(|s| {
            let v = s.load(Ordering::Relaxed);
            (v != EMPTY && v != TOMBSTONE).then(|| (v as u32) - 2)
        })
    }

    pub fn bytes(&self) -> u64 {
        (self.slots.len() * 8) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_confirms_and_survives_tombstones() {
        let t = ChildTable::with_capacity(16);
        let h1 = branch_hash(ParentKey::Block(7), 100);
        let h2 = branch_hash(ParentKey::Block(7), 200);
        assert!(!t.insert(h1, 3));
        assert!(!t.insert(h2, 4));
        assert_eq!(t.find(h1, |l| l == 3), Some(3));
        assert_eq!(t.find(h1, |_| false), None, "a fingerprint match is only a candidate");
        assert!(t.remove(h1, 3));
        assert!(!t.remove(h1, 3));
        assert_eq!(t.find(h1, |_| true), None);
        assert_eq!(t.find(h2, |l| l == 4), Some(4), "probing continues past the tombstone");
        assert!(t.insert(h1, 5), "tombstone reused");
        assert_eq!(t.live().count(), 2);
    }

    #[test]
    fn roots_and_blocks_never_share_a_key() {
        assert_ne!(branch_hash(ParentKey::Root(5), 9), branch_hash(ParentKey::Block(5), 9));
    }
}
