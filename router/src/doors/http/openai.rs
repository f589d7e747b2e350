//! The OpenAI-compatible endpoints: read the body (bounded), parse, place, forward, and pass
//! the pod's response through with headers that say where it went and why. The decision line
//! ([`crate::place::log`]) is written once the pod answered (or none did).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;

use super::app::App;
use super::body::PassThrough;
use super::forward::forward;
use crate::doors::budget::Reservation;
use crate::doors::http::usage::{Prediction, UsageTap};
use crate::error::ApiError;
use crate::metrics as m;
use crate::place::decision::Decision;
use crate::place::log::{self, Door};
use crate::place::request::{self, Endpoint};
use crate::upstream::{is_hop_by_hop, Outgoing};

pub async fn completions(State(app): State<Arc<App>>, request: Request) -> Response {
    proxy(app, Endpoint::Completions, request).await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn chat_completions(State(app): State<Arc<App>>, request: Request) -> Response {
    proxy(app, Endpoint::ChatCompletions, request).await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /route/v1/completions`: the decision only, as JSON; nothing is forwarded, counted in
/// flight or credited. For operators asking "where would this go, and why".
pub async fn explain_completions(State(app): State<Arc<App>>, request: Request) -> Response {
    explain(app, Endpoint::Completions, request).await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn explain_chat_completions(State(app): State<Arc<App>>, request: Request) -> Response {
    explain(app, Endpoint::ChatCompletions, request).await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let data: Vec<_> = app
        .router
        .models()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "kvindex-router"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// The body, read within its bounds: at most `--max-body-bytes` (413, before reading more),
/// within `--http-body-timeout-ms` (408), and only while the bytes fit the budget shared by all
/// requests (503 with Retry-After). The reservation is held until the request is forwarded.
async fn read_body(app: &App, request: Request) -> Result<(axum::http::request::Parts, Bytes, Reservation), ApiError> {
    let (parts, body) = request.into_parts();
    let max = app.max_body_bytes;
    let declared = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(ApiError::too_large(max));
    }
    let mut reservation = Reservation::new(app.body_budget.clone());
    let mut reserved = declared.unwrap_or(0) as usize;
    if !reservation.grow(reserved) {
        return Err(ApiError::busy());
    }
    let read = async {
        let mut body = Body::new(body);
        let mut bytes = Vec::with_capacity(reserved);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| {
                ApiError::new(axum::http::StatusCode::BAD_REQUEST, "body_error", "the request body could not be read")
            })?;
            let Ok(data) = frame.into_data() else { continue };
            let len = bytes.len() + data.len();
            if len > max {
                return Err(ApiError::too_large(max));
            }
            if len > reserved {
                if !reservation.grow(len - reserved) {
                    return Err(ApiError::busy());
                }
                reserved = len;
            }
            bytes.extend_from_slice(&data);
        }
        Ok(Bytes::from(bytes))
    };
    match tokio::time::timeout(app.body_timeout, read).await {
        Ok(bytes) => Ok((parts, bytes?, reservation)),
        Err(_) => {
            metrics::counter!(m::HTTP_TIMEOUTS, "listener" => "http", "phase" => "body").increment(1);
            Err(ApiError::body_timeout(app.body_timeout))
        }
    }
}

async fn place(app: &App, endpoint: Endpoint, body: &[u8]) -> Result<Decision, ApiError> {
    let request = request::parse(endpoint, body)?;
    Ok(app.router.route(&request).await?)
}

async fn explain(app: Arc<App>, endpoint: Endpoint, request: Request) -> Result<Response, ApiError> {
    let (_, body, _reservation) = read_body(&app, request).await?;
    let decision = place(&app, endpoint, &body).await?;
    Ok(Json(decision).into_response())
}

async fn proxy(app: Arc<App>, endpoint: Endpoint, request: Request) -> Result<Response, ApiError> {
    let (parts, body, _reservation) = read_body(&app, request).await?;
    let decision = place(&app, endpoint, &body).await?;
    let outgoing = Outgoing { path: endpoint.path(), headers: &parts.headers, body };
    let forwarded = match forward(&app, &decision, outgoing).await {
        Ok(forwarded) => forwarded,
        Err(attempts) => {
            log::routed(&decision, Door::Proxy { endpoint, attempt: None, status: 502 });
            metrics::counter!(m::REQUESTS, "endpoint" => endpoint.label(), "status" => "502").increment(1);
            return Err(ApiError::upstream_unavailable(attempts));
        }
    };
    let (head, incoming) = forwarded.response.into_parts();
    log::routed(&decision, Door::Proxy { endpoint, attempt: Some(forwarded.attempt), status: head.status.as_u16() });
    metrics::counter!(m::REQUESTS, "endpoint" => endpoint.label(), "status" => head.status.as_str().to_string())
        .increment(1);
    let mut body = PassThrough::new(incoming, forwarded.guards);
    // P/D: the decode pod's usage describes KV it received, not a prefix-cache hit.
    if head.status.is_success() && decision.prefill.is_none() {
        if let Some(served) = decision.ranked.get(forwarded.attempt) {
            body = body.with_usage(UsageTap::new(Prediction {
                cached_blocks: served.cached_blocks,
                block_size: decision.block_size,
                unit: served.credit_unit,
                prompt_tokens: decision.prompt_tokens,
            }));
        }
    }
    let mut response = Response::new(Body::new(body));
    *response.status_mut() = head.status;
    let headers = response.headers_mut();
    for (name, value) in &head.headers {
        if !is_hop_by_hop(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    for (name, value) in decision.headers(forwarded.attempt) {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    Ok(response)
}
