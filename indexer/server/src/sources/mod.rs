//! Live sources: the central SUB (bound; engines dial in, their topics name the pods) and
//! per-pod SUBs (we dial each engine's PUB), and the [`registry`] of pods that decides which
//! exist. The ZeroMQ side is [`crate::transport`]; here every message becomes work for its
//! apply worker, without ever blocking on index application: a full queue drops the message,
//! counts it, and the seq gap it leaves is replayed.
//!
//! Every message carries its connection id: a stream whose messages come on a new connection
//! is resynced from seq 0 (a restarted engine may already be past our cursor). Topic
//! filtering is done by the publisher from our subscription; the worker re-checks the prefix.

pub mod registry;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use crate::apply::{Origin, Work};
use crate::state::ServiceState;
use crate::telemetry as m;
use crate::transport::{self, BoundSub, SubEvent, TransportError};

/// Counts and logs a transport error (`kvindex_zmq_errors_total{operation}`).
pub(crate) fn transport_error(error: &TransportError) {
    metrics::counter!(m::ZMQ_ERRORS, "operation" => error.operation).increment(1);
    tracing::warn!(operation = error.operation, endpoint = %error.endpoint, error = %error.message, "zeromq error");
}

/// Serves the bound central SUB until `stop` is set.
pub async fn serve_central(state: Arc<ServiceState>, sub: BoundSub, stop: watch::Receiver<bool>) {
    tracing::info!(endpoint = %sub.endpoint(), filter = %state.config().topic_filter, "central SUB bound");
    let filter = state.config().topic_filter.clone();
    let on_event = move |event| match event {
        SubEvent::Message { conn, frames } => {
            let queues = state.queues();
            let worker = queues.worker_for(frames.first().map_or(&[][..], |f| f.as_ref()));
            queues.offer_live(worker, Work::Live { origin: Origin::Central, conn, frames, at: Instant::now() });
        }
        SubEvent::Connected { peer, .. } => tracing::info!(peer = %peer, "publisher connected to the central SUB"),
        SubEvent::Disconnected { peer, error, .. } => {
            if let Some(e) = &error {
                transport_error(e);
            }
            tracing::info!(peer = %peer, "publisher disconnected from the central SUB");
        }
        SubEvent::Failed(e) => transport_error(&e),
    };
    sub.serve(filter, on_event, stop).await;
}

/// Dials one pod's PUB endpoint until `stop` is set; re-dials after a disconnect.
pub async fn dial_pod(
    state: Arc<ServiceState>,
    id: Arc<str>,
    model: Arc<str>,
    endpoint: Arc<str>,
    stop: watch::Receiver<bool>,
) {
    let worker = state.queues().worker_for(id.as_bytes());
    let origin = Origin::Pod { id: id.clone(), model, endpoint: endpoint.clone() };
    let filter = state.config().topic_filter.clone();
    let target = endpoint.to_string();
    let connected_before = AtomicBool::new(false);
    let on_event = move |event| match event {
        SubEvent::Message { conn, frames } => {
            state.queues().offer_live(worker, Work::Live { origin: origin.clone(), conn, frames, at: Instant::now() })
        }
        SubEvent::Connected { .. } => {
            if connected_before.swap(true, Ordering::Relaxed) {
                metrics::counter!(m::RECONNECTIONS, "pod" => id.to_string()).increment(1);
            }
            tracing::info!(pod = %id, endpoint = %endpoint, "connected to engine PUB");
        }
        SubEvent::Disconnected { error, .. } => {
            if let Some(e) = &error {
                transport_error(e);
            }
            tracing::warn!(pod = %id, endpoint = %endpoint, "engine PUB disconnected; re-dialling");
        }
        SubEvent::Failed(e) => transport_error(&e),
    };
    transport::dial_sub(target, filter, on_event, stop).await;
}
