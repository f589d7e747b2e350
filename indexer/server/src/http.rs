//! HTTP admin: `/metrics`, `/healthz`, `/readyz`, `/debug/sources`, and pod registration
//! (`POST /pods`, `DELETE /pods/{pod}`), which only answers a bearer token ([`control`]).
//! With `metrics_addr` set, `/metrics` and `/debug/*` move to their own listener
//! ([`metrics_router`]) so the port that serves probes and registration can be exposed without
//! the debug views, and Prometheus can reach the metrics without reaching anything else.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;

use kvindex::index::tiers::TierId;

use crate::config::PodConfig;
use crate::control::{self, Denied};
use crate::sources::registry;
use crate::state::ServiceState;
use crate::telemetry as m;

#[derive(Clone)]
struct AppState {
    state: Arc<ServiceState>,
    prometheus: PrometheusHandle,
}

/// The routes of `http_addr`: health, readiness, registration, and `/metrics` and `/debug/*`
/// when `with_metrics` (no separate metrics listener).
pub fn router(state: Arc<ServiceState>, prometheus: PrometheusHandle, with_metrics: bool) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/pods", post(register))
        .route("/pods/{pod}", delete(unregister));
    if with_metrics {
        router = router.merge(observability());
    }
    router.fallback(not_found).with_state(AppState { state, prometheus })
}

/// The routes of the metrics-only listener (`metrics_addr`): `/metrics`, `/debug/*`, and
/// health and readiness (harmless, and handy for a sidecar probing one port).
pub fn metrics_router(state: Arc<ServiceState>, prometheus: PrometheusHandle) -> Router {
    observability()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(AppState { state, prometheus })
}

fn observability() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics)).route("/debug/sources", get(debug_sources))
}

async fn not_found() -> Response {
    metrics::counter!(m::HTTP_INVALID, "reason" => "not_found").increment(1);
    (StatusCode::NOT_FOUND, Json(json!({"error": "no such endpoint"}))).into_response()
}

/// Serves `app` on `listener` (over TLS with `tls`; `name` labels its handshake failures)
/// until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<(Arc<tokio_rustls::rustls::ServerConfig>, &'static str)>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), crate::error::ServerError> {
    use crate::error::ServerError::Http;
    match tls {
        None => axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(Http),
        Some((config, name)) => {
            let listener = crate::tls::AxumTls::new(listener, config, name).map_err(Http)?;
            axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(Http)
        }
    }
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    ([("content-type", "text/plain; version=0.0.4")], s.prometheus.render())
}

async fn readyz(State(s): State<AppState>) -> Response {
    let readiness = s.state.readiness();
    let pending = readiness.outstanding();
    if readiness.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {pending} initial replays outstanding\n")).into_response()
    }
}

async fn debug_sources(State(s): State<AppState>) -> Json<serde_json::Value> {
    let state = &s.state;
    let index = state.index();
    let streams: Vec<serde_json::Value> = state
        .status()
        .streams()
        .iter()
        .map(|d| {
            let mut v = serde_json::to_value(d).unwrap_or_default();
            if let (Some(obj), Some(stats)) = (v.as_object_mut(), index.pod_stats(&d.pod)) {
                let tiers: serde_json::Map<String, serde_json::Value> = stats
                    .tier_blocks
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(i, n)| (index.tiers().name(TierId(i as u8)), json!(n)))
                    .collect();
                obj.insert("blocks_by_tier".into(), serde_json::Value::Object(tiers));
                obj.insert("blocks".into(), json!(stats.blocks));
                obj.insert("hash_check_mismatches".into(), json!(stats.hash_check.mismatched));
                obj.insert("hash_check_checked".into(), json!(stats.hash_check.checked));
            }
            v
        })
        .collect();
    let reg = state.registry();
    let queues = state.queues();
    Json(json!({
        "ready": state.readiness().is_ready(),
        "mode": {
            "central_bind": state.config().zmq_bind,
            "topic_filter": state.config().topic_filter,
        },
        "topic_map": reg.topic_mappings(),
        "topic_map_note": "topic ids not listed map to the pod id of the same name",
        "registered_pods": reg.pods(),
        "sources": streams,
        "index": {
            "entries": index.table().entries(),
            "keys": index.table().keys(),
            "approx_bytes": index.table().approx_bytes(),
            "block_size": index.block_size(),
        },
        "queue": {
            "depth": queues.depth(),
            "lag_max_ms": queues.max_lag().as_secs_f64() * 1e3,
            "capacity_per_worker": queues.capacity_per_worker(),
            "workers": queues.workers(),
        },
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterBody {
    pod: String,
    model: String,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    replay_endpoint: Option<String>,
    #[serde(default)]
    topic_id: Option<String>,
    #[serde(default)]
    dp_size: Option<u32>,
}

fn bad_request(reason: &'static str, message: String) -> Response {
    metrics::counter!(m::HTTP_INVALID, "reason" => reason).increment(1);
    (StatusCode::BAD_REQUEST, Json(json!({"error": message}))).into_response()
}

/// The control plane's gate: `None` to go on, or the refusal as 403 (registration disabled)
/// or 401 (token).
fn refused(s: &AppState, headers: &HeaderMap) -> Option<Response> {
    let authorization = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    let denied = control::authorize(&s.state, "http", authorization).err()?;
    let status = if denied == Denied::Disabled { StatusCode::FORBIDDEN } else { StatusCode::UNAUTHORIZED };
    let body = Json(json!({"error": denied.to_string()}));
    Some((status, [(WWW_AUTHENTICATE, "Bearer")], body).into_response())
}

async fn register(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<RegisterBody>, JsonRejection>,
) -> Response {
    if let Some(refusal) = refused(&s, &headers) {
        return refusal;
    }
    let b = match body {
        Ok(Json(b)) => b,
        Err(e) => return bad_request("body", e.body_text()),
    };
    let mut cfg = PodConfig {
        id: b.pod,
        model: b.model,
        endpoint: b.endpoint.filter(|e| !e.is_empty()),
        replay_endpoint: b.replay_endpoint.filter(|e| !e.is_empty()),
        topic_id: b.topic_id.filter(|e| !e.is_empty()),
        dp_size: b.dp_size.unwrap_or(1),
    };
    if let Err(message) = control::may_change(&s.state, "http", &cfg.id) {
        return (StatusCode::CONFLICT, Json(json!({"error": message}))).into_response();
    }
    if let Err(message) = control::pin_endpoints(&s.state, "http", &mut cfg).await {
        return (StatusCode::FORBIDDEN, Json(json!({"error": message}))).into_response();
    }
    match registry::register(&s.state, cfg, "http", false).await {
        Ok(()) => (StatusCode::OK, Json(json!({"registered": true}))).into_response(),
        Err(e) => bad_request("config", e.to_string()),
    }
}

async fn unregister(State(s): State<AppState>, headers: HeaderMap, Path(pod): Path<String>) -> Response {
    if let Some(refusal) = refused(&s, &headers) {
        return refusal;
    }
    if let Err(message) = control::may_change(&s.state, "http", &pod) {
        return (StatusCode::CONFLICT, Json(json!({"error": message}))).into_response();
    }
    let existed = registry::unregister(&s.state, &pod, "http").await;
    (StatusCode::OK, Json(json!({"existed": existed}))).into_response()
}
