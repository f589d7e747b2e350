//! A routing decision and its explanation: the ranked pods with what each was known to hold
//! and carry, how the score was obtained, and how long each stage took. The proxy turns it
//! into response headers and one structured log line; neither ever carries the prompt or its
//! token ids.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Serialize;

use crate::pods::fleet::{LoadView, Pod};
use crate::pods::spec::Role;

/// How the prefix scores were obtained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ScoreOutcome {
    /// The indexer at `indexer` answered in time.
    Scored { indexer: String },
    /// Placed by load only; `reason` is the `kvindex_router_fail_open_total` label.
    FailOpen { reason: &'static str },
}

impl ScoreOutcome {
    /// `ok`, or the fail-open reason (the `x-kvindex-score` header).
    pub fn label(&self) -> &str {
        match self {
            ScoreOutcome::Scored { .. } => "ok",
            ScoreOutcome::FailOpen { reason } => reason,
        }
    }
}

/// One pod in the ranking, and why it stands there.
#[derive(Debug, Clone, Serialize)]
pub struct PodChoice {
    pub pod: String,
    pub role: Role,
    /// Leading blocks the engine announced (the indexer's exact answer).
    pub matched_blocks: u32,
    /// Leading blocks credited speculatively by a recent pick of any replica.
    pub speculative_blocks: u32,
    /// The larger of the two, capped at the prompt: what the cost used.
    pub cached_blocks: u32,
    /// The indexer's view of the pod's event stream (EXACT, STALE, DEGRADED), if scored.
    pub source_state: Option<&'static str>,
    /// The unit the indexer credits the pod in (its engine's reusable block), if scored.
    pub credit_unit: CreditUnit,
    pub cost: f64,
    /// What a full KV cache costs on this pod (the KV weight scaled by its capacity).
    pub kv_weight: f64,
    /// The KV term of `cost` (`kv_weight × kv_usage`).
    pub kv_cost: f64,
    pub over_kv_cutoff: bool,
    pub in_band: bool,
    pub load: LoadView,
    /// Every router's requests on the pod, as the indexer counts their reservations (`None`:
    /// not known, own counts only); the cost uses the larger of this and `load`.
    pub shared: Option<SharedLoad>,
    #[serde(skip)]
    pub handle: Option<Arc<Pod>>,
}

/// How much of a prefix a pod's engine reuses at a time, as the indexer reported it
/// (`PodScore.credit_unit_tokens`, `PodScore.eagle`): whole engine blocks of `tokens`, one
/// fewer with EAGLE. `tokens` 0: not reported (the canonical block).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CreditUnit {
    pub tokens: u32,
    pub eagle: bool,
}

/// A pod's load as every router reserved it on the indexer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SharedLoad {
    /// Requests whose response has not ended.
    pub requests: u32,
    /// Their uncached prompt blocks without a first response byte yet.
    pub prefill_blocks: u64,
}

/// The load the cost uses: requests (running + waiting) and queued prefill blocks, each the
/// larger of this router's view (the scrape plus its requests since, or its own in-flight count;
/// its own unanswered prefill) and every router's reservations. Both are floors of the truth:
/// the scrape is up to an interval old and this router's own counts miss its siblings' requests,
/// while the reservations miss what reached the pod another way (and this router's newest
/// request until its reservation lands).
pub fn combined(load: &LoadView, shared: Option<SharedLoad>) -> (f64, u64) {
    match shared {
        None => (load.load, load.queued_prefill_blocks),
        Some(s) => (load.load.max(f64::from(s.requests)), load.queued_prefill_blocks.max(s.prefill_blocks)),
    }
}

impl PodChoice {
    /// Requests on the pod as the cost counts them ([`combined`]).
    pub fn requests(&self) -> f64 {
        combined(&self.load, self.shared).0
    }

    /// The endpoint a gateway knows the pod by: its configured id, which for a rank the router
    /// names is not the rank's own id.
    pub fn endpoint(&self) -> &str {
        self.handle.as_ref().map_or(self.pod.as_str(), |p| p.spec_id.as_str())
    }

    /// The data-parallel rank every request sent to this choice must name.
    pub fn dp_rank(&self) -> Option<u32> {
        self.handle.as_ref()?.dp.named_rank()
    }

    /// A choice of `pod` holding `cached` blocks, under `load` and nothing else (the unit
    /// tests' choices; each sets what it looks at).
    #[cfg(test)]
    pub(crate) fn example(pod: &str, cached: u32, load: f64) -> PodChoice {
        PodChoice {
            pod: pod.into(),
            role: Role::Both,
            matched_blocks: cached,
            speculative_blocks: 0,
            cached_blocks: cached,
            source_state: None,
            credit_unit: CreditUnit::default(),
            cost: 0.0,
            kv_weight: 0.0,
            kv_cost: 0.0,
            over_kv_cutoff: false,
            in_band: false,
            load: LoadView::unscraped(load),
            shared: None,
            handle: None,
        }
    }
}

/// Time spent per stage, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Timings {
    pub tokenize_us: u64,
    pub score_us: u64,
    pub pick_us: u64,
    pub total_us: u64,
}

