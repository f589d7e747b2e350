//! RecordRoute: a router's note that it just sent a prompt to a pod, turned into speculative
//! credit ([`kvindex::speculative`]) that every router replica sees in
//! `PodScore.speculative_blocks` until the engine's own events replace it or its TTL ends.
//!
//! It never changes what the index holds, but it does change where routers send new prompts:
//! whoever may call it can steer traffic to a pod of its choosing and fill the credit table.
//! So it takes the control plane's bearer token ([`authorize`]): without
//! `admin_token_file` it is off (PERMISSION_DENIED, as RegisterPod), with it a call without the
//! token is UNAUTHENTICATED; both are counted and change nothing. Each caller (peer address,
//! [`caller_of`]) holds at most `speculative_max_entries_per_caller` credits.
//!
//! Every request is checked before anything is recorded: a known pod whose source can be
//! trusted, serving the request's model, within the token and name bounds; a bad request gets
//! INVALID_ARGUMENT (or NOT_FOUND / FAILED_PRECONDITION) and a counted outcome. A TTL above
//! the configured maximum is capped to it (the answer says which TTL applied).
//!
//! A call may also carry reservations (the routers' shared in-flight load, [`super::in_flight`]):
//! they are taken before the credit is computed, and then the credit's refusal does not fail
//! the call (it is counted, and answered as `credited_blocks = 0`); a call with reservations and
//! no token ids asks for no credit at all.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};

use tonic::Status;

use kvindex::ScoreQuery;
use kvindex_proto::kvindex::v1 as pb;

use super::in_flight::InFlightLoad;
use super::score::{may_speculate, speculative_namespace, wire_state, MAX_NAME};
use crate::index_handle::IndexHandle;
use crate::pods::auth::{ControlPlane, Denied};
use crate::telemetry as m;

fn rejected(outcome: &'static str, status: Status) -> Status {
    metrics::counter!(m::RECORD_ROUTE_REQUESTS, "outcome" => outcome).increment(1);
    status
}

/// RecordRoute and ReleaseRoute calls refused for want of the token, for logging at powers of
/// two only (a misconfigured router sends one per request).
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// RecordRoute's gate: the control plane's token in the `authorization` value, or
/// PERMISSION_DENIED (no token configured: `no_admin_token`) / UNAUTHENTICATED
/// (`missing_token`, `wrong_token`), counted in `kvindex_record_route_requests_total`.
pub fn authorize(control: &ControlPlane, authorization: Option<&str>, caller: &str) -> Result<(), Status> {
    gate(control, authorization, caller, "RecordRoute", m::RECORD_ROUTE_REQUESTS)
}

/// The gate of the calls that steer placement (`method`), counting refusals in `counter` by
/// outcome (see [`authorize`]).
pub fn gate(
    control: &ControlPlane,
    authorization: Option<&str>,
    caller: &str,
    method: &'static str,
    counter: &'static str,
) -> Result<(), Status> {
    let Err(denied) = control.check(authorization) else { return Ok(()) };
    let n = REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_power_of_two() {
        tracing::warn!(caller, method, reason = denied.label(), refused = n, "call refused: no valid admin token");
    }
    let outcome = match denied {
        Denied::Disabled => "no_admin_token",
        other => other.label(),
    };
    metrics::counter!(counter, "outcome" => outcome).increment(1);
    Err(match denied {
        Denied::Disabled => Status::permission_denied(format!(
            "{method} is disabled: it needs the control plane's bearer token \
             (start kvindex serve with admin_token_file, and kvindex-router with --indexer-admin-token-file)"
        )),
        other => Status::unauthenticated(other.to_string()),
    })
}

/// Who a call comes from, for its share of the credit table: the peer's IP address, an IPv6
/// peer by its /64 (one host may hold a whole /64), `unknown` without an address.
pub fn caller_of(remote: Option<SocketAddr>) -> String {
    match remote.map(|a| a.ip().to_canonical()) {
        Some(IpAddr::V4(ip)) => ip.to_string(),
        Some(IpAddr::V6(ip)) => {
            let s = ip.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        None => "unknown".to_string(),
    }
}

/// Whether the request asks for speculative credit: it has token ids, or it carries no
/// reservations (a plain RecordRoute, checked and answered as before reservations existed).
pub fn wants_credit(req: &pb::RecordRouteRequest) -> bool {
    !req.token_ids.is_empty() || req.reservations.is_empty()
}

/// The checks that need no index lookup (RecordRoute on, token and name bounds, the
/// reservations' bounds), made before a request is admitted to a scoring slot.
pub fn check_request(
    index: &IndexHandle,
    in_flight: &InFlightLoad,
    max_tokens: usize,
    req: &pb::RecordRouteRequest,
) -> Result<(), Status> {
    if let Err(invalid) = in_flight.check(&req.reservations) {
        return Err(rejected("invalid", Status::invalid_argument(invalid.to_string())));
    }
    if !wants_credit(req) {
        return Ok(());
    }
    check_credit(index, max_tokens, req)
}

/// The credit's own checks (see [`check_request`]).
fn check_credit(index: &IndexHandle, max_tokens: usize, req: &pb::RecordRouteRequest) -> Result<(), Status> {
    if index.speculative().config().max_entries == 0 && req.reservations.is_empty() {
        return Err(rejected(
            "disabled",
            Status::failed_precondition("RecordRoute is off (speculative_max_entries = 0)"),
        ));
    }
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
    Ok(())
}

/// Checks and records one RecordRoute request from `caller` (see [`caller_of`]); the caller
/// is authorized already ([`authorize`]).
pub fn record_route(
    handle: &IndexHandle,
    max_tokens: usize,
    req: &pb::RecordRouteRequest,
    caller: &str,
) -> Result<pb::RecordRouteResponse, Status> {
    check_credit(handle, max_tokens, req)?;
    let speculative = handle.speculative();
    let ttl_ms = speculative.ttl(u64::from(req.ttl_ms)) as u32;
    if speculative.config().max_entries == 0 {
        // Off, and the call carries reservations (check_credit refused it otherwise).
        metrics::counter!(m::RECORD_ROUTE_REQUESTS, "outcome" => "ok").increment(1);
        return Ok(pb::RecordRouteResponse { credited_blocks: 0, ttl_ms, ..Default::default() });
    }
    let source = handle.status().pod_states().get(&req.pod).map(|p| p.state);
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
    let index = handle.index();
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
    let outcome = speculative.record(&req.pod, caller, &keys, held, u64::from(req.ttl_ms), handle.now_ms());
    metrics::counter!(m::RECORD_ROUTE_REQUESTS, "outcome" => "ok").increment(1);
    metrics::counter!(m::SPECULATIVE_BLOCKS, "result" => "credited").increment(u64::from(outcome.credited));
    if let Some(bound) = outcome.bound.filter(|_| outcome.refused > 0) {
        metrics::counter!(m::SPECULATIVE_BLOCKS, "result" => "refused", "bound" => bound.label())
            .increment(u64::from(outcome.refused));
    }
    Ok(pb::RecordRouteResponse {
        credited_blocks: outcome.credited,
        ttl_ms: outcome.ttl_ms as u32,
        ..Default::default()
    })
}
