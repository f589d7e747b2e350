//! The placement rule, as a pure function of what the router knows about each pod, so it can be
//! documented, tested exhaustively and replayed from a log line.
//!
//! **cost** (default):
//! `prefill_weight × uncached prompt blocks + queued_prefill_weight × queued prefill blocks +
//! decode_weight × running + queue_weight × waiting + kv_weight' × kv_usage`, where `queued
//! prefill blocks` = the uncached blocks of this router's requests to the pod that have not
//! had a response byte yet, `running` = the pod's running requests (scraped) plus this
//! router's requests sent since that scrape, `waiting` = its queued requests (scraped),
//! `kv_usage` its KV-cache usage (0–1), `kv_weight' = kv_weight × min(1, kv_blocks /
//! kv_reference_blocks)` with `kv_blocks` the pod's KV capacity in blocks of the indexer's
//! size: its capacity in tokens (vLLM's `num_gpu_blocks × block_size`, SGLang's
//! `max_total_num_tokens`) over that block size, so pods of any block or page size compare
//! alike (`kv_weight` itself when unknown), and
//! a pod's cached blocks are the larger of its exact
//! matched prefix and its speculative credit. Lowest cost wins; equal costs go to the pod with
//! the highest rendezvous weight of the prompt's first block key, so every replica breaks the
//! tie the same way.
//!
//! The unit is the time to prefill one block. The prompt this router already sent a pod and
//! has had no answer for is computed before a new one there (an engine takes prefill work
//! first come first served), so the new request waits `queued + uncached` blocks for its first
//! token; its own `uncached` blocks are also work that every later request on that pod waits
//! for. Counting both, `queued + 2 × uncached`, at the prefill weight's scale is the default
//! `queued_prefill_weight` of 0.5. Without the term a burst of cold prompts sharing one
//! cached prefix (a tenant's system prompt) all went to the pod holding it, each waiting for
//! all the others' prefill; with it, once the holder's queue outweighs twice what the prefix
//! saves, the next one goes elsewhere and computes the prefix again, while a follow-up turn,
//! its long conversation cached, stays home unless its pod is several cold prompts behind (at
//! weight 1, tried on the peer bench, one cold prompt there moved follow-ups and cost hit
//! rate). A scrape counts requests, not prefill work, and comes up to an interval late, most of
//! a burst. A running request slows every engine step a
//! little (default 2 blocks); a waiting request means the pod is saturated and new work waits
//! at least one typical prefill (default 64 blocks, 1k tokens at block size 16); a fuller KV
//! cache admits new work later and evicts what others will ask for (default 256 blocks for a
//! full cache, so a conversation's long cached prefix still outweighs it).
//!
//! The KV term is scaled by capacity because usage is a fraction: on a pod of 1,280 blocks
//! three or four ordinary requests hold a quarter of the cache, which at 256 blocks for a full
//! cache cost 64 blocks and pushed follow-up turns off the pod holding their prefix. Below
//! `kv_reference_blocks` (default 10,000: the 160k-token pods the weights were tuned on) a
//! full cache costs proportionally less, i.e. every block held costs the same 256 / 10,000 of
//! a prefill block as on the reference pod; at or above it nothing changes, so a big pod's
//! many running requests (each also counted by `decode_weight`) are not charged more either.
//! Genuine overload still moves work on any pod: a queue (`queue_weight` per waiting request)
//! or the KV cutoff.
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
    /// Per block of prefill this router sent to the pod that has not been answered yet.
    pub queued_prefill: f64,
    /// Per running request (scraped running + this router's requests since the scrape).
    pub decode: f64,
    /// Per waiting (queued) request.
    pub queue: f64,
    /// Times the pod's KV-cache usage (0–1): a fuller cache admits new work later. The cost of
    /// a full cache on a pod of at least `kv_reference_blocks` blocks (see [`CostWeights::kv_for`]).
    pub kv: f64,
    /// KV capacity (blocks) at and above which a full cache costs `kv`; smaller pods pay in
    /// proportion. 0 = no scaling.
    pub kv_reference_blocks: f64,
    /// KV-cache usage (0–1) at or above which a pod is picked only if every pod is.
    pub kv_cutoff: f64,
}

impl Default for CostWeights {
    fn default() -> Self {
        CostWeights {
            prefill: 1.0,
            queued_prefill: 0.5,
            decode: 2.0,
            queue: 64.0,
            kv: 256.0,
            kv_reference_blocks: DEFAULT_KV_REFERENCE_BLOCKS,
            kv_cutoff: 0.95,
        }
    }
}

/// The pod size (blocks) the default weights were tuned on: 160k tokens at block size 16.
pub const DEFAULT_KV_REFERENCE_BLOCKS: f64 = 10_000.0;

