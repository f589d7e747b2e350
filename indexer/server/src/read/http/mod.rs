//! HTTP admin: `/metrics`, `/healthz`, `/readyz`, `/debug/sources`, and pod registration
//! (`POST /pods`, `DELETE /pods/{pod}`), which only answers a bearer token ([`crate::pods::auth`]).
//! With `metrics_addr` set, `/metrics` and `/debug/*` move to their own listener
//! ([`metrics_router`]) so the port that serves probes and registration can be exposed without
//! the debug views, and Prometheus can reach the metrics without reaching anything else. With
//! `probe_addr` set, `/healthz` and `/readyz` are also served on a listener of their own
//! ([`probe_router`]), which the clients of the other ports cannot fill.
//! Both listeners are served within connection and time bounds ([`serve`]); the one body an
//! endpoint reads, a registration's, within size, time and memory bounds ([`body`]).

pub mod body;
pub mod serve;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;

use kvindex::index::tiers::TierId;

use crate::config::pod::PodConfig;
use crate::index_handle::IndexHandle;
use crate::pods::auth::{ControlPlane, Denied};
use crate::pods::lifecycle::Pods;
use crate::queue::Queues;
use crate::readiness::Readiness;
use crate::telemetry as m;

/// What the HTTP admin uses of the rest of the service: readiness for the probes, the pods and
/// the control plane's gate for registration, and for `/debug/sources` the index, the queues
/// and the sources' mode.
#[derive(Clone)]
pub struct Handles {
    pub index: IndexHandle,
    pub pods: Pods,
    pub control: ControlPlane,
    pub queues: Arc<Queues>,
    pub readiness: Arc<Readiness>,
    /// Central mode's bound endpoint (`zmq_bind`), and the subscription, as `/debug` shows them.
    pub central_bind: Option<String>,
    pub topic_filter: String,
}

#[derive(Clone)]
struct AppState {
    handles: Handles,
    prometheus: PrometheusHandle,
    /// The request bodies being read, shared by both listeners (only `http_addr` reads any;
    /// `/metrics` reports what they hold).
    bodies: body::Bodies,
}

/// The routes of `http_addr`: health, readiness, registration, and `/metrics` and `/debug/*`
/// when `with_metrics` (no separate metrics listener).
pub fn router(handles: Handles, prometheus: PrometheusHandle, bodies: body::Bodies, with_metrics: bool) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/pods", post(register))
        .route("/pods/{pod}", delete(unregister));
    if with_metrics {
        router = router.merge(observability());
    }
    router.fallback(not_found).with_state(AppState { handles, prometheus, bodies })
}

/// The routes of the metrics-only listener (`metrics_addr`): `/metrics`, `/debug/*`, and
/// health and readiness (harmless, and handy for a sidecar probing one port).
pub fn metrics_router(handles: Handles, prometheus: PrometheusHandle, bodies: body::Bodies) -> Router {
    observability()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(AppState { handles, prometheus, bodies })
}

/// The routes of the probe listener (`probe_addr`): health and readiness, nothing else.
pub fn probe_router(handles: Handles, prometheus: PrometheusHandle, bodies: body::Bodies) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(AppState { handles, prometheus, bodies })
}

fn observability() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics)).route("/debug/sources", get(debug_sources))
}

async fn not_found() -> Response {
    metrics::counter!(m::HTTP_INVALID, "reason" => "not_found").increment(1);
    (StatusCode::NOT_FOUND, Json(json!({"error": "no such endpoint"}))).into_response()
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    metrics::gauge!(m::HTTP_BODY_BYTES).set(s.bodies.held() as f64);
    let mut text = s.prometheus.render();
    crate::source_series::SourceSeries::global().render(&mut text);
    ([("content-type", "text/plain; version=0.0.4")], text)
}

async fn readyz(State(s): State<AppState>) -> Response {
    let readiness = &s.handles.readiness;
    let pending = readiness.outstanding();
    if readiness.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {pending} initial replays outstanding\n")).into_response()
    }
}

