//! Scoring: each pod's longest run of consecutive blocks from block 0, credited in the units
//! its engine can reuse.
//!
//! The tree walk yields the prompt's chain one run of same-holder blocks at a time; scoring
//! keeps the set of pods that still hold every block so far, intersects it with each run's
//! holders (both sorted by pod), and stops as soon as no pod remains, so a prompt nobody has
//! cached costs one hash and one lookup. A block counts at the largest weight among the tiers
//! the pod holds it in; per-tier counts are independent (a block on GPU and CPU counts in both).
//!
//! A pod whose engine reuses only whole units of several canonical blocks (see `units`) is
//! credited at each unit boundary: the blocks since its last boundary are pending, and are
//! dropped when its run ends; with EAGLE the last whole unit is held back too. Pods with unit
//! 1 take the plain path, which keeps no pending state at all.

use super::pods::PodId;
use super::tiers::{Tiers, MAX_TIERS};
use super::tree::{BlockHashes, Holder, Span, Tree};
use super::units::Cut;

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

    /// Adds another match's counts (blocks that follow this match's).
    fn absorb(&mut self, other: &PodMatch) {
        self.matched_blocks += other.matched_blocks;
        self.weighted_score += other.weighted_score;
        for (a, b) in self.by_tier.iter_mut().zip(other.by_tier) {
            *a += b;
        }
    }
}

/// How a pod's match grows along the walk: [`PodMatch`] credits every block; [`UnitMatch`]
/// credits whole units.
pub trait Accrual {
    fn pod(&self) -> PodId;
    /// `blocks` more consecutive blocks, held in `tiers`.
    fn extend(&mut self, tiers: u8, blocks: u32, weights: &[f64; MAX_TIERS]);
    /// What is credited once the pod's run has ended.
    fn finish(self) -> PodMatch;
}

impl Accrual for PodMatch {
    #[inline]
    fn pod(&self) -> PodId {
        self.pod
    }
    #[inline]
    fn extend(&mut self, tiers: u8, blocks: u32, weights: &[f64; MAX_TIERS]) {
        PodMatch::extend(self, tiers, blocks, weights)
    }
    #[inline]
    fn finish(self) -> PodMatch {
        self
    }
}

/// A match credited in whole units of `cut.unit` blocks: `done` holds the credited blocks,
/// `pending` those since the last unit boundary, and with EAGLE `held_back` the last whole
/// unit, which the engine drops from every hit.
#[derive(Debug, Clone)]
pub struct UnitMatch {
    done: PodMatch,
    held_back: PodMatch,
    pending: PodMatch,
    cut: Cut,
}

impl UnitMatch {
    pub fn new(pod: PodId, cut: Cut) -> Self {
        let m = PodMatch::new(pod);
        UnitMatch { done: m.clone(), held_back: m.clone(), pending: m, cut: Cut { unit: cut.unit.max(1), ..cut } }
    }

    /// `pending` has become a whole unit: it is credited (with EAGLE, the unit held back
    /// before it is, and it is held back in its place).
    fn complete(&mut self) {
        let unit = std::mem::replace(&mut self.pending, PodMatch::new(self.done.pod));
        if self.cut.eagle {
            let earlier = std::mem::replace(&mut self.held_back, unit);
            self.done.absorb(&earlier);
        } else {
            self.done.absorb(&unit);
        }
    }
}

impl Accrual for UnitMatch {
    fn pod(&self) -> PodId {
        self.done.pod
    }

    fn extend(&mut self, tiers: u8, blocks: u32, weights: &[f64; MAX_TIERS]) {
        let unit = self.cut.unit;
        let need = unit - self.pending.matched_blocks;
        if blocks < need {
            self.pending.extend(tiers, blocks, weights);
            return;
        }
        self.pending.extend(tiers, need, weights);
        self.complete();
        let mut left = blocks - need;
        let whole = left / unit;
        if whole > 0 {
            // Whole units inside one run, all in `tiers`.
            if self.cut.eagle {
                let earlier = std::mem::replace(&mut self.held_back, PodMatch::new(self.done.pod));
                self.done.absorb(&earlier);
                self.done.extend(tiers, (whole - 1) * unit, weights);
                self.held_back.extend(tiers, unit, weights);
            } else {
                self.done.extend(tiers, whole * unit, weights);
            }
            left -= whole * unit;
        }
        self.pending.extend(tiers, left, weights);
    }

    fn finish(self) -> PodMatch {
        self.done
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
    score_with(tree, root, query, filter, weights, PodMatch::new)
}

/// As [`score`], each pod credited in whole units of its cut (`cut_of`; pods it names no cut
/// for credit every block). Pods credited nothing are left out.
pub fn score_in_units<Q: BlockHashes>(
    tree: &Tree,
    root: u64,
    query: &mut Q,
    filter: PodFilter<'_>,
    weights: &[f64; MAX_TIERS],
    cut_of: impl Fn(PodId) -> Option<Cut>,
) -> Vec<PodMatch> {
    let mut matches =
        score_with(tree, root, query, filter, weights, |pod| UnitMatch::new(pod, cut_of(pod).unwrap_or_default()));
    matches.retain(|m| m.matched_blocks > 0);
    matches
}

fn score_with<Q: BlockHashes, A: Accrual>(
    tree: &Tree,
    root: u64,
    query: &mut Q,
    filter: PodFilter<'_>,
    weights: &[f64; MAX_TIERS],
    start: impl Fn(PodId) -> A,
) -> Vec<PodMatch> {
    let mut done: Vec<PodMatch> = Vec::new();
    let mut active: Vec<A> = Vec::new();
    let mut next: Vec<A> = Vec::new();
    let mut started = false;
    tree.walk(root, query, |span: Span<'_>| {
        if !started {
            started = true;
            for &h in span.holders.iter().filter(|h| filter.admits(h.pod())) {
                let mut m = start(h.pod());
                m.extend(h.tiers(), span.len, weights);
                active.push(m);
            }
            return !active.is_empty();
        }
        intersect(&mut active, &mut next, &mut done, span.holders, span.len, weights);
        std::mem::swap(&mut active, &mut next);
        !active.is_empty()
    });
    done.extend(active.into_iter().map(Accrual::finish));
    done.sort_unstable_by_key(|m| m.pod);
    done
}

