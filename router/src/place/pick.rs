//! The last step: the field ranked by the placement rule into the decision's order. One pool
//! in an ordinary fleet; in P/D mode the prefill pod by prefix within the load band and the
//! decode pods by load. Also what the pick could have reused at best, the decision-quality
//! baseline. Pure: the same field always ranks the same way.

use super::candidates::Field;
use super::cost::{self, CostWeights, Policy};
use super::decision::PodChoice;
use super::pd::Pools;

/// The ranking of one request.
pub struct Pick {
    /// Best first: the retry order (in P/D mode, the decode pool).
    pub ranked: Vec<PodChoice>,
    /// P/D mode: the prefill pod.
    pub prefill: Option<PodChoice>,
    /// The policy's label (`pd` in P/D mode).
    pub policy: &'static str,
    /// The most cached blocks a reachable pod of the pool computing the prompt held (all of
    /// the pool when none is reachable).
    pub best_cached_blocks: u32,
}

/// Ranks `field` (`pools`: P/D mode) for a prompt of `total_blocks` blocks.
pub fn pick(
    field: &Field,
    pools: Option<&Pools>,
    total_blocks: u32,
    weights: &CostWeights,
    policy: Policy,
    load_band: f64,
) -> Pick {
    let all: Vec<usize> = (0..field.candidates.len()).collect();
    let (ranked, prefill, label) = match pools {
        None => (rank_pool(field, &all, total_blocks, weights, policy), None, policy.label()),
        Some(p) => {
            let prefill = rank_pool(field, &p.prefill, total_blocks, weights, Policy::LoadBand { band: load_band })
                .into_iter()
                .next();
            (rank_pool(field, &p.decode, total_blocks, weights, Policy::LoadOnly), prefill, "pd")
        }
    };
    // The best reuse on offer: over the pool that computes the prompt, its reachable pods
    // (all of them when none is).
    let holders: &[usize] = pools.map_or(&all, |p| &p.prefill);
    let candidates = &field.candidates;
    let cached = |i: &usize| candidates[*i].matched_blocks.max(candidates[*i].speculative_blocks).min(total_blocks);
    let best_cached_blocks = holders
        .iter()
        .filter(|&&i| candidates[i].reachable)
        .map(cached)
        .max()
        .or_else(|| holders.iter().map(cached).max())
        .unwrap_or(0);
    Pick { ranked, prefill, policy: label, best_cached_blocks }
}

/// The pods at `indices` of the field, ranked, each choice with its cost filled in.
fn rank_pool(
    field: &Field,
    indices: &[usize],
    total_blocks: u32,
    weights: &CostWeights,
    policy: Policy,
) -> Vec<PodChoice> {
    let pool: Vec<cost::Candidate> = indices.iter().map(|&i| field.candidates[i]).collect();
    cost::rank(&pool, total_blocks, weights, policy)
        .into_iter()
        .map(|r| {
            let mut choice = field.choices[indices[r.index]].clone();
            choice.cached_blocks = r.cached_blocks;
            choice.cost = r.cost;
            choice.kv_weight = r.kv_weight;
            choice.kv_cost = r.kv_cost;
            choice.over_kv_cutoff = r.over_kv_cutoff;
            choice.in_band = r.in_band;
            choice
        })
        .collect()
}