/// Everything decided for one request.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    /// This router's request number (logs and the `x-kvindex-request-id` header).
    pub id: u64,
    pub model: String,
    pub policy: &'static str,
    pub prompt_tokens: Option<usize>,
    pub total_blocks: u32,
    pub block_size: u32,
    pub score: ScoreOutcome,
    /// Best first; in P/D mode, the decode pool.
    pub ranked: Vec<PodChoice>,
    /// P/D mode: the prefill pod, named to the decode pod by `x-prefiller-host-port`.
    pub prefill: Option<PodChoice>,
    /// The most cached blocks any reachable pod of the pool that computes the prompt held
    /// (in P/D mode the prefill pool): what the pick could have reused at best.
    pub best_cached_blocks: u32,
    pub timings: Timings,
    /// The prompt's token ids, kept for RecordRoute only (never serialized or logged).
    #[serde(skip)]
    pub tokens: Option<Arc<Vec<u32>>>,
    #[serde(skip)]
    pub lora_name: Option<String>,
    #[serde(skip)]
    pub cache_salt: Option<String>,
    #[serde(skip)]
    pub base_model: String,
}

impl Decision {
    /// Response headers for the pod that served (`attempt` into `ranked`).
    pub fn headers(&self, attempt: usize) -> Vec<(&'static str, String)> {
        let mut headers =
            vec![("x-kvindex-request-id", self.id.to_string()), ("x-kvindex-score", self.score.label().to_string())];
        if let Some(choice) = self.ranked.get(attempt) {
            headers.push(("x-kvindex-pod", choice.pod.clone()));
            headers.push(("x-kvindex-matched-blocks", choice.matched_blocks.to_string()));
            headers.push(("x-kvindex-speculative-blocks", choice.speculative_blocks.to_string()));
        }
        headers.push(("x-kvindex-total-blocks", self.total_blocks.to_string()));
        if let Some(prefill) = &self.prefill {
            headers.push(("x-kvindex-prefill-pod", prefill.pod.clone()));
            headers.push(("x-kvindex-prefill-matched-blocks", prefill.matched_blocks.to_string()));
        }
        headers
    }

    /// The ranking in one compact field: `pod:cached/total,load=..,kv=..,cost=..;…`.
    pub fn candidates_summary(&self) -> String {
        let mut out = String::new();
        for (i, c) in self.ranked.iter().enumerate() {
            if i > 0 {
                out.push(';');
            }
            summarize(&mut out, c, self.total_blocks);
        }
        out
    }

    /// The pod whose KV cache the prompt is computed in when `ranked[attempt]` serves: the
    /// prefill pod in P/D mode, else that pod.
    pub fn holder(&self, attempt: usize) -> Option<&PodChoice> {
        self.prefill.as_ref().or(self.ranked.get(attempt))
    }

    /// How the pick compares with the best overlap available (`kvindex_router_overlap_picks_total`).
    pub fn overlap_outcome(&self, attempt: usize) -> OverlapOutcome {
        let Some(holder) = self.holder(attempt) else { return OverlapOutcome::Unscored };
        match &self.score {
            ScoreOutcome::FailOpen { .. } => OverlapOutcome::Unscored,
            ScoreOutcome::Scored { .. } if self.best_cached_blocks == 0 => OverlapOutcome::NoOverlap,
            ScoreOutcome::Scored { .. } if holder.cached_blocks >= self.best_cached_blocks => OverlapOutcome::Best,
            ScoreOutcome::Scored { .. } => OverlapOutcome::BelowBest,
        }
    }

    pub fn prefill_summary(&self) -> String {
        let mut out = String::new();
        if let Some(p) = &self.prefill {
            summarize(&mut out, p, self.total_blocks);
        }
        out
    }
}

/// Where a pick stands against the best cached prefix any pod held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapOutcome {
    /// The pod holding the most cached blocks (or one tied with it).
    Best,
    /// A pod holding fewer than the best: load or the KV cutoff outweighed the prefix.
    BelowBest,
    /// No pod held any block of the prompt: nothing to reuse.
    NoOverlap,
    /// Placed by load only (fail-open): the overlaps were not known.
    Unscored,
}

impl OverlapOutcome {
    pub fn label(self) -> &'static str {
        match self {
            OverlapOutcome::Best => "best",
            OverlapOutcome::BelowBest => "below_best",
            OverlapOutcome::NoOverlap => "no_overlap",
            OverlapOutcome::Unscored => "unscored",
        }
    }
}

/// `pod:cached/total[(spec n)],load=..[,queued_prefill=blocks][,shared=requests/blocks][,kv=usage[/capacity tok],kv_cost=..],cost=..[,flags]`:
/// enough to recompute the cost by hand (the KV term is `kv_cost`, the rest is the
/// documented weights times the numbers shown).
fn summarize(out: &mut String, c: &PodChoice, total: u32) {
    let _ = write!(out, "{}:{}/{}", c.pod, c.cached_blocks, total);
    if c.speculative_blocks > c.matched_blocks {
        let _ = write!(out, "(spec {})", c.speculative_blocks);
    }
    let (requests, queued_prefill) = combined(&c.load, c.shared);
    let _ = write!(out, ",load={requests}");
    if queued_prefill > 0 {
        let _ = write!(out, ",queued_prefill={queued_prefill}");
    }
    if let Some(shared) = c.shared {
        let _ = write!(out, ",shared={}/{}", shared.requests, shared.prefill_blocks);
    }
    if let Some(kv) = c.load.kv_usage {
        let _ = write!(out, ",kv={kv:.2}");
        if let Some(tokens) = c.load.kv_tokens {
            let _ = write!(out, "/{tokens}tok");
        }
        let _ = write!(out, ",kv_cost={:.1}", c.kv_cost);
    }
    let _ = write!(out, ",cost={:.1}", c.cost);
    if c.over_kv_cutoff {
        out.push_str(",over_kv_cutoff");
    }
    if !c.load.reachable {
        out.push_str(",unreachable");
    }
}
