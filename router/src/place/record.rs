//! Predict on route, and the request's reservation: after a pick, every indexer in rotation is
//! asked (RecordRoute) to credit the pod with the prompt's blocks for a short TTL, so the next
//! sibling request, routed by any replica, sees the pick before the engine's events arrive; and
//! to reserve the request on its pod(s) (shared in-flight load, [`super::reserve`]), in the same
//! call. Sent in the background, bounded in number per indexer, never delaying the request; a
//! failure only costs the prediction or the shared count (counted).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvindex_proto::kvindex::v1 as pb;

use super::decision::{Decision, ScoreOutcome};
use super::indexer::IndexerPool;
use crate::config::IndexerToken;
use crate::metrics as m;

/// Most RecordRoute calls in flight at once to one indexer; past it a pick is not recorded
/// there (counted).
const MAX_RECORDING: usize = 1024;

/// Sends RecordRoute calls, at most [`MAX_RECORDING`] at once per indexer.
pub struct Recorder {
    /// RecordRoute's credit TTL; zero = no credit asked.
    ttl: Duration,
    timeout: Duration,
    /// The indexers' admin token, which RecordRoute needs; `None` = off.
    token: Option<IndexerToken>,
    /// Calls in flight per indexer endpoint (bounded: a slow indexer must not pile them up).
    recording: Arc<[AtomicUsize]>,
    /// Whether a call refused for its token was logged already (once is enough: every pick
    /// would log it).
    denied_logged: Arc<AtomicBool>,
}

impl Recorder {
    /// A recorder for the `endpoints` indexers of the pool.
    pub fn new(ttl: Duration, timeout: Duration, token: Option<IndexerToken>, endpoints: usize) -> Recorder {
        Recorder {
            ttl,
            timeout,
            token,
            recording: (0..endpoints).map(|_| AtomicUsize::new(0)).collect(),
            denied_logged: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The credit of `decision`'s prompt on `pod`, if one is to be asked: RecordRoute on, a
    /// prompt of full blocks, scored (placed by load only, the indexer did not answer in time:
    /// don't queue more work on it).
    fn credit(&self, decision: Option<&Decision>, pod: &str) -> Option<pb::RecordRouteRequest> {
        let decision = decision?;
        if self.ttl.is_zero() || decision.total_blocks == 0 {
            return None;
        }
        let (Some(tokens), ScoreOutcome::Scored { .. }) = (&decision.tokens, &decision.score) else { return None };
        Some(pb::RecordRouteRequest {
            pod: pod.to_string(),
            model: decision.base_model.clone(),
            token_ids: tokens.as_ref().clone(),
            lora_name: decision.lora_name.clone().unwrap_or_default(),
            cache_salt: decision.cache_salt.clone().unwrap_or_default(),
            ttl_ms: u32::try_from(self.ttl.as_millis()).unwrap_or(u32::MAX),
            reservations: Vec::new(),
        })
    }

    /// Asks every indexer in rotation, in the background, to credit `pod` with the decision's
    /// prompt (when there is one to credit) and to take `reservations`
    /// (`kvindex_router_record_route_total`, `kvindex_router_reservations_total`).
    pub fn record(
        &self,
        indexer: &IndexerPool,
        decision: Option<&Decision>,
        pod: &str,
        reservations: Vec<pb::Reservation>,
    ) {
        let Some(token) = &self.token else { return };
        let credit = self.credit(decision, pod);
        if credit.is_none() && reservations.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let asked = reservations.len() as u64;
        let request = match credit {
            Some(credit) => pb::RecordRouteRequest { reservations, ..credit },
            None => pb::RecordRouteRequest { reservations, ..Default::default() },
        };
        let live = indexer.live_clients();
        count_reservations("skipped", asked * (indexer.len() - live.len()) as u64);
        for (index, mut client) in live {
            let Some(recording) = self.recording.get(index) else { continue };
            if recording.fetch_add(1, Ordering::AcqRel) >= MAX_RECORDING {
                recording.fetch_sub(1, Ordering::AcqRel);
                metrics::counter!(m::RECORD_ROUTE, "outcome" => "overloaded").increment(1);
                count_reservations("skipped", asked);
                continue;
            }
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(self.timeout);
            call.metadata_mut().insert("authorization", token.authorization());
            let (timeout, recording, denied_logged) =
                (self.timeout, self.recording.clone(), self.denied_logged.clone());
            runtime.spawn(async move {
                let answer = tokio::time::timeout(timeout, client.record_route(call)).await;
                recording[index].fetch_sub(1, Ordering::AcqRel);
                let outcome = match answer {
                    Ok(Ok(answer)) => {
                        let reserved = u64::from(answer.into_inner().reserved).min(asked);
                        count_reservations("reserved", reserved);
                        count_reservations("refused", asked - reserved);
                        "ok"
                    }
                    Ok(Err(status)) => {
                        count_reservations("failed", asked);
                        refused(&status, &denied_logged)
                    }
                    Err(_) => {
                        count_reservations("failed", asked);
                        "timeout"
                    }
                };
                metrics::counter!(m::RECORD_ROUTE, "outcome" => outcome).increment(1);
            });
        }
    }
}

fn count_reservations(outcome: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!(m::RESERVATIONS, "outcome" => outcome).increment(n);
    }
}

/// The outcome label of a refused call; a refusal for the token is logged once.
fn refused(status: &tonic::Status, denied_logged: &AtomicBool) -> &'static str {
    match status.code() {
        tonic::Code::DeadlineExceeded => "timeout",
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
            if !denied_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    code = ?status.code(),
                    message = status.message(),
                    "the indexer refuses RecordRoute: check --indexer-admin-token-file against its admin_token_file \
                     (logged once; counted in kvindex_router_record_route_total{{outcome=\"denied\"}})"
                );
            }
            "denied"
        }
        _ => {
            tracing::debug!(code = ?status.code(), message = status.message(), "RecordRoute refused");
            "error"
        }
    }
}
