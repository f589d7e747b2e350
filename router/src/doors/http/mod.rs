//! The HTTP front door: the OpenAI-compatible proxy ([`openai`]), health, readiness, metrics
//! and the router's view of its pods on `--http-addr`; pod registration ([`admin`]) only on
//! `--admin-addr`, so the public port cannot redirect traffic.

pub mod admin;
pub mod app;
pub mod body;
pub mod forward;
pub mod openai;
pub mod server;
pub mod usage;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router as AxumRouter};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use crate::error::ApiError;
use crate::pods::fleet::PodDp;
pub use app::App;

/// Routes of `--http-addr` (`/metrics` and `/debug/pods` only `with_metrics`, i.e. without a
/// `--metrics-addr`).
pub fn public(app: Arc<App>, with_metrics: bool) -> AxumRouter {
    AxumRouter::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/route/v1/completions", post(openai::explain_completions))
        .route("/route/v1/chat/completions", post(openai::explain_chat_completions))
        .route("/v1/models", get(openai::models))
        .merge(common(with_metrics))
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .fallback(|| async { ApiError::not_found() })
        .with_state(app)
}

/// Routes of `--metrics-addr`: `/metrics`, `/debug/pods`, health and readiness.
pub fn metrics_only(app: Arc<App>) -> AxumRouter {
    common(true).fallback(|| async { ApiError::not_found() }).with_state(app)
}

/// Routes of `--probe-addr`: `/healthz` and `/readyz` only, for the kubelet.
pub fn probes_only(app: Arc<App>) -> AxumRouter {
    common(false).fallback(|| async { ApiError::not_found() }).with_state(app)
}

/// `/healthz`, `/readyz` on every address; `/metrics`, `/debug/pods` too `with_metrics`
/// (no metrics-only listener).
pub fn common(with_metrics: bool) -> AxumRouter<Arc<App>> {
    let router = AxumRouter::new().route("/healthz", get(|| async { "ok\n" })).route("/readyz", get(readyz));
    if !with_metrics {
        return router;
    }
    router.route("/metrics", get(metrics)).route("/debug/pods", get(debug_pods))
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.router.fleet().is_empty() {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: no pods\n").into_response();
    }
    (StatusCode::OK, "ready\n").into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    app.router.tokenizers().record_cache_metrics();
    metrics::gauge!(crate::metrics::HTTP_BODY_BYTES).set(app.body_budget.used() as f64);
    let text = app.prometheus.as_ref().map(PrometheusHandle::render).unwrap_or_default();
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// Every pod with the load the router would use for it now.
async fn debug_pods(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let fleet = app.router.fleet();
    let now = Instant::now();
    let pods: Vec<_> = fleet
        .snapshot()
        .iter()
        .map(|pod| {
            let mut entry = json!({"id": pod.id, "url": pod.url, "role": pod.role, "source": pod.source,
                   "load": pod.load(now, fleet.stale_after())});
            // A rank the router names, or a pod whose engine picks among the ranks it stands for.
            match &pod.dp {
                PodDp::Single => {}
                PodDp::Rank { rank, .. } => entry["dp_rank"] = json!({"pod": pod.spec_id, "rank": rank}),
                PodDp::Balanced(ranks) => entry["dp_ranks"] = json!(ranks),
            }
            entry
        })
        .collect();
    Json(json!({"pods": pods}))
}