async fn debug_sources(State(s): State<AppState>) -> Json<serde_json::Value> {
    let h = &s.handles;
    let index = h.index.index();
    let streams: Vec<serde_json::Value> = h
        .index
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
                // vLLM's check counts in the index, SGLang's in its stream (`page_hash_check`).
                let (sgl_checked, sgl_mismatched) =
                    d.page_hash_check.as_ref().map_or((0, 0), |c| (u64::from(c.checked), u64::from(c.mismatched)));
                obj.insert(
                    "hash_check_mismatches".into(),
                    json!(u64::from(stats.hash_check.mismatched) + sgl_mismatched),
                );
                obj.insert("hash_check_checked".into(), json!(u64::from(stats.hash_check.checked) + sgl_checked));
            }
            v
        })
        .collect();
    let reg = h.pods.registry();
    let queues = &h.queues;
    Json(json!({
        "ready": h.readiness.is_ready(),
        "mode": {
            "central_bind": h.central_bind,
            "topic_filter": h.topic_filter,
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
    #[serde(default, deserialize_with = "crate::config::pod::engine_name")]
    engine: Option<kvindex::wire::Engine>,
    #[serde(default)]
    page_size: Option<u32>,
    #[serde(default, deserialize_with = "crate::config::pod::parsed")]
    sglang_release: Option<kvindex::sglang::SglangRelease>,
    #[serde(default, deserialize_with = "crate::config::pod::parsed")]
    sglang_event_format: Option<kvindex::sglang::EventFormat>,
    #[serde(default)]
    eagle: Option<bool>,
    #[serde(default)]
    context_parallel: Option<u32>,
}

fn bad_request(reason: &'static str, message: String) -> Response {
    metrics::counter!(m::HTTP_INVALID, "reason" => reason).increment(1);
    (StatusCode::BAD_REQUEST, Json(json!({"error": message}))).into_response()
}

/// The control plane's gate: `None` to go on, or the refusal as 403 (registration disabled)
/// or 401 (token).
fn refused(s: &AppState, headers: &HeaderMap) -> Option<Response> {
    let authorization = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    let denied = s.handles.control.authorize("http", authorization).err()?;
    let status = if denied == Denied::Disabled { StatusCode::FORBIDDEN } else { StatusCode::UNAUTHORIZED };
    let body = Json(json!({"error": denied.to_string()}));
    Some((status, [(WWW_AUTHENTICATE, "Bearer")], body).into_response())
}

/// `POST /pods`. The token is checked before the body is read: without it, nobody can make
/// the server hold a byte of one.
async fn register(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    if let Some(refusal) = refused(&s, &headers) {
        return refusal;
    }
    let json = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(is_json);
    if !json {
        return bad_request("body", "Expected request with `Content-Type: application/json`".into());
    }
    let (bytes, held) = match s.bodies.read(&headers, body).await {
        Ok(read) => read,
        Err(refusal) => return refusal,
    };
    let b = match Json::<RegisterBody>::from_bytes(&bytes) {
        Ok(Json(b)) => b,
        Err(e) => return bad_request("body", e.body_text()),
    };
    // Parsed: the bytes leave the budget.
    drop((bytes, held));
    let mut cfg = PodConfig {
        id: b.pod,
        model: b.model,
        endpoint: b.endpoint.filter(|e| !e.is_empty()),
        replay_endpoint: b.replay_endpoint.filter(|e| !e.is_empty()),
        topic_id: b.topic_id.filter(|e| !e.is_empty()),
        dp_size: b.dp_size.unwrap_or(1),
        engine: b.engine,
        page_size: b.page_size,
        sglang_release: b.sglang_release,
        sglang_event_format: b.sglang_event_format,
        eagle: b.eagle.unwrap_or(false),
        context_parallel: b.context_parallel.unwrap_or(1),
    };
    if let Err(refused) = s.handles.pods.may_change("http", &cfg.id) {
        return (StatusCode::CONFLICT, Json(json!({"error": refused.to_string()}))).into_response();
    }
    if let Err(refused) = s.handles.control.pin_endpoints("http", &mut cfg).await {
        return (StatusCode::FORBIDDEN, Json(json!({"error": refused.to_string()}))).into_response();
    }
    match s.handles.pods.register(cfg, "http", false).await {
        Ok(()) => (StatusCode::OK, Json(json!({"registered": true}))).into_response(),
        Err(e) => bad_request("config", e.to_string()),
    }
}

/// `application/json`, with or without parameters, or a `+json` type (what axum's `Json`
/// accepted).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

async fn unregister(State(s): State<AppState>, headers: HeaderMap, Path(pod): Path<String>) -> Response {
    if let Some(refusal) = refused(&s, &headers) {
        return refusal;
    }
    if let Err(refused) = s.handles.pods.may_change("http", &pod) {
        return (StatusCode::CONFLICT, Json(json!({"error": refused.to_string()}))).into_response();
    }
    let existed = s.handles.pods.unregister(&pod, "http").await;
    (StatusCode::OK, Json(json!({"existed": existed}))).into_response()
}
