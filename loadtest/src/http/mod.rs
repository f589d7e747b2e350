//! One pod's HTTP surface: the OpenAI-compatible API vLLM serves, its `/metrics`, and admin
//! endpoints for the fault knobs. Every error is a JSON body (see [`error`]).

pub mod admin;
pub mod completions;
pub mod error;
pub mod metrics;
pub mod tokenizer;

use axum::extract::DefaultBodyLimit;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::serve::{ListenerExt, TapIo};
use axum::Router;
use tokio::net::{TcpListener, TcpStream};

use crate::pod::Pod;

/// Long prompts as token-id arrays are large JSON bodies; axum's 2 MB default is too small.
const MAX_BODY_BYTES: usize = 64 << 20;

pub fn router(pod: Pod) -> Router {
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat_completions))
        .route("/v1/models", get(admin::models))
        .route("/health", get(admin::health))
        .route("/reset_prefix_cache", post(admin::reset_prefix_cache))
        .route("/metrics", get(metrics::metrics))
        .route("/admin/stats", get(admin::stats))
        .route("/admin/faults/drop", post(admin::drop_batches))
        .route("/admin/faults/pause", post(admin::pause))
        .route("/admin/faults/resume", post(admin::resume))
        .route("/admin/faults/restart-publisher", post(admin::restart_publisher))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(pod)
}

/// The listener with `TCP_NODELAY` on every accepted connection. Without it a streamed
/// response on a kept-alive connection stalls ~40 ms: the head goes out, the first chunk waits
/// (Nagle) for the ACK the client delays (delayed ACK), so every TTFT measured through a reused
/// connection, as OpenAI SDKs and routers make them, was 40 ms late.
pub fn no_delay(listener: TcpListener) -> TapIo<TcpListener, fn(&mut TcpStream)> {
    listener.tap_io(set_nodelay)
}

fn set_nodelay(stream: &mut TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "TCP_NODELAY not set on an accepted connection");
    }
}

async fn not_found() -> impl IntoResponse {
    error::ApiError::not_found("no such endpoint")
}

async fn method_not_allowed() -> impl IntoResponse {
    error::ApiError {
        status: axum::http::StatusCode::METHOD_NOT_ALLOWED,
        message: "method not allowed on this endpoint".into(),
    }
}
