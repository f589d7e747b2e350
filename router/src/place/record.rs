//! Predict on route: after a pick, the indexer is asked to credit the pod with the prompt's
//! blocks for a short TTL (RecordRoute), so the next sibling request, routed by any replica,
//! sees the pick before the engine's events arrive. Sent in the background, bounded in number,
//! never delaying the request; a failure only costs the prediction (counted).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvindex_proto::kvindex::v1 as pb;

use super::decision::{Decision, ScoreOutcome};
use super::indexer::IndexerPool;
use crate::config::IndexerToken;
use crate::metrics as m;

/// Most RecordRoute calls in flight at once; past it a pick is not recorded (counted).
const MAX_RECORDING: usize = 1024;

/// Sends RecordRoute calls, at most [`MAX_RECORDING`] at once.
pub struct Recorder {
    /// RecordRoute's TTL; zero = off.
    ttl: Duration,
    timeout: Duration,
    /// The indexers' admin token, which RecordRoute needs; `None` = off.
    token: Option<IndexerToken>,
    /// Calls in flight (bounded: a slow indexer must not pile them up).
    recording: Arc<AtomicUsize>,
    /// Whether a call refused for its token was logged already (once is enough: every pick
    /// would log it).
    denied_logged: Arc<AtomicBool>,
}

impl Recorder {
    pub fn new(ttl: Duration, timeout: Duration, token: Option<IndexerToken>) -> Recorder {
        Recorder {
            ttl,
            timeout,
            token,
            recording: Arc::new(AtomicUsize::new(0)),
            denied_logged: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Asks the indexer to credit `pod` with the decision's prompt, in the background (`kvindex_router_record_route_total`).
    pub fn record(&self, indexer: &IndexerPool, decision: &Decision, pod: &str) {
        let Some(token) = &self.token else { return };
        if self.ttl.is_zero() || decision.total_blocks == 0 {
            return;
        }
        // Placed by load only: the indexer did not answer in time, so don't queue more on it.
        let (Some(tokens), ScoreOutcome::Scored { .. }) = (&decision.tokens, &decision.score) else { return };
        let Some(mut client) = indexer.preferred_client() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if self.recording.fetch_add(1, Ordering::AcqRel) >= MAX_RECORDING {
            self.recording.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!(m::RECORD_ROUTE, "outcome" => "overloaded").increment(1);
            return;
        }
        let request = pb::RecordRouteRequest {
            pod: pod.to_string(),
            model: decision.base_model.clone(),
            token_ids: tokens.as_ref().clone(),
            lora_name: decision.lora_name.clone().unwrap_or_default(),
            cache_salt: decision.cache_salt.clone().unwrap_or_default(),
            ttl_ms: u32::try_from(self.ttl.as_millis()).unwrap_or(u32::MAX),
        };
        let timeout = self.timeout;
        let recording = self.recording.clone();
        let (authorization, denied_logged) = (token.authorization(), self.denied_logged.clone());
        runtime.spawn(async move {
            let mut call = tonic::Request::new(request);
            call.set_timeout(timeout);
            call.metadata_mut().insert("authorization", authorization);
            let outcome = match tokio::time::timeout(timeout, client.record_route(call)).await {
                Ok(Ok(_)) => "ok",
                Ok(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => "timeout",
                Ok(Err(status))
                    if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) =>
                {
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
                Ok(Err(status)) => {
                    tracing::debug!(code = ?status.code(), message = status.message(), "RecordRoute refused");
                    "error"
                }
                Err(_) => "timeout",
            };
            recording.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!(m::RECORD_ROUTE, "outcome" => outcome).increment(1);
        });
    }
}
