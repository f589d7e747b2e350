//! RecordRoute: a router's note that it just sent a prompt to a pod, turned into speculative
//! credit ([`kvindex::speculative`]) that every router replica sees in
//! `PodScore.speculative_blocks` until the engine's own events replace it or its TTL ends.
//!
//! It never changes what the index holds, so it belongs with ScoreTokens on the read plane.
//! Every request is checked before anything is recorded: a known pod whose source can be
//! trusted, serving the request's model, within the token and name bounds; a bad request gets
//! INVALID_ARGUMENT (or NOT_FOUND / FAILED_PRECONDITION) and a counted outcome. A TTL above
//! the configured maximum is capped to it (the answer says which TTL applied).

use std::sync::Arc;

use tonic::Status;

use kvindex::ScoreQuery;
use kvindex_proto::kvindex::v1 as pb;

use super::score::{may_speculate, speculative_namespace, wire_state, MAX_NAME};
use crate::state::ServiceState;
use crate::telemetry as m;

fn rejected(outcome: &'static str, status: Status) -> Status {
    metrics::counter!(m::RECORD_ROUTE_REQUESTS, "outcome" => outcome).increment(1);
    status
}

/// Checks and records one RecordRoute request.
pub fn record_route(
    state: &Arc<ServiceState>,
    req: &pb::RecordRouteRequest,
) -> Result<pb::RecordRouteResponse, Status> {
    let speculative = state.speculative();
    if speculative.config().max_entries == 0 {
        return Err(rejected(
            "disabled",
            Status::failed_precondition("RecordRoute is off (speculative_max_entries = 0)"),
        ));
    }
    let max_tokens = state.config().max_tokens;
    if req.token_ids.len() > max_tokens {
        return Err(rejected(
            "invalid",
            Status::invalid_argument(format!(
                "token_ids has {} tokens, more than max_tokens = {max_tokens}",
                req.token_ids.len()
            )),
        ));
    }
    if req.pod.is_empty() || req.model.is_empty() {
        return Err(rejected("invalid", Status::invalid_argument("pod and model are required")));
    }
    for (field, v) in
        [("pod", &req.pod), ("model", &req.model), ("lora_name", &req.lora_name), ("cache_salt", &req.cache_salt)]
    {
        if v.len() > MAX_NAME {
            return Err(rejected(
                "invalid",
                Status::invalid_argument(format!("{field} is longer than {MAX_NAME} bytes")),
            ));
        }
    }
    let source = state.status().pod_states().get(&req.pod).copied();
    let Some(source) = source else {
        return Err(rejected(
            "unknown_pod",
            Status::not_found(format!("pod {:?} is not a source of this indexer", req.pod)),
        ));
    };
    if !may_speculate(Some(source)) {
        return Err(rejected(
            "pod_not_exact",
            Status::failed_precondition(format!(
                "pod {:?} is {:?}: its blocks are not known exactly, so it is not credited",
                req.pod,
                wire_state(Some(source))
            )),
        ));
    }
    let index = state.index();
    if let Some(stats) = index.pod_stats(&req.pod) {
        if stats.model != req.model {
            return Err(rejected(
                "wrong_model",
                Status::invalid_argument(format!("pod {:?} serves {:?}, not {:?}", req.pod, stats.model, req.model)),
            ));
        }
    }
    // Blocks the pod already holds need no prediction.
    let pods = [req.pod.as_str()];
    let held = index
        .score(&ScoreQuery {
            model: &req.model,
            lora_name: (!req.lora_name.is_empty()).then_some(req.lora_name.as_str()),
            cache_salt: (!req.cache_salt.is_empty()).then_some(req.cache_salt.as_str()),
            token_ids: &req.token_ids,
            pods: Some(&pods),
        })
        .matches
        .first()
        .map_or(0, |m| m.matched_blocks);
    let keys = speculative.keys(
        speculative_namespace(&req.model, &req.lora_name),
        (!req.cache_salt.is_empty()).then_some(req.cache_salt.as_str()),
        &req.token_ids,
    );
    let outcome = speculative.record(&req.pod, &keys, held, u64::from(req.ttl_ms), state.now_ms());
    metrics::counter!(m::RECORD_ROUTE_REQUESTS, "outcome" => "ok").increment(1);
    metrics::counter!(m::SPECULATIVE_BLOCKS, "result" => "credited").increment(u64::from(outcome.credited));
    if outcome.refused > 0 {
        metrics::counter!(m::SPECULATIVE_BLOCKS, "result" => "refused").increment(u64::from(outcome.refused));
    }
    Ok(pb::RecordRouteResponse { credited_blocks: outcome.credited, ttl_ms: outcome.ttl_ms as u32 })
}