impl CostWeights {
    /// What a full KV cache costs on a pod of `kv_blocks` blocks: `kv` at or above
    /// `kv_reference_blocks` or when the capacity is unknown, in proportion below.
    pub fn kv_for(&self, kv_blocks: Option<u64>) -> f64 {
        match kv_blocks {
            Some(blocks) if blocks > 0 && self.kv_reference_blocks > 0.0 => {
                self.kv * (blocks as f64 / self.kv_reference_blocks).min(1.0)
            }
            _ => self.kv,
        }
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
    /// Uncached blocks of this router's requests to the pod not answered yet.
    pub queued_prefill_blocks: f64,
    /// Running requests, including this router's requests not yet in a scrape.
    pub running: f64,
    /// Queued requests.
    pub waiting: f64,
    /// KV-cache usage 0–1, when known.
    pub kv_usage: Option<f64>,
    /// KV-cache capacity in blocks of the indexer's block size (the tokens the engine reports
    /// over it), when the engine reports it.
    pub kv_blocks: Option<u64>,
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
    /// What a full KV cache costs on this pod ([`CostWeights::kv_for`]).
    pub kv_weight: f64,
    /// The KV term of `cost`: `kv_weight × kv_usage`.
    pub kv_cost: f64,
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
            let kv_weight = weights.kv_for(c.kv_blocks);
            let kv_cost = kv_weight * c.kv_usage.unwrap_or(0.0);
            let queued_prefill = weights.queued_prefill * c.queued_prefill_blocks;
            Ranked {
                index,
                cost: prefill + queued_prefill + weights.decode * c.running + weights.queue * c.waiting + kv_cost,
                cached_blocks: cached,
                uncached_blocks: uncached,
                load: c.running + c.waiting,
                kv_weight,
                kv_cost,
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
            queued_prefill_blocks: 0.0,
            running,
            waiting: 0.0,
            kv_usage: Some(0.1),
            kv_blocks: None,
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
    fn a_small_pods_full_cache_costs_in_proportion_to_its_size_and_a_big_or_unknown_one_the_full_weight() {
        let w = CostWeights::default();
        assert_eq!(w.kv_for(None), 256.0);
        assert_eq!(w.kv_for(Some(50_000)), 256.0);
        assert_eq!(w.kv_for(Some(10_000)), 256.0);
        assert!((w.kv_for(Some(1_280)) - 32.768).abs() < 1e-9);
        assert_eq!(CostWeights { kv_reference_blocks: 0.0, ..w }.kv_for(Some(1_280)), 256.0, "0 = no scaling");
        // Four requests of 80 blocks on a 1,280-block pod (usage 0.25) against a 60-block
        // prefix held there: unscaled the KV term alone (64) outweighs the prefix; scaled it
        // costs 8.2 and the conversation stays.
        let mut home = pod(60, 4.0, 1);
        home.kv_usage = Some(0.25);
        home.kv_blocks = Some(1_280);
        let mut empty = pod(0, 0.0, 2);
        empty.kv_usage = Some(0.0);
        empty.kv_blocks = Some(1_280);
        let ranked = rank(&[home, empty], 100, &w, Policy::Cost);
        assert_eq!(ranked[0].index, 0, "{ranked:?}");
        assert!((ranked[0].kv_cost - 8.192).abs() < 1e-9);
        let unscaled = CostWeights { kv_reference_blocks: 0.0, ..w };
        assert_eq!(rank(&[home, empty], 100, &unscaled, Policy::Cost)[0].index, 1);
        // Two waiting requests are genuine overload on any pod.
        home.waiting = 2.0;
        assert_eq!(rank(&[home, empty], 100, &w, Policy::Cost)[0].index, 1);
    }

    #[test]
    fn a_burst_of_cold_prompts_sharing_a_cached_prefix_spreads_once_the_holders_queue_outweighs_it() {
        // The peer bench's tenants: a 47-block system prompt cached on pod 0, each first turn
        // 107 blocks (60 of its own). Every prompt sent to pod 0 and not yet answered queues
        // 60 blocks of prefill ahead of the next.
        let w = CostWeights::default();
        let mut holder = pod(47, 0.0, 1);
        let empty = pod(0, 0.0, 2);
        let mut sent_to_holder = 0;
        for _ in 0..4 {
            if rank(&[holder, empty], 107, &w, Policy::Cost)[0].index == 0 {
                sent_to_holder += 1;
                holder.queued_prefill_blocks += 60.0;
                holder.running += 1.0;
            }
        }
        assert_eq!(sent_to_holder, 2, "the third would wait 120 blocks (60 at half weight) to save 47");
        // Without the queued term every one of them went to the holder (the old rule).
        let blind = CostWeights { queued_prefill: 0.0, ..w };
        let mut holder = pod(47, 0.0, 1);
        for _ in 0..4 {
            assert_eq!(rank(&[holder, empty], 107, &blind, Policy::Cost)[0].index, 0);
            holder.running += 1.0;
        }
    }

    #[test]
    fn a_follow_up_turn_stays_home_behind_a_cold_prompt_the_pod_is_still_computing() {
        // A third turn: 112 of 117 blocks cached at home, whose pod is prefilling one first
        // turn (60 blocks); another pod holds the tenant's 47-block prompt and nothing queued.
        let mut home = pod(112, 2.0, 1);
        home.queued_prefill_blocks = 60.0;
        let tenant = pod(47, 1.0, 2);
        let ranked = rank(&[home, tenant], 117, &CostWeights::default(), Policy::Cost);
        assert_eq!(ranked[0].index, 0, "{ranked:?}");
        assert_eq!(ranked[0].cost, 5.0 + 30.0 + 4.0 + 25.6);
        home.queued_prefill_blocks = 120.0;
        assert_eq!(rank(&[home, tenant], 117, &CostWeights::default(), Policy::Cost)[0].index, 0);
        // Four cold prompts queued there outweigh computing 70 blocks elsewhere.
        home.queued_prefill_blocks = 240.0;
        assert_eq!(rank(&[home, tenant], 117, &CostWeights::default(), Policy::Cost)[0].index, 1);
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
