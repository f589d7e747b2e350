//! The tree's own invariants: chains grow in place or branch, runs split and merge, emptied
//! segments are trimmed and freed, engine entries live exactly as long as their block is held.

use super::*;

const GPU: u8 = 1;
const CPU: u8 = 2;
const ROOT: u64 = 0xabc;

fn store(tree: &Tree, pod: u32, parent: ParentKey, keys: &[u64], ends: &[(usize, u64)]) -> Stored {
    let guard = tree.pin();
    let chain = HeldChain { pod: PodId(pod), tier_bit: GPU, parent, hashes: keys, hold_from: 0, ends, index: true };
    tree.store(chain, &guard)
}

/// Every block of the whole chain as (pod, matched) pairs, walking from the root.
fn matches(tree: &Tree, query: &[u64]) -> Vec<(u32, u32)> {
    let mut q = query;
    let mut active: Vec<(u32, u32)> = Vec::new();
    let mut done = Vec::new();
    let mut first = true;
    tree.walk(ROOT, &mut q, |span| {
        let holders: Vec<u32> = span.holders.iter().map(|h| h.pod().0).collect();
        if first {
            first = false;
            active = holders.iter().map(|&p| (p, span.len)).collect();
        } else {
            let (keep, gone): (Vec<_>, Vec<_>) = active.iter().partition(|(p, _)| holders.contains(p));
            done.extend(gone);
            active = keep.into_iter().map(|(p, n)| (p, n + span.len)).collect();
        }
        !active.is_empty()
    });
    done.extend(active);
    done.sort_unstable();
    done
}

#[test]
fn chains_grow_in_place_and_branch_where_they_diverge() {
    let tree = Tree::new(1, u64::MAX);
    let a = store(&tree, 0, ParentKey::Root(ROOT), &[1, 2, 3], &[(2, 0xe3)]);
    assert_eq!(a.applied, 3);
    assert!(a.ends[0].1, "a new block records its engine hash");
    // Continuing the chain from its last block grows the same segment.
    let b = store(&tree, 0, ParentKey::Block(a.last.unwrap().pack()), &[4, 5], &[]);
    assert_eq!(b.last.unwrap().seg, a.last.unwrap().seg);
    assert_eq!(tree.shape().segments, 1);
    // Another pod diverging after block 2 gets a branch; the shared part gains a holder.
    let c = store(&tree, 1, ParentKey::Root(ROOT), &[1, 2, 9], &[]);
    assert_ne!(c.last.unwrap().seg, a.last.unwrap().seg);
    assert_eq!(tree.shape().segments, 2);
    assert_eq!(tree.shape().links, 2);
    assert_eq!(matches(&tree, &[1, 2, 3, 4, 5]), vec![(0, 5), (1, 2)]);
    assert_eq!(matches(&tree, &[1, 2, 9, 4]), vec![(0, 2), (1, 3)]);
    assert_eq!((tree.entries(), tree.keys()), (8, 6));
}

#[test]
fn a_removal_inside_a_shared_run_splits_it_and_a_store_merges_it_again() {
    let tree = Tree::new(1, u64::MAX);
    let a = store(&tree, 0, ParentKey::Root(ROOT), &[1, 2, 3, 4], &[]);
    store(&tree, 1, ParentKey::Root(ROOT), &[1, 2, 3, 4], &[]);
    assert_eq!(tree.shape().runs, 1, "one run: same holders all along");
    let guard = tree.pin();
    let two = Pos { seg: a.last.unwrap().seg, off: 1 };
    let (before, after, stats) = tree.release(PodId(0), two, 1, GPU, &guard);
    assert_eq!((before, after, stats.lost), (GPU, 0, 1));
    assert_eq!(tree.shape().runs, 3);
    assert_eq!(matches(&tree, &[1, 2, 3, 4]), vec![(0, 1), (1, 4)]);
    store(&tree, 0, ParentKey::Root(ROOT), &[1, 2], &[]);
    assert_eq!(tree.shape().runs, 1, "refilled: the runs merge back");
    assert_eq!(matches(&tree, &[1, 2, 3, 4]), vec![(0, 4), (1, 4)]);
}

#[test]
fn a_pod_leaving_one_branch_keeps_the_other_and_the_empty_branch_is_freed() {
    let tree = Tree::new(1, u64::MAX);
    store(&tree, 0, ParentKey::Root(ROOT), &[1, 2], &[]);
    let left = store(&tree, 0, ParentKey::Root(ROOT), &[1, 2, 3, 4], &[(3, 0xe4)]);
    let right = store(&tree, 0, ParentKey::Root(ROOT), &[1, 2, 7, 8], &[(3, 0xe8)]);
    assert_eq!(tree.shape().segments, 2);
    let guard = tree.pin();
    tree.release(PodId(0), right.last.unwrap(), 2, GPU, &guard);
    assert_eq!(matches(&tree, &[1, 2, 7, 8]), vec![(0, 2)]);
    assert_eq!(matches(&tree, &[1, 2, 3, 4]), vec![(0, 4)]);
    let shape = tree.shape();
    assert_eq!((shape.segments, shape.links, shape.engine_entries), (1, 1, 1), "the branch and its engine entry went");
    assert_eq!(tree.engine_block(0xe8, &guard), None);
    assert_eq!(tree.engine_block(0xe4, &guard), left.last);
    // The branch point's number can be reused by a new chain without confusing the old one.
    store(&tree, 1, ParentKey::Root(ROOT), &[5, 6], &[]);
    assert_eq!(matches(&tree, &[1, 2, 7, 8]), vec![(0, 2)]);
    assert_eq!(matches(&tree, &[5, 6]), vec![(1, 2)]);
}

