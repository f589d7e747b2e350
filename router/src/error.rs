//! OpenAI-shaped error responses (`{"error": {"message", "type", "param", "code"}}`) with the
//! status a client library expects, each counted by reason. Messages never quote the prompt.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::metrics as m;
use crate::place::request::RequestError;
use crate::place::RouteError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
    /// OpenAI's `code`, and the metric's `reason`.
    pub code: &'static str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None, code }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// 503 with `Retry-After`: the in-flight body budget is spent.
    pub fn busy() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "the router holds too many request bodies now; retry shortly",
        )
    }

    /// 408: the body did not arrive within the body timeout.
    pub fn body_timeout(timeout: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!("the request body did not arrive within {} ms", timeout.as_millis()),
        )
    }

    pub fn upstream_unavailable(attempts: usize) -> ApiError {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_unavailable",
            format!("no pod answered ({attempts} tried, each failed before responding)"),
        )
    }

    pub fn not_found() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this endpoint")
    }

    fn kind(&self) -> &'static str {
        if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        }
    }
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> ApiError {
        let code = if e.param.is_none() { "invalid_json" } else { "invalid_request" };
        ApiError { status: StatusCode::BAD_REQUEST, message: e.message, param: e.param, code }
    }
}

impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> ApiError {
        let (status, param) = match &e {
            RouteError::UnknownModel(_) => (StatusCode::NOT_FOUND, Some("model")),
            RouteError::InvalidPrompt(_) => (StatusCode::BAD_REQUEST, None),
            RouteError::ClientTemplateDisabled => (StatusCode::BAD_REQUEST, Some("chat_template")),
            RouteError::PromptTooLong { .. }
            | RouteError::PromptOverLimit { .. }
            | RouteError::PromptTooManyBytes { .. } => (StatusCode::BAD_REQUEST, Some("prompt")),
            RouteError::TooManyMessages { .. } => (StatusCode::BAD_REQUEST, Some("messages")),
            RouteError::NoPods | RouteError::NoEligiblePods => (StatusCode::SERVICE_UNAVAILABLE, None),
        };
        let code = match &e {
            RouteError::UnknownModel(_) => "model_not_found",
            RouteError::PromptTooLong { .. }
            | RouteError::PromptOverLimit { .. }
            | RouteError::PromptTooManyBytes { .. } => "context_length_exceeded",
            RouteError::TooManyMessages { .. } => "too_many_messages",
            other => other.label(),
        };
        ApiError { status, message: e.to_string(), param, code }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        metrics::counter!(m::REQUEST_ERRORS, "reason" => self.code).increment(1);
        let body =
            json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}});
        let mut response = (self.status, Json(body)).into_response();
        if self.code == "overloaded" {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}
