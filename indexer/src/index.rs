//! The sharded residency index: prefix key → the pods (and tiers) holding that block.
//!
//! Shards are independent `RwLock`ed hash maps, chosen by key bits the maps themselves do not
//! use for bucketing, so a writer holds one shard for one key at a time and readers never wait
//! long. Holders are stored inline for the common one- and two-pod cases (16 bytes) and spill
//! to a sorted vector beyond. Keys are already uniform XXH3 values, so the maps hash with the
//! identity function.
//!
//! The index knows nothing about engines or events; `ingest` turns events into these calls.

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use smallvec::SmallVec;

use crate::keys::PrefixKey;
use crate::pods::PodId;

/// One pod's residency of one block: pod id in the high 24 bits, tier bits in the low 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder(u32);

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

/// The pods holding one block, sorted by pod id.
#[derive(Debug, Clone)]
enum Holders {
    One(Holder),
    Two([Holder; 2]),
    Many(Box<Vec<Holder>>),
}

impl Holders {
    fn as_slice(&self) -> &[Holder] {
        match self {
            Holders::One(h) => std::slice::from_ref(h),
            Holders::Two(pair) => pair,
            Holders::Many(v) => v,
        }
    }

    fn to_small(&self) -> SmallVec<[Holder; 4]> {
        match self {
            Holders::One(h) => SmallVec::from_slice(&[*h]),
            Holders::Two(pair) => SmallVec::from_slice(pair),
            Holders::Many(v) => SmallVec::from_slice(v),
        }
    }

    fn from_sorted(mut v: SmallVec<[Holder; 4]>) -> Option<Holders> {
        match v.len() {
            0 => None,
            1 => Some(Holders::One(v[0])),
            2 => Some(Holders::Two([v[0], v[1]])),
            _ => {
                v.shrink_to_fit();
                Some(Holders::Many(Box::new(v.into_vec())))
            }
        }
    }
}

/// Hashes a u64 key to itself: prefix keys are XXH3 outputs, already uniform.
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type KeyMap<V> = std::collections::HashMap<PrefixKey, V, BuildHasherDefault<IdentityHasher>>;

#[derive(Default)]
struct Shard {
    map: KeyMap<Holders>,
}

/// Sharded key → holders map with a bound on resident entries.
pub struct Index {
    shards: Box<[RwLock<Shard>]>,
    shard_shift: u32,
    entries: AtomicU64,
    keys: AtomicU64,
    max_entries: u64,
}

impl Index {
    /// `shards` is rounded up to a power of two; `max_entries` bounds (key, pod) residencies.
    pub fn new(shards: usize, max_entries: u64) -> Self {
        let shards = shards.clamp(1, 1 << 16).next_power_of_two();
        Index {
            shards: (0..shards).map(|_| RwLock::new(Shard::default())).collect(),
            shard_shift: 64 - shards.trailing_zeros(),
            entries: AtomicU64::new(0),
            keys: AtomicU64::new(0),
            max_entries,
        }
    }

    #[inline]
    fn shard(&self, key: PrefixKey) -> &RwLock<Shard> {
        // The map buckets by the low bits and tags with the top 7; shard by the bits below
        // the tag so neither is constant within a shard.
        let idx = if self.shard_shift == 64 { 0 } else { ((key << 7) >> self.shard_shift) as usize };
        &self.shards[idx]
    }

