//! ScoreTokens, shared by both gRPC contracts: checks a request's limits, asks the index, and
//! answers with each pod's matched blocks (whole engine blocks, as the index credits them), tier
//! counts, source state and credit unit, plus the speculative run RecordRoute credited (in its
//! own field, never in `matched_blocks`, cut to the pod's unit and the prompt's last token as the
//! exact match is). A pod whose source
//! is too far behind its engine (`max_source_staleness_ms`, `write::worker::staleness`) is answered as
//! holding nothing, STALE, until it catches up: its blocks may have been evicted meanwhile.

use std::collections::HashMap;
use tonic::Status;

use kvindex::index::tiers::TierId;
use kvindex::sequencer::SourceState;
use kvindex::ScoreQuery;
use kvindex_proto::kvindex::v1 as pb;

use crate::index_handle::IndexHandle;
use crate::status::PodState;
use crate::telemetry as m;

/// Longest pod id or name accepted in a request.
pub const MAX_NAME: usize = 1024;
/// Most pods in a ScoreTokens filter.
const MAX_FILTER: usize = 65_536;

/// The wire enum for a source state: REPLAYING and CONNECTING may lag the engine, so they are
/// flagged like STALE.
pub fn wire_state(state: Option<SourceState>) -> pb::SourceState {
    match state {
        Some(SourceState::Exact) => pb::SourceState::Exact,
        Some(SourceState::Degraded) => pb::SourceState::Degraded,
        Some(SourceState::Stale | SourceState::Replaying | SourceState::Connecting) => pb::SourceState::Stale,
        None => pb::SourceState::Unspecified,
    }
}

/// The state an answer reports for a pod: STALE while its source is withheld for lag.
pub fn answered_state(pod: Option<PodState>) -> pb::SourceState {
    match pod {
        Some(PodState { withheld: true, .. }) => pb::SourceState::Stale,
        _ => wire_state(pod.map(|p| p.state)),
    }
}

/// Whether a pod in `state` may carry speculative credit: not one whose events cannot be
/// trusted right now (DEGRADED, STALE).
pub fn may_speculate(state: Option<SourceState>) -> bool {
    matches!(state, Some(SourceState::Exact | SourceState::Connecting | SourceState::Replaying))
}

/// The namespace speculative credit is keyed in: the LoRA adapter, else the model.
pub fn speculative_namespace<'a>(model: &'a str, lora_name: &'a str) -> &'a str {
    if lora_name.is_empty() {
        model
    } else {
        lora_name
    }
}

fn invalid(msg: String) -> Status {
    metrics::counter!(m::SCORE_REQUESTS, "outcome" => "invalid").increment(1);
    Status::invalid_argument(msg)
}

/// Answers ScoreTokens requests from the service's index.
pub struct Scorer {
    index: IndexHandle,
    /// Largest prompt, in tokens (`max_tokens`).
    max_tokens: usize,
}

impl Scorer {
    pub fn new(index: IndexHandle, max_tokens: usize) -> Self {
        Scorer { index, max_tokens }
    }

    /// Largest prompt, in tokens (`max_tokens`).
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The request's limits (tokens, filter, names): INVALID_ARGUMENT, counted, past one.
    pub fn check(&self, req: &pb::ScoreTokensRequest) -> Result<(), Status> {
        let max_tokens = self.max_tokens;
        if req.token_ids.len() > max_tokens {
            return Err(invalid(format!(
                "token_ids has {} tokens, more than max_tokens = {max_tokens}",
                req.token_ids.len()
            )));
        }
        if req.pods.len() > MAX_FILTER {
            return Err(invalid(format!("pods has {} entries, more than {MAX_FILTER}", req.pods.len())));
        }
        for (field, v) in [("model", &req.model), ("lora_name", &req.lora_name), ("cache_salt", &req.cache_salt)] {
            if v.len() > MAX_NAME {
                return Err(invalid(format!("{field} is longer than {MAX_NAME} bytes")));
            }
        }
        if req.pods.iter().any(|p| p.is_empty() || p.len() > MAX_NAME) {
            return Err(invalid("pods entries must be non-empty pod ids".to_string()));
        }
        Ok(())
    }

