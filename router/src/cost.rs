//! The placement rule, as a pure function of what the router knows about each pod, so it can be
//! documented, tested exhaustively and replayed from a log line.
//!
//! **cost** (default):
//! `prefill_weight × uncached prompt blocks + decode_weight × running + queue_weight × waiting +
//! kv_weight × kv_usage`, where `running` = the pod's running requests (scraped) plus this
//! router's requests sent since that scrape, `waiting` = its queued requests (scraped),
//! `kv_usage` its KV-cache usage (0–1), and a pod's cached blocks are the larger of its exact
//! matched prefix and its speculative credit. Lowest cost wins; equal costs go to the pod with
//! the highest rendezvous weight of the prompt's first block key, so every replica breaks the
//! tie the same way.
//!
//! The unit is the time to prefill one block. A running request slows every engine step a
//! little (default 2 blocks); a waiting request means the pod is saturated and new work waits
//! at least one typical prefill (default 64 blocks, 1k tokens at block size 16); a fuller KV
//! cache admits new work later and evicts what others will ask for (default 256 blocks for a
//! full cache, so a conversation's long cached prefix still outweighs it).
//!
//! **load-band** (option): among pods whose load is at most `band` above the least loaded, the
//! longest cached prefix, then the lower load, then the pod this router picked least recently,
//! then rendezvous; pods outside the band follow by cost.
//!
//! Whatever the policy, pods at or above the KV-usage cutoff come after every pod below it
//! (a nearly full pod queues new work for seconds, so affinity yields), and pods whose
//! `/metrics` stopped answering come last. The full order is the retry order.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostWeights {
    /// Per uncached prompt block.
    pub prefill: f64,
    /// Per running request (scraped running + this router's requests since the scrape).
    pub decode: f64,
    /// Per waiting (queued) request.
    pub queue: f64,
    /// Times the pod's KV-cache usage (0–1): a fuller cache admits new work later.
    pub kv: f64,
    /// KV-cache usage (0–1) at or above which a pod is picked only if every pod is.
    pub kv_cutoff: f64,
}

impl Default for CostWeights {
    fn default() -> Self {
        CostWeights { prefill: 1.0, decode: 2.0, queue: 64.0, kv: 256.0, kv_cutoff: 0.95 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    Cost,
    LoadBand {
        band: f64,
    },
    /// Load and rendezvous only (P/D decode pools: the prefill pod carries the prefix).
    LoadOnly,
}

impl Policy {
    pub fn label(&self) -> &'static str {
        match self {
            Policy::Cost => "cost",
            Policy::LoadBand { .. } => "load-band",
            Policy::LoadOnly => "load-only",
        }
    }
}

/// What the router knows about one candidate pod.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Leading blocks the engine announced holding (the indexer's `matched_blocks`).
    pub matched_blocks: u32,
    /// Leading blocks credited speculatively after a recent pick (never in `matched_blocks`).
    pub speculative_blocks: u32,
    /// Running requests, including this router's requests not yet in a scrape.
    pub running: f64,
    /// Queued requests.
    pub waiting: f64,
    /// KV-cache usage 0–1, when known.
    pub kv_usage: Option<f64>,
    /// Whether the pod's `/metrics` answers.
    pub reachable: bool,
    /// When this router last picked the pod (a monotonic tick; 0 = never).
    pub last_picked: u64,
    /// Rendezvous weight of (prompt, pod): the tie-break every replica computes alike.
    pub rendezvous: u64,
}

/// One candidate's place in the order, and why.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ranked {
    /// Index into the candidate slice.
    pub index: usize,
    pub cost: f64,
    pub cached_blocks: u32,
    pub uncached_blocks: u32,
    /// Running + waiting.
    pub load: f64,
    pub over_kv_cutoff: bool,
    pub reachable: bool,
    /// Load-band policy: inside the band.
    pub in_band: bool,
}