/// Moves the matches of `active` whose pod holds the span into `next` (extended by `len`
/// blocks), and the others, finished, into `done`.
fn intersect<A: Accrual>(
    active: &mut Vec<A>,
    next: &mut Vec<A>,
    done: &mut Vec<PodMatch>,
    holders: &[Holder],
    len: u32,
    weights: &[f64; MAX_TIERS],
) {
    let mut hi = holders.iter().peekable();
    for mut m in active.drain(..) {
        let pod = m.pod();
        while hi.next_if(|h| h.pod() < pod).is_some() {}
        match hi.peek() {
            Some(h) if h.pod() == pod => {
                m.extend(h.tiers(), len, weights);
                next.push(m);
            }
            _ => done.push(m.finish()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::tree::{HeldChain, ParentKey};

    const GPU: u8 = 1;
    const CPU: u8 = 2;
    const ROOT: u64 = 99;

    fn weights() -> [f64; MAX_TIERS] {
        Tiers::new().weights()
    }

    /// `pod` holds `keys` from the root, all of them, in `tier`.
    fn chain(pod: u32, tier: u8, keys: &[u64]) -> HeldChain<'_> {
        HeldChain {
            pod: PodId(pod),
            tier_bit: tier,
            parent: ParentKey::Root(ROOT),
            hashes: keys,
            hold_from: 0,
            ends: &[],
            index: true,
        }
    }

    fn store(tree: &Tree, pod: u32, tier: u8, keys: &[u64]) {
        let guard = tree.pin();
        tree.store(chain(pod, tier, keys), &guard);
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
        let eleven = tree.store(chain(2, GPU, &[10, 11]), &guard).last.unwrap();
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

    fn in_units(tree: &Tree, query: &[u64], cut: impl Fn(PodId) -> Option<Cut>) -> Vec<(u32, u32, [u32; 2], f64)> {
        let mut q = query;
        score_in_units(tree, ROOT, &mut q, PodFilter::All, &weights(), cut)
            .iter()
            .map(|m| (m.pod.0, m.matched_blocks, [m.by_tier[0], m.by_tier[1]], m.weighted_score))
            .collect()
    }

    #[test]
    fn units_credit_whole_engine_blocks_only_with_their_tiers() {
        let tree = Tree::new(4, u64::MAX);
        // Pod 0 holds 7 blocks (GPU, the last three in CPU too); pod 1 the same in unit 1.
        store(&tree, 0, GPU, &[1, 2, 3, 4, 5, 6, 7]);
        store(&tree, 0, CPU, &[1, 2, 3, 4, 5, 6, 7]);
        let guard = tree.pin();
        let four = tree.store(chain(0, CPU, &[1, 2, 3, 4]), &guard).last.unwrap();
        tree.release(PodId(0), four, 4, CPU, &guard);
        store(&tree, 1, GPU, &[1, 2, 3, 4, 5, 6, 7]);
        let query = [1, 2, 3, 4, 5, 6, 7, 8];
        let unit = |u: u32, eagle: bool| move |p: PodId| (p.0 == 0).then_some(Cut { unit: u, eagle });
        let got = in_units(&tree, &query, unit(3, false));
        // Units of 3: blocks 0..6 credited, the 7th pending and dropped; 2 of them in CPU.
        assert_eq!((got[0].1, got[0].2), (6, [6, 2]));
        assert!((got[0].3 - 6.0).abs() < 1e-9);
        assert_eq!((got[1].1, got[1].2), (7, [7, 0]), "a pod with no cut credits every block");
        let got = in_units(&tree, &query, unit(2, true));
        assert_eq!((got[0].1, got[0].2), (4, [4, 0]), "6 whole blocks of 2, less one unit for EAGLE");
        let got = in_units(&tree, &query, unit(8, false));
        assert_eq!(got.iter().map(|m| m.0).collect::<Vec<_>>(), [1], "a pod credited nothing is left out");
        let got = in_units(&tree, &query, unit(1, true));
        assert_eq!(got[0].1, 6);
        // The run split into spans at every block: units complete across spans.
        let tree = Tree::new(4, u64::MAX);
        store(&tree, 0, GPU, &[1, 2, 3, 4, 5, 6, 7]);
        for (p, n) in [(1, 1), (2, 2), (3, 3), (4, 5), (5, 6)] {
            store(&tree, p, GPU, &query[..n]);
        }
        for (u, eagle, want) in [(2, false, 6), (3, false, 6), (3, true, 3), (7, true, 0), (4, true, 0), (1, true, 6)] {
            let got = in_units(&tree, &query, move |p| (p.0 == 0).then_some(Cut { unit: u, eagle }));
            assert_eq!(got.iter().find(|m| m.0 == 0).map_or(0, |m| m.1), want, "unit {u} eagle {eagle}");
        }
    }
}