#[test]
fn the_unheld_tail_is_cut_and_the_segment_sealed_but_blocks_a_branch_needs_stay() {
    let tree = Tree::new(1, u64::MAX);
    let a = store(&tree, 0, ParentKey::Root(ROOT), &[1, 2, 3, 4, 5], &[]);
    let seg = a.last.unwrap().seg;
    // Pod 1 branches off after block 3 (offset 2).
    store(&tree, 1, ParentKey::Block(Pos { seg, off: 2 }.pack()), &[30], &[]);
    let guard = tree.pin();
    // Pod 0 evicts everything: positions up to the branch point stay, unheld.
    tree.release(PodId(0), a.last.unwrap(), 5, GPU, &guard);
    let shape = tree.shape();
    assert_eq!((shape.segments, shape.positions), (2, 3 + 1));
    assert_eq!(matches(&tree, &[1, 2, 3, 30]), Vec::<(u32, u32)>::new(), "pod 1 holds a child, not the prefix");
    // A store of the old chain reuses the kept positions and branches for the rest (sealed).
    let b = store(&tree, 0, ParentKey::Root(ROOT), &[1, 2, 3, 4], &[]);
    assert_eq!(b.applied, 4);
    assert_ne!(b.last.unwrap().seg, seg);
    assert_eq!(matches(&tree, &[1, 2, 3, 4]), vec![(0, 4)]);
    assert_eq!(matches(&tree, &[1, 2, 3, 30]), vec![(0, 3)]);
    // Everyone leaves: nothing is left.
    let stats = tree.clear_pod(PodId(0), [seg, b.last.unwrap().seg], &guard);
    assert_eq!(stats.lost, 4);
    let c = tree.clear_pod(PodId(1), [b.last.unwrap().seg, Pos { seg: global(0, 1), off: 0 }.seg], &guard);
    let _ = c;
    let all: Vec<u32> = (0..8).map(|l| global(0, l)).collect();
    tree.clear_pod(PodId(1), all, &guard);
    assert_eq!((tree.entries(), tree.keys()), (0, 0));
    assert_eq!(tree.shape(), TreeShape::default());
}

#[test]
fn engine_entries_are_shared_by_block_and_go_with_the_last_holder() {
    let tree = Tree::new(2, u64::MAX);
    let a = store(&tree, 0, ParentKey::Root(ROOT), &[1], &[(0, 0xe1)]);
    let b = store(&tree, 1, ParentKey::Root(ROOT), &[1], &[(0, 0xe1)]);
    assert!(b.ends[0].1, "same engine hash from another pod shares the entry");
    let c = store(&tree, 2, ParentKey::Root(ROOT), &[1], &[(0, 0xe2)]);
    assert!(!c.ends[0].1, "a different engine hash for a recorded block is the caller's exception");
    let d = store(&tree, 3, ParentKey::Root(ROOT), &[2], &[(0, 0xe1)]);
    assert!(!d.ends[0].1, "an engine hash naming another block is not moved");
    let guard = tree.pin();
    let pos = a.last.unwrap();
    assert_eq!(tree.engine_block(0xe1, &guard), Some(pos));
    for p in 0..3 {
        tree.release(PodId(p), pos, 1, 0xff, &guard);
    }
    assert_eq!(tree.engine_block(0xe1, &guard), None, "gone with the block's last holder");
    let e = store(&tree, 0, ParentKey::Root(ROOT), &[3], &[(0, 0xe1)]);
    assert!(e.ends[0].1);
}

#[test]
fn the_bound_refuses_new_residencies_only_and_cuts_a_chain_where_it_runs_out() {
    let tree = Tree::new(1, 5);
    let a = store(&tree, 0, ParentKey::Root(ROOT), &[1, 2, 3], &[(0, 0xe1), (1, 0xe2), (2, 0xe3)]);
    assert_eq!(a.applied, 3);
    let b = store(&tree, 1, ParentKey::Root(ROOT), &[1, 2, 3, 4], &[(3, 0xe4)]);
    assert_eq!(b.applied, 2, "two residencies left");
    assert!(b.ends.is_empty(), "the engine block end was not applied");
    assert_eq!(tree.entries(), 5);
    let guard = tree.pin();
    let (stats, refused) = tree.retier(PodId(0), a.last.unwrap(), 3, CPU, &guard);
    assert_eq!((stats.gained, stats.tier_gained[1], refused), (0, 3, 0), "a new tier is not a new residency");
    assert_eq!(matches(&tree, &[1, 2, 3]), vec![(0, 3), (1, 2)]);
}

#[test]
fn a_reader_never_sees_a_block_of_another_chain_after_its_segment_is_reused() {
    // Readers resolve a branch by (parent position, key) and check the segment they stand on
    // is still the one at that number; walk from a stale view must not cross into a new chain.
    let tree = Tree::new(1, u64::MAX);
    let a = store(&tree, 0, ParentKey::Root(ROOT), &[1, 2], &[]);
    let guard = tree.pin();
    tree.release(PodId(0), a.last.unwrap(), 2, GPU, &guard);
    assert_eq!(tree.shape().segments, 0);
    // Number 0 is reused by another chain; a branch at its offset 1 with key 3.
    let b = store(&tree, 1, ParentKey::Root(ROOT), &[5, 6], &[]);
    assert_eq!(b.last.unwrap().seg, a.last.unwrap().seg, "reused number");
    store(&tree, 1, ParentKey::Block(b.last.unwrap().pack()), &[3], &[]);
    assert_eq!(matches(&tree, &[1, 2, 3]), Vec::<(u32, u32)>::new());
    assert_eq!(matches(&tree, &[5, 6, 3]), vec![(1, 3)]);
}
