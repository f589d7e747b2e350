//! Scoring: each pod's longest run of consecutive blocks from block 0.
//!
//! The tree walk yields the prompt's chain one run of same-holder blocks at a time; scoring
//! keeps the set of pods that still hold every block so far, intersects it with each run's
//! holders (both sorted by pod), and stops as soon as no pod remains, so a prompt nobody has
//! cached costs one hash and one lookup. A block counts at the largest weight among the tiers
//! the pod holds it in; per-tier counts are independent (a block on GPU and CPU counts in both).

use super::pods::PodId;
use super::tiers::{Tiers, MAX_TIERS};
use super::tree::{BlockHashes, Holder, Span, Tree};

/// One pod's match for a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PodMatch {
    pub pod: PodId,
    /// Consecutive blocks from block 0.
    pub matched_blocks: u32,
    /// Sum over matched blocks of the best tier weight.
    pub weighted_score: f64,
    /// Matched blocks per tier id.
    pub by_tier: [u32; MAX_TIERS],
}

impl PodMatch {
    pub(crate) fn new(pod: PodId) -> Self {
        PodMatch { pod, matched_blocks: 0, weighted_score: 0.0, by_tier: [0; MAX_TIERS] }
    }

    /// Counts `blocks` more blocks held in `tiers`.
    pub(crate) fn extend(&mut self, tiers: u8, blocks: u32, weights: &[f64; MAX_TIERS]) {
        self.matched_blocks += blocks;
        self.weighted_score += f64::from(blocks) * Tiers::best_weight(weights, tiers);
        for (i, count) in self.by_tier.iter_mut().enumerate() {
            if tiers & (1 << i) != 0 {
                *count += blocks;
            }
        }
    }
}

/// Pods to consider: all, or a sorted set.
#[derive(Debug, Clone, Copy)]
pub enum PodFilter<'a> {
    All,
    /// Sorted, deduplicated pod ids.
    Only(&'a [PodId]),
}

impl PodFilter<'_> {
    pub(crate) fn admits(&self, pod: PodId) -> bool {
        match self {
            PodFilter::All => true,
            PodFilter::Only(pods) => pods.binary_search(&pod).is_ok(),
        }
    }
}

/// Matches of every pod holding at least block 0 of the chain `root` → `query`, sorted by pod.
///
/// The walk visits one span per run of blocks with the same holders: the active pods are
/// intersected with each span's holders (both sorted) and advanced by the span's length, and
/// the walk stops as soon as no pod remains, so blocks past the longest match are never
/// hashed.
pub fn score<Q: BlockHashes>(
    tree: &Tree,
    root: u64,
    query: &mut Q,
    filter: PodFilter<'_>,
    weights: &[f64; MAX_TIERS],
) -> Vec<PodMatch> {
    let mut done: Vec<PodMatch> = Vec::new();
    let mut active: Vec<PodMatch> = Vec::new();
    let mut next: Vec<PodMatch> = Vec::new();
    let mut started = false;
    tree.walk(root, query, |span: Span<'_>| {
        if !started {
            started = true;
            for &h in span.holders.iter().filter(|h| filter.admits(h.pod())) {
                let mut m = PodMatch::new(h.pod());
                m.extend(h.tiers(), span.len, weights);
                active.push(m);
            }
            return !active.is_empty();
        }
        intersect(&mut active, &mut next, &mut done, span.holders, span.len, weights);
        std::mem::swap(&mut active, &mut next);
        !active.is_empty()
    });
    done.append(&mut active);
    done.sort_unstable_by_key(|m| m.pod);
    done
}

/// Moves the matches of `active` whose pod holds the span into `next` (extended by `len`
/// blocks), and the others into `done`.
fn intersect(
    active: &mut Vec<PodMatch>,
    next: &mut Vec<PodMatch>,
    done: &mut Vec<PodMatch>,
    holders: &[Holder],
    len: u32,
    weights: &[f64; MAX_TIERS],
) {
    let mut hi = holders.iter().peekable();
    for mut m in active.drain(..) {
        while hi.next_if(|h| h.pod() < m.pod).is_some() {}
        match hi.peek() {
            Some(h) if h.pod() == m.pod => {
                m.extend(h.tiers(), len, weights);
                next.push(m);
            }
            _ => done.push(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::tree::ParentKey;

    const GPU: u8 = 1;
    const CPU: u8 = 2;
    const ROOT: u64 = 99;

    fn weights() -> [f64; MAX_TIERS] {
        Tiers::new().weights()
    }

    fn store(tree: &Tree, pod: u32, tier: u8, keys: &[u64]) {
        let guard = tree.pin();
        tree.store(PodId(pod), tier, ParentKey::Root(ROOT), keys, 0, &[], true, &guard);
    }

    fn run(tree: &Tree, query: &[u64], filter: PodFilter<'_>) -> Vec<PodMatch> {
        let mut q = query;
        score(tree, ROOT, &mut q, filter, &weights())
    }

    #[test]
    fn longest_consecutive_run_from_block_zero() {
        let tree = Tree::new(4, u64::MAX);
        // pod 0 holds 10, 11, 12; pod 1 holds 10 and then 10, 11 but drops 11 (a hole).
        store(&tree, 0, GPU, &[10, 11, 12]);
        store(&tree, 1, GPU, &[10, 11, 12]);
        let guard = tree.pin();
        let eleven = tree.store(PodId(2), GPU, ParentKey::Root(ROOT), &[10, 11], 0, &[], true, &guard).last.unwrap();
        tree.release(PodId(1), eleven, 1, GPU, &guard);
        let got = run(&tree, &[10, 11, 12, 13], PodFilter::All);
        let summary: Vec<(u32, u32)> = got.iter().map(|m| (m.pod.0, m.matched_blocks)).collect();
        assert_eq!(summary, [(0, 3), (1, 1), (2, 2)]);
    }

    #[test]
    fn tier_weights_and_counts() {
        let tree = Tree::new(4, u64::MAX);
        store(&tree, 0, GPU, &[1]);
        store(&tree, 0, CPU, &[1, 2]);
        store(&tree, 0, GPU, &[1, 2, 3]);
        store(&tree, 0, CPU, &[1, 2, 3]);
        let m = &run(&tree, &[1, 2, 3], PodFilter::All)[0];
        assert_eq!(m.matched_blocks, 3);
        // block 1: GPU+CPU (1.0), block 2: GPU+CPU (1.0), block 3: GPU+CPU (1.0)
        assert!((m.weighted_score - 3.0).abs() < 1e-9);
        assert_eq!(&m.by_tier[..2], &[3, 3]);
        let tree = Tree::new(4, u64::MAX);
        store(&tree, 0, CPU, &[1, 2]);
        store(&tree, 0, GPU, &[1]);
        let m = &run(&tree, &[1, 2], PodFilter::All)[0];
        assert!((m.weighted_score - 1.8).abs() < 1e-9);
        assert_eq!(&m.by_tier[..2], &[1, 2]);
    }

    #[test]
    fn filter_limits_pods() {
        let tree = Tree::new(4, u64::MAX);
        for p in 0..4 {
            store(&tree, p, GPU, &[7]);
        }
        let only = [PodId(1), PodId(3)];
        let got = run(&tree, &[7], PodFilter::Only(&only));
        assert_eq!(got.iter().map(|m| m.pod).collect::<Vec<_>>(), only);
        assert!(run(&tree, &[], PodFilter::All).is_empty());
    }
}
