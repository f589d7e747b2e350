//! Request bodies of the admin endpoints (`POST /pods`), read within bounds: at most
//! `http_max_body_bytes` per body (413, on the declared length before anything is read, or as
//! soon as the streamed bytes pass it), within `http_body_timeout_ms` (408), and only while
//! every body held at once fits `http_max_inflight_body_bytes` (503 with `Retry-After`).
//! Without these a client could trickle a body forever or make us buffer one per connection.
//! Bodies are read only after the bearer token was checked, so nobody without it
//! can make the server hold a byte of one.

use axum::body::Body;
use axum::http::header::{CONTENT_LENGTH, RETRY_AFTER};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use kvindex_zmtp::{Budget, Lease};
use serde_json::json;
use tokio_stream::StreamExt;

use crate::config::http_limits::BodyLimits;
use crate::telemetry as m;

/// The bodies being read now, over all connections of the HTTP listeners.
#[derive(Debug, Clone)]
pub struct Bodies {
    limits: BodyLimits,
    budget: Budget,
}

/// Why a body was not read to the end, as the metric's `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    TooLarge,
    Budget,
    Timeout,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::TooLarge => "body_too_large",
            Refusal::Budget => "body_budget",
            Refusal::Timeout => "body_timeout",
        }
    }
}

impl Bodies {
    pub fn new(limits: BodyLimits) -> Bodies {
        Bodies { limits, budget: Budget::new(limits.max_inflight_bytes) }
    }

    /// Body bytes held now (gauge `kvindex_http_body_bytes`).
    pub fn held(&self) -> usize {
        self.budget.used()
    }

    /// The whole body, within the bounds, with the lease that holds its bytes in the budget
    /// (dropped when the request is done with them); or the refusal to answer.
    pub async fn read(&self, headers: &HeaderMap, body: Body) -> Result<(Bytes, Lease), Response> {
        let max = self.limits.max_bytes;
        let declared = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max as u64) {
            return Err(self.refuse(Refusal::TooLarge));
        }
        // A declared length is reserved whole before reading: a client cannot take the budget
        // a byte at a time while others wait behind it.
        let mut lease = self.budget.lease();
        let declared = declared.unwrap_or(0) as usize;
        if !lease.try_grow(declared) {
            return Err(self.refuse(Refusal::Budget));
        }
        let read = async {
            let mut stream = body.into_data_stream();
            let mut bytes = Vec::with_capacity(declared);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|_| unreadable())?;
                let len = bytes.len() + chunk.len();
                if len > max {
                    return Err(self.refuse(Refusal::TooLarge));
                }
                if len > lease.bytes() && !lease.try_grow(len - lease.bytes()) {
                    return Err(self.refuse(Refusal::Budget));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(Bytes::from(bytes))
        };
        match tokio::time::timeout(self.limits.timeout, read).await {
            Ok(Ok(bytes)) => Ok((bytes, lease)),
            Ok(Err(refusal)) => Err(refusal),
            Err(_) => Err(self.refuse(Refusal::Timeout)),
        }
    }

    fn refuse(&self, refusal: Refusal) -> Response {
        metrics::counter!(m::HTTP_REFUSED, "listener" => "http", "reason" => refusal.label()).increment(1);
        let (status, message) = match refusal {
            Refusal::TooLarge => {
                (StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is over {} bytes", self.limits.max_bytes))
            }
            Refusal::Budget => {
                (StatusCode::SERVICE_UNAVAILABLE, "the server holds too many request bodies now; retry shortly".into())
            }
            Refusal::Timeout => (
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {} ms", self.limits.timeout.as_millis()),
            ),
        };
        let mut response = (status, Json(json!({"error": message}))).into_response();
        if refusal == Refusal::Budget {
            response.headers_mut().insert(RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

fn unreadable() -> Response {
    metrics::counter!(m::HTTP_INVALID, "reason" => "body").increment(1);
    (StatusCode::BAD_REQUEST, Json(json!({"error": "the request body could not be read"}))).into_response()
}
