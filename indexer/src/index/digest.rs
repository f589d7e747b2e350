//! A pod's digest: one number that two replicas can compare to prove they hold the same
//! residencies for a pod, without sending them.
//!
//! Why this shape: the digest must be equal on two replicas that applied the same events, in
//! whatever batches and order led to the same residencies, and it must cost no memory per
//! residency and next to no CPU on the ingest path. So it is a sum: each residency (a block
//! the pod holds, in one tier) contributes a 64-bit hash, and the pod keeps, per tier, the
//! wrapping sum of its residencies' hashes, moved by every store, removal and clear as the
//! tree edits the pod's runs (`tree::runs::EditStats::digest`). A sum is independent of order,
//! and adding then removing a residency leaves no trace.
//!
//! A residency's hash covers the block's key and its parent's (the chain edge the tree holds
//! it at), so the same block content at another place of the tree counts as another
//! residency. Tier ids are this index's own (interned in the order tiers were seen), so the
//! per-tier sums are combined under the tiers' names ([`combine`]), with each tier's block
//! count: two replicas that learned tiers in another order still agree.

use xxhash_rust::xxh3::xxh3_64;

/// The hash of a residency of the block `key` whose chain parent is `parent` (the previous
/// block's key, or the namespace root for a chain's first block). Keys are uniform 64-bit
/// hashes already; the mix makes the parent's bits matter as much as the key's.
#[inline]
pub fn residency(parent: u64, key: u64) -> u64 {
    let mut x = key ^ parent.rotate_left(31).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Adds to `sums` what the blocks `[a, b)` of a chain moved by going from tiers `before` to
/// `after`: `key(i)` is block `i`'s key and `parent` the key before block `a`.
#[inline]
pub fn fold(sums: &mut [u64], a: u32, b: u32, before: u8, after: u8, parent: u64, mut key: impl FnMut(u32) -> u64) {
    let (gained, lost) = (after & !before, before & !after);
    if gained | lost == 0 || a >= b {
        return;
    }
    // The blocks' hashes summed once, then moved into every tier the change touches (a sum:
    // the same as adding them one by one, at a tenth of the cost per block).
    let mut prev = parent;
    let mut moved = 0u64;
    for i in a..b {
        let k = key(i);
        moved = moved.wrapping_add(residency(prev, k));
        prev = k;
    }
    for (t, sum) in sums.iter_mut().enumerate() {
        if gained >> t & 1 != 0 {
            *sum = sum.wrapping_add(moved);
        } else if lost >> t & 1 != 0 {
            *sum = sum.wrapping_sub(moved);
        }
    }
}

/// A pod's digest from its tiers: each one's name, block count and residency sum. Tiers
/// holding nothing do not count; the order of the tiers does not matter. 0 for a pod that
/// holds nothing.
pub fn combine<'a>(tiers: impl IntoIterator<Item = (&'a str, u64, u64)>) -> u64 {
    let mut digest = 0u64;
    for (name, blocks, sum) in tiers {
        if blocks == 0 {
            continue;
        }
        let named = xxh3_64(name.to_ascii_uppercase().as_bytes());
        digest = digest.wrapping_add(residency(named ^ blocks.rotate_left(17), sum));
    }
    digest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_forgets_order_and_what_was_added_then_removed() {
        let keys = [11u64, 12, 13, 14];
        let mut one = [0u64; 8];
        fold(&mut one, 0, 4, 0, 1, 7, |i| keys[i as usize]);
        let mut other = [0u64; 8];
        // The same residencies in two pieces, the second first, with a tier added and removed.
        fold(&mut other, 2, 4, 0, 1, keys[1], |i| keys[i as usize]);
        fold(&mut other, 0, 2, 0, 1, 7, |i| keys[i as usize]);
        fold(&mut other, 1, 3, 1, 3, keys[0], |i| keys[i as usize]);
        fold(&mut other, 1, 3, 3, 1, keys[0], |i| keys[i as usize]);
        assert_eq!(one, other);
        assert_ne!(one[0], 0);
        assert_eq!(one[1], 0);
        fold(&mut other, 0, 4, 1, 0, 7, |i| keys[i as usize]);
        assert_eq!(other, [0; 8], "everything removed: nothing left");
    }

    #[test]
    fn the_same_key_under_another_parent_is_another_residency() {
        assert_ne!(residency(1, 5), residency(2, 5));
        assert_ne!(residency(1, 5), residency(5, 1));
    }

    #[test]
    fn tiers_combine_by_name_in_any_order() {
        let a = combine([("GPU", 3, 10), ("CPU", 1, 20)]);
        assert_eq!(a, combine([("cpu", 1, 20), ("GPU", 3, 10), ("DISK", 0, 99)]));
        assert_ne!(a, combine([("GPU", 1, 20), ("CPU", 3, 10)]), "tiers swapped");
        assert_ne!(a, combine([("GPU", 3, 10), ("CPU", 2, 20)]), "another count");
        assert_eq!(combine([]), 0);
    }
}