    /// Checks `req` ([`check`](Self::check)) and scores it.
    pub fn score(&self, req: &pb::ScoreTokensRequest) -> Result<pb::ScoreTokensResponse, Status> {
        self.check(req)?;
        let index = self.index.index();
        let filter: Option<Vec<&str>> = (!req.pods.is_empty()).then(|| req.pods.iter().map(String::as_str).collect());
        let result = index.score(&ScoreQuery {
            model: &req.model,
            lora_name: (!req.lora_name.is_empty()).then_some(req.lora_name.as_str()),
            cache_salt: (!req.cache_salt.is_empty()).then_some(req.cache_salt.as_str()),
            token_ids: &req.token_ids,
            pods: filter.as_deref(),
        });
        let states = self.index.status().pod_states();
        let tiers = index.tiers();
        let mut by_name: HashMap<String, pb::PodScore> = HashMap::new();
        let mut withheld = 0;
        for mt in &result.matches {
            let Some(name) = index.pods().name(mt.pod) else { continue };
            let source = states.get(&*name).copied();
            if source.is_some_and(|p| p.withheld) {
                // Too far behind its engine: not credited (answered below as holding nothing).
                withheld += 1;
                continue;
            }
            let matched_by_tier = mt
                .by_tier
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (tiers.name(TierId(i as u8)), *n))
                .collect();
            let unit = index.credit_unit(&name);
            by_name.insert(
                name.to_string(),
                pb::PodScore {
                    pod: name.to_string(),
                    matched_blocks: mt.matched_blocks,
                    weighted_score: mt.weighted_score,
                    matched_by_tier,
                    state: answered_state(source) as i32,
                    speculative_blocks: 0,
                    credit_unit_tokens: unit.0,
                    eagle: unit.1,
                },
            );
        }
        if withheld > 0 {
            metrics::counter!(m::SCORES_WITHHELD).increment(withheld);
        }
        let speculative = self.index.speculative();
        if speculative.entries() > 0 {
            let keys = speculative.keys(
                speculative_namespace(&req.model, &req.lora_name),
                (!req.cache_salt.is_empty()).then_some(req.cache_salt.as_str()),
                &req.token_ids,
            );
            let runs = speculative.runs(&keys, self.index.now_ms(), |pod| {
                let admitted = req.pods.is_empty() || req.pods.iter().any(|p| p == pod);
                let source = states.get(pod).copied();
                (admitted && source.is_some_and(|p| !p.withheld) && may_speculate(source.map(|p| p.state)))
                    .then(|| by_name.get(pod).map_or(0, |s| s.matched_blocks))
            });
            for (pod, run) in runs {
                // What the engine could reuse of the run once it holds it: whole engine blocks,
                // never this prompt's last token, less a block with EAGLE.
                let run = index.cut_credit(&pod, run, req.token_ids.len());
                let score = by_name.entry(pod.to_string()).or_insert_with(|| {
                    let unit = index.credit_unit(&pod);
                    pb::PodScore {
                        pod: pod.to_string(),
                        state: answered_state(states.get(&*pod).copied()) as i32,
                        credit_unit_tokens: unit.0,
                        eagle: unit.1,
                        ..Default::default()
                    }
                });
                if run > score.matched_blocks {
                    score.speculative_blocks = run;
                }
            }
        }
        let scores = if req.pods.is_empty() {
            let mut v: Vec<pb::PodScore> =
                by_name.into_values().filter(|s| s.matched_blocks > 0 || s.speculative_blocks > 0).collect();
            v.sort_by(|a, b| b.matched_blocks.cmp(&a.matched_blocks).then_with(|| a.pod.cmp(&b.pod)));
            v
        } else {
            let mut seen = std::collections::HashSet::new();
            req.pods
                .iter()
                .filter(|p| seen.insert(p.as_str()))
                .map(|p| {
                    by_name.remove(p).unwrap_or_else(|| {
                        let unit = index.credit_unit(p);
                        pb::PodScore {
                            pod: p.clone(),
                            matched_blocks: 0,
                            weighted_score: 0.0,
                            matched_by_tier: HashMap::new(),
                            state: answered_state(states.get(p.as_str()).copied()) as i32,
                            speculative_blocks: 0,
                            credit_unit_tokens: unit.0,
                            eagle: unit.1,
                        }
                    })
                })
                .collect()
        };
        Ok(pb::ScoreTokensResponse {
            scores,
            total_blocks: result.total_blocks,
            block_size: index.block_size() as u32,
            in_flight: None,
        })
    }
}