/// Orders `candidates` best first for a prompt of `total_blocks` full blocks.
pub fn rank(candidates: &[Candidate], total_blocks: u32, weights: &CostWeights, policy: Policy) -> Vec<Ranked> {
    let mut ranked: Vec<Ranked> = candidates
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let cached = c.matched_blocks.max(c.speculative_blocks).min(total_blocks);
            let uncached = total_blocks - cached;
            let prefill = if policy == Policy::LoadOnly { 0.0 } else { weights.prefill * f64::from(uncached) };
            Ranked {
                index,
                cost: prefill
                    + weights.decode * c.running
                    + weights.queue * c.waiting
                    + weights.kv * c.kv_usage.unwrap_or(0.0),
                cached_blocks: cached,
                uncached_blocks: uncached,
                load: c.running + c.waiting,
                over_kv_cutoff: c.kv_usage.is_some_and(|u| u >= weights.kv_cutoff),
                reachable: c.reachable,
                in_band: false,
            }
        })
        .collect();
    if let Policy::LoadBand { band } = policy {
        let floor =
            ranked.iter().filter(|r| r.reachable && !r.over_kv_cutoff).map(|r| r.load).fold(f64::INFINITY, f64::min);
        let floor = if floor.is_finite() { floor } else { ranked.iter().map(|r| r.load).fold(f64::INFINITY, f64::min) };
        for r in &mut ranked {
            r.in_band = r.load <= floor + band;
        }
    }
    ranked.sort_by(|a, b| {
        let (ca, cb) = (&candidates[a.index], &candidates[b.index]);
        b.reachable
            .cmp(&a.reachable)
            .then(a.over_kv_cutoff.cmp(&b.over_kv_cutoff))
            .then_with(|| match policy {
                Policy::LoadBand { .. } => b.in_band.cmp(&a.in_band).then_with(|| {
                    if a.in_band {
                        b.cached_blocks
                            .cmp(&a.cached_blocks)
                            .then(a.load.total_cmp(&b.load))
                            .then(ca.last_picked.cmp(&cb.last_picked))
                    } else {
                        a.cost.total_cmp(&b.cost)
                    }
                }),
                Policy::Cost | Policy::LoadOnly => a.cost.total_cmp(&b.cost),
            })
            .then(cb.rendezvous.cmp(&ca.rendezvous))
    });
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(matched: u32, running: f64, rendezvous: u64) -> Candidate {
        Candidate {
            matched_blocks: matched,
            speculative_blocks: 0,
            running,
            waiting: 0.0,
            kv_usage: Some(0.1),
            reachable: true,
            last_picked: 0,
            rendezvous,
        }
    }

    fn order(c: &[Candidate], total: u32, policy: Policy) -> Vec<usize> {
        rank(c, total, &CostWeights::default(), policy).iter().map(|r| r.index).collect()
    }

    #[test]
    fn the_cached_prefix_wins_until_load_outweighs_it() {
        // 100 blocks cached on pod 0 are worth 100 / 2 = 50 running requests, or 100 / 64
        // waiting ones.
        let pods = [pod(100, 49.0, 1), pod(0, 0.0, 2)];
        assert_eq!(order(&pods, 200, Policy::Cost)[0], 0);
        let pods = [pod(100, 51.0, 1), pod(0, 0.0, 2)];
        assert_eq!(order(&pods, 200, Policy::Cost)[0], 1);
        let mut queued = pod(100, 0.0, 1);
        queued.waiting = 1.0;
        assert_eq!(order(&[queued, pod(0, 0.0, 2)], 200, Policy::Cost)[0], 0);
        queued.waiting = 2.0;
        assert_eq!(order(&[queued, pod(0, 0.0, 2)], 200, Policy::Cost)[0], 1);
    }

    #[test]
    fn a_fuller_kv_cache_costs_more_but_not_more_than_a_long_cached_prefix() {
        let (mut emptier, mut fuller) = (pod(0, 0.0, 1), pod(0, 0.0, 2));
        emptier.kv_usage = Some(0.2);
        fuller.kv_usage = Some(0.6);
        assert_eq!(order(&[fuller, emptier], 100, Policy::Cost), [1, 0]);
        // 0.4 × 256 = 102.4 blocks: a pod holding 200 more blocks stays ahead.
        fuller.matched_blocks = 200;
        assert_eq!(order(&[fuller, emptier], 400, Policy::Cost), [0, 1]);
    }

    #[test]
    fn equal_costs_go_to_the_highest_rendezvous_weight_whatever_the_input_order() {
        let a = [pod(0, 0.0, 5), pod(0, 0.0, 9), pod(0, 0.0, 7)];
        assert_eq!(order(&a, 10, Policy::Cost), [1, 2, 0]);
        let b = [a[2], a[0], a[1]];
        assert_eq!(order(&b, 10, Policy::Cost), [2, 0, 1]);
    }

    #[test]
    fn speculative_credit_counts_as_cached_and_is_capped_by_the_prompt() {
        let mut speculative = pod(0, 0.0, 1);
        speculative.speculative_blocks = 50;
        let ranked = rank(&[pod(10, 0.0, 2), speculative], 20, &CostWeights::default(), Policy::Cost);
        assert_eq!(ranked[0].index, 1);
        assert_eq!(ranked[0].cached_blocks, 20);
        assert_eq!(ranked[0].uncached_blocks, 0);
    }

    #[test]
    fn pods_over_the_kv_cutoff_come_after_all_others_and_unreachable_pods_last() {
        let mut full = pod(100, 0.0, 9);
        full.kv_usage = Some(0.97);
        let mut gone = pod(100, 0.0, 9);
        gone.reachable = false;
        let pods = [full, gone, pod(0, 3.0, 1)];
        assert_eq!(order(&pods, 100, Policy::Cost), [2, 0, 1]);
        // Everyone over the cutoff: the cutoff no longer decides, cost does.
        let mut other = pod(0, 0.0, 1);
        other.kv_usage = Some(0.99);
        assert_eq!(order(&[full, other], 100, Policy::Cost), [0, 1]);
    }

    #[test]
    fn load_band_prefers_the_longest_prefix_within_one_request_of_the_least_load() {
        let pods = [pod(5, 1.0, 1), pod(50, 2.0, 2), pod(90, 2.5, 3), pod(0, 1.0, 4)];
        // Band = loads ≤ 2.0: pods 0, 1, 3; pod 1 holds the most.
        assert_eq!(order(&pods, 100, Policy::LoadBand { band: 1.0 })[..3], [1, 0, 3]);
        let mut recent = pods;
        recent[0].matched_blocks = 0;
        recent[0].last_picked = 7;
        recent[3].last_picked = 3;
        // Pods 0 and 3 tie on prefix and load: the one picked longer ago goes first.
        assert_eq!(order(&recent, 100, Policy::LoadBand { band: 1.0 })[1..3], [3, 0]);
    }

    #[test]
    fn load_only_ignores_the_prefix() {
        let pods = [pod(100, 1.0, 1), pod(0, 0.0, 2)];
        assert_eq!(order(&pods, 100, Policy::LoadOnly)[0], 1);
    }
}