    /// Resident (key, pod) entries.
    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// Distinct keys with at least one holder.
    pub fn keys(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    pub fn max_entries(&self) -> u64 {
        self.max_entries
    }

    /// Records that `pod` holds `key` in `tier_bit`. Returns the tiers the pod held the block
    /// in before (0 = a new residency), or `None` when the entry bound refused a new residency.
    pub fn insert(&self, key: PrefixKey, pod: PodId, tier_bit: u8) -> Option<u8> {
        let mut shard = self.shard(key).write();
        if let Some(holders) = shard.map.get_mut(&key) {
            let mut v = holders.to_small();
            match v.binary_search_by_key(&pod, |h| h.pod()) {
                Ok(i) => {
                    let prev = v[i].tiers();
                    if prev & tier_bit == 0 {
                        v[i] = Holder::new(pod, prev | tier_bit);
                        *holders = Holders::from_sorted(v)?;
                    }
                    return Some(prev);
                }
                Err(i) => {
                    if !self.reserve_entry() {
                        return None;
                    }
                    v.insert(i, Holder::new(pod, tier_bit));
                    *holders = Holders::from_sorted(v)?;
                    return Some(0);
                }
            }
        }
        if !self.reserve_entry() {
            return None;
        }
        shard.map.insert(key, Holders::One(Holder::new(pod, tier_bit)));
        self.keys.fetch_add(1, Ordering::Relaxed);
        Some(0)
    }

    fn reserve_entry(&self) -> bool {
        let prev = self.entries.fetch_add(1, Ordering::Relaxed);
        if prev >= self.max_entries {
            self.entries.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Removes the tiers in `tier_mask` of `pod`'s residency of `key`. Returns the tiers the
    /// pod held the block in before and after (both 0 when it never held it).
    pub fn remove(&self, key: PrefixKey, pod: PodId, tier_mask: u8) -> (u8, u8) {
        let mut shard = self.shard(key).write();
        let Some(holders) = shard.map.get_mut(&key) else { return (0, 0) };
        let mut v = holders.to_small();
        let Ok(i) = v.binary_search_by_key(&pod, |h| h.pod()) else { return (0, 0) };
        let prev = v[i].tiers();
        let left = prev & !tier_mask;
        if left == prev {
            return (prev, left);
        }
        if left != 0 {
            v[i] = Holder::new(pod, left);
        } else {
            v.remove(i);
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
        match Holders::from_sorted(v) {
            Some(h) => *holders = h,
            None => {
                shard.map.remove(&key);
                self.keys.fetch_sub(1, Ordering::Relaxed);
            }
        }
        (prev, left)
    }

    /// Calls `f` with the holders of `key` (sorted by pod), under the shard's read lock.
    #[inline]
    pub fn with_holders<R>(&self, key: PrefixKey, f: impl FnOnce(&[Holder]) -> R) -> R {
        let shard = self.shard(key).read();
        f(shard.map.get(&key).map_or(&[], Holders::as_slice))
    }

    /// The tiers `pod` holds `key` in (0 = not held).
    pub fn tiers_of(&self, key: PrefixKey, pod: PodId) -> u8 {
        self.with_holders(key, |hs| {
            hs.binary_search_by_key(&pod, |h| h.pod()).map(|i| hs[i].tiers()).unwrap_or(0)
        })
    }

    /// Approximate heap bytes held by the shards' tables and spilled holder lists.
    pub fn approx_bytes(&self) -> u64 {
        let per_slot = (std::mem::size_of::<(PrefixKey, Holders)>() + 1) as u64;
        self.shards
            .iter()
            .map(|s| {
                let s = s.read();
                let spilled: u64 = s
                    .map
                    .values()
                    .map(|h| match h {
                        Holders::Many(v) => (v.capacity() * 4 + 24) as u64,
                        _ => 0,
                    })
                    .sum();
                s.map.capacity() as u64 * per_slot + spilled
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: u8 = 1;
    const CPU: u8 = 2;

    #[test]
    fn holders_stay_sorted_through_spill_and_shrink() {
        let idx = Index::new(4, u64::MAX);
        for p in [5, 1, 9, 3, 7] {
            assert_eq!(idx.insert(42, PodId(p), GPU), Some(0));
        }
        let pods: Vec<u32> = idx.with_holders(42, |h| h.iter().map(|h| h.pod().0).collect());
        assert_eq!(pods, [1, 3, 5, 7, 9]);
        for p in [1, 9, 5] {
            assert_eq!(idx.remove(42, PodId(p), GPU), (GPU, 0));
        }
        let pods: Vec<u32> = idx.with_holders(42, |h| h.iter().map(|h| h.pod().0).collect());
        assert_eq!(pods, [3, 7]);
        assert_eq!(idx.entries(), 2);
        idx.remove(42, PodId(3), GPU);
        idx.remove(42, PodId(7), GPU);
        assert_eq!((idx.entries(), idx.keys()), (0, 0));
    }

    #[test]
    fn tiers_are_bits_of_one_residency() {
        let idx = Index::new(1, u64::MAX);
        assert_eq!(idx.insert(1, PodId(0), GPU), Some(0));
        assert_eq!(idx.insert(1, PodId(0), CPU), Some(GPU));
        assert_eq!(idx.insert(1, PodId(0), CPU), Some(GPU | CPU));
        assert_eq!(idx.entries(), 1);
        assert_eq!(idx.tiers_of(1, PodId(0)), GPU | CPU);
        assert_eq!(idx.remove(1, PodId(0), CPU), (GPU | CPU, GPU));
        assert_eq!(idx.remove(1, PodId(0), GPU), (GPU, 0));
        assert_eq!(idx.tiers_of(1, PodId(0)), 0);
        assert_eq!(idx.remove(1, PodId(0), GPU), (0, 0), "removing twice is harmless");
    }

    #[test]
    fn entry_bound_refuses_new_residencies_only() {
        let idx = Index::new(2, 2);
        assert_eq!(idx.insert(1, PodId(0), GPU), Some(0));
        assert_eq!(idx.insert(2, PodId(0), GPU), Some(0));
        assert_eq!(idx.insert(3, PodId(0), GPU), None);
        assert_eq!(idx.insert(1, PodId(1), GPU), None);
        assert_eq!(idx.insert(1, PodId(0), CPU), Some(GPU), "a new tier is not a new entry");
        assert_eq!(idx.entries(), 2);
        assert_eq!(idx.tiers_of(3, PodId(0)), 0);
    }

    #[test]
    fn keys_spread_over_shards() {
        let idx = Index::new(16, u64::MAX);
        let mut seen = std::collections::HashSet::new();
        for k in 0..1000u64 {
            let key = xxhash_rust::xxh3::xxh3_64(&k.to_le_bytes());
            seen.insert(idx.shard(key) as *const _ as usize);
        }
        assert_eq!(seen.len(), 16);
    }
}
