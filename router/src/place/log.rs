//! The one decision line per request (`target: kvindex_router::decision`, message `routed`),
//! whichever door the request came through: the request id, what was scored and how, every
//! candidate with its numbers, the pod named and the time of each stage. Never the prompt or
//! its token ids.

use super::decision::Decision;
use super::request::Endpoint;
use crate::config::ext_proc::Mode;

/// The door a decision was made for, with what only that door knows.
#[derive(Debug, Clone, Copy)]
pub enum Door {
    /// The OpenAI proxy: the pod that answered (`attempt` into the ranking; `None` when none
    /// did) and the upstream status (502 when none answered).
    Proxy { endpoint: Endpoint, attempt: Option<usize>, status: u16 },
    /// The endpoint picker: the pod named is the ranking's first.
    ExtProc { mode: Mode },
}

impl Door {
    fn label(self) -> &'static str {
        match self {
            Door::Proxy { .. } => "http",
            Door::ExtProc { .. } => "ext_proc",
        }
    }
}

/// Writes the decision line.
pub fn routed(decision: &Decision, door: Door) {
    let (endpoint, mode, attempt, status) = match door {
        Door::Proxy { endpoint, attempt, status } => (Some(endpoint.label()), None, attempt, Some(status)),
        Door::ExtProc { mode } => (None, Some(mode.label()), None, None),
    };
    let chosen = match door {
        Door::Proxy { attempt, .. } => attempt.and_then(|a| decision.ranked.get(a)),
        Door::ExtProc { .. } => decision.ranked.first(),
    };
    tracing::info!(
        target: "kvindex_router::decision",
        request_id = decision.id,
        door = door.label(),
        endpoint,
        mode,
        model = %decision.model,
        policy = decision.policy,
        prompt_tokens = decision.prompt_tokens,
        total_blocks = decision.total_blocks,
        score = decision.score.label(),
        pod = chosen.map(|c| c.pod.as_str()),
        matched_blocks = chosen.map(|c| c.matched_blocks),
        cached_blocks = chosen.map(|c| c.cached_blocks),
        best_cached_blocks = decision.best_cached_blocks,
        cost = chosen.map(|c| c.cost),
        attempt,
        status,
        prefill = %decision.prefill_summary(),
        candidates = %decision.candidates_summary(),
        tokenize_us = decision.timings.tokenize_us,
        score_us = decision.timings.score_us,
        pick_us = decision.timings.pick_us,
        route_us = decision.timings.total_us,
        "routed"
    );
}
