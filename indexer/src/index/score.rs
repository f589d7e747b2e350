//! Scoring: each pod's longest run of consecutive blocks from block 0.
//!
//! The walk keeps the set of pods that still hold every block so far, intersects it with each
//! next block's holders (both sorted by pod), and stops as soon as no pod remains, so a prompt
//! nobody has cached costs one lookup. A block counts at the largest weight among the tiers the
//! pod holds it in; per-tier counts are independent (a block on GPU and CPU counts in both).

use super::pods::PodId;
use super::table::{BlockTable, Holder};
use super::tiers::{Tiers, MAX_TIERS};
use crate::keys::PrefixKey;

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
    fn start(holder: Holder, weights: &[f64; MAX_TIERS]) -> Self {
        let mut m = PodMatch { pod: holder.pod(), matched_blocks: 0, weighted_score: 0.0, by_tier: [0; MAX_TIERS] };
        m.extend(holder.tiers(), weights);
        m
    }

    fn extend(&mut self, tiers: u8, weights: &[f64; MAX_TIERS]) {
        self.matched_blocks += 1;
        self.weighted_score += Tiers::best_weight(weights, tiers);
        for (i, count) in self.by_tier.iter_mut().enumerate() {
            if tiers & (1 << i) != 0 {
                *count += 1;
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
    fn admits(&self, pod: PodId) -> bool {
        match self {
            PodFilter::All => true,
            PodFilter::Only(pods) => pods.binary_search(&pod).is_ok(),
        }
    }
}

/// Matches of every pod holding at least block 0 of `keys`, sorted by pod id.
pub fn score(
    table: &BlockTable,
    keys: &[PrefixKey],
    filter: PodFilter<'_>,
    weights: &[f64; MAX_TIERS],
) -> Vec<PodMatch> {
    let mut done: Vec<PodMatch> = Vec::new();
    let Some((&first, rest)) = keys.split_first() else { return done };
    let mut active: Vec<PodMatch> = table.with_holders(first, |holders| {
        holders.iter().filter(|h| filter.admits(h.pod())).map(|&h| PodMatch::start(h, weights)).collect()
    });
    let mut next: Vec<PodMatch> = Vec::with_capacity(active.len());
    for &key in rest {
        if active.is_empty() {
            break;
        }
        table.with_holders(key, |holders| {
            let mut hi = holders.iter().peekable();
            for mut m in active.drain(..) {
                while hi.next_if(|h| h.pod() < m.pod).is_some() {}
                match hi.peek() {
                    Some(h) if h.pod() == m.pod => {
                        m.extend(h.tiers(), weights);
                        next.push(m);
                    }
                    _ => done.push(m),
                }
            }
        });
        std::mem::swap(&mut active, &mut next);
    }
    done.append(&mut active);
    done.sort_unstable_by_key(|m| m.pod);
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: u8 = 1;
    const CPU: u8 = 2;

    fn weights() -> [f64; MAX_TIERS] {
        Tiers::new().weights()
    }

    #[test]
    fn longest_consecutive_run_from_block_zero() {
        let idx = BlockTable::new(4, u64::MAX);
        // pod 0 holds 10, 11, 12; pod 1 holds 10 and 12 (a hole at 11); pod 2 holds only 11.
        for k in [10, 11, 12] {
            idx.writer().insert(k, 0, PodId(0), GPU);
        }
        idx.writer().insert(10, 0, PodId(1), GPU);
        idx.writer().insert(12, 0, PodId(1), GPU);
        idx.writer().insert(11, 0, PodId(2), GPU);
        let got = score(&idx, &[10, 11, 12, 13], PodFilter::All, &weights());
        let summary: Vec<(u32, u32)> = got.iter().map(|m| (m.pod.0, m.matched_blocks)).collect();
        assert_eq!(summary, [(0, 3), (1, 1)]);
    }

    #[test]
    fn tier_weights_and_counts() {
        let idx = BlockTable::new(4, u64::MAX);
        idx.writer().insert(1, 0, PodId(0), GPU);
        idx.writer().insert(2, 0, PodId(0), CPU);
        idx.writer().insert(3, 0, PodId(0), GPU);
        idx.writer().insert(3, 0, PodId(0), CPU);
        let m = &score(&idx, &[1, 2, 3], PodFilter::All, &weights())[0];
        assert_eq!(m.matched_blocks, 3);
        assert!((m.weighted_score - 2.8).abs() < 1e-9);
        assert_eq!(&m.by_tier[..2], &[2, 2]);
    }

    #[test]
    fn filter_limits_pods() {
        let idx = BlockTable::new(4, u64::MAX);
        for p in 0..4 {
            idx.writer().insert(7, 0, PodId(p), GPU);
        }
        let only = [PodId(1), PodId(3)];
        let got = score(&idx, &[7], PodFilter::Only(&only), &weights());
        assert_eq!(got.iter().map(|m| m.pod).collect::<Vec<_>>(), only);
        assert!(score(&idx, &[], PodFilter::All, &weights()).is_empty());
    }
}
