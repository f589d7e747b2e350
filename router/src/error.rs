//! The router's errors, typed, in one place:
//!
//! - [`RouteError`]: why the pipeline cannot place a request;
//! - [`ApiError`]: what a door answers for it (and for its own refusals: too large, too slow,
//!   shed, no pod answered), mapped once to an HTTP status and OpenAI's `code`, and rendered
//!   either as an OpenAI-shaped JSON response (`{"error": {"message", "type", "param",
//!   "code"}}`, the proxy) or as an ext_proc `ImmediateResponse` (the endpoint picker, in
//!   `doors/ext_proc/envoy.rs`), each
//!   counted in `kvindex_router_request_errors_total` by its code. Messages never quote the
//!   prompt;
//! - [`StartError`]: why the router cannot start, naming the flag behind it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::config::ConfigError;
use crate::metrics as m;
use crate::place::request::RequestError;
use crate::pods::fleet::PodRefused;

/// Why a request cannot be placed. Each maps to one OpenAI error status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("the model `{}` does not exist", crate::place::request::echo(.0))]
    UnknownModel(String),
    #[error("{0}")]
    InvalidPrompt(String),
    #[error("the prompt has {tokens} tokens, more than the maximum of {max}")]
    PromptTooLong { tokens: usize, max: usize },
    /// Tokenization stopped once the count passed the limit.
    #[error("the prompt has more than the maximum of {max} tokens ({counted} counted before tokenization stopped)")]
    PromptOverLimit { counted: usize, max: usize },
    /// Refused before tokenizing: more text than `max` tokens can hold (see [`MAX_PROMPT_BYTES_PER_TOKEN`]).
    #[error("the prompt has {bytes} bytes of text, more than the maximum of {max} tokens can hold")]
    PromptTooManyBytes { bytes: usize, max: usize },
    #[error("the chat has {count} messages, more than the maximum of {max}")]
    TooManyMessages { count: usize, max: usize },
    #[error("no pods are available")]
    NoPods,
    #[error("none of the allowed pods is known to this router")]
    NoEligiblePods,
    #[error(
        "chat_template in requests is not accepted by this router, which renders only the model's own chat \
         template (operators can allow client templates with --allow-client-chat-template)"
    )]
    ClientTemplateDisabled,
}

impl RouteError {
    /// The `kvindex_router_request_errors_total` reason.
    pub fn label(&self) -> &'static str {
        match self {
            RouteError::UnknownModel(_) => "unknown_model",
            RouteError::InvalidPrompt(_) => "invalid_prompt",
            RouteError::PromptTooLong { .. }
            | RouteError::PromptOverLimit { .. }
            | RouteError::PromptTooManyBytes { .. } => "prompt_too_long",
            RouteError::TooManyMessages { .. } => "too_many_messages",
            RouteError::NoPods => "no_pods",
            RouteError::NoEligiblePods => "no_eligible_pods",
            RouteError::ClientTemplateDisabled => "client_chat_template_disabled",
        }
    }
}

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

    /// 429 at the endpoint picker: the buffer bound over all streams is full.
    pub fn shed() -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "shed",
            "the endpoint picker is buffering too many requests; retry later",
        )
    }

    /// 408 at the endpoint picker: the request (headers, body, trailers) did not arrive in full
    /// within `--ext-proc-request-timeout-ms` of the stream's start.
    pub fn request_incomplete(timeout: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!("the request did not arrive in full within {} ms", timeout.as_millis()),
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

impl ApiError {
    /// Counts this error as answered (`kvindex_router_request_errors_total`), whichever door
    /// answers it.
    pub fn counted(self) -> ApiError {
        metrics::counter!(m::REQUEST_ERRORS, "reason" => self.code).increment(1);
        self
    }
}

/// The proxy's answer.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let this = self.counted();
        let body =
            json!({"error": {"message": this.message, "type": this.kind(), "param": this.param, "code": this.code}});
        let mut response = (this.status, Json(body)).into_response();
        if this.code == "overloaded" {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

/// Why the router cannot start; each names the flag (or the part) behind it. The binary prints
/// it and exits 2.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A setting that passed validation but cannot be put to use: a tokenizer's files, an
    /// indexer address or certificate, an address that cannot be bound, the pods file.
    #[error("{setting}: {message}")]
    Setting { setting: String, message: String },
    /// A pod of the command line the pod table refused.
    #[error(transparent)]
    Pod(#[from] PodRefused),
    /// The endpoint picker's gRPC server failed.
    #[error("ext_proc: {0}")]
    ExtProc(#[from] tonic::transport::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A serving task panicked or was cancelled.
    #[error("{0}")]
    Task(#[from] tokio::task::JoinError),
}

impl StartError {
    /// `setting` (a flag, with its value when that helps) cannot be used, because of `why`.
    pub fn setting(setting: impl Into<String>, why: impl std::fmt::Display) -> StartError {
        StartError::Setting { setting: setting.into(), message: why.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_error_has_one_status_and_code_for_both_doors() {
        let cases = [
            (RouteError::UnknownModel("m".into()), 404, "model_not_found", Some("model")),
            (RouteError::InvalidPrompt("bad".into()), 400, "invalid_prompt", None),
            (RouteError::PromptTooLong { tokens: 9, max: 8 }, 400, "context_length_exceeded", Some("prompt")),
            (RouteError::PromptOverLimit { counted: 9, max: 8 }, 400, "context_length_exceeded", Some("prompt")),
            (RouteError::PromptTooManyBytes { bytes: 9, max: 8 }, 400, "context_length_exceeded", Some("prompt")),
            (RouteError::TooManyMessages { count: 9, max: 8 }, 400, "too_many_messages", Some("messages")),
            (RouteError::NoPods, 503, "no_pods", None),
            (RouteError::NoEligiblePods, 503, "no_eligible_pods", None),
            (RouteError::ClientTemplateDisabled, 400, "client_chat_template_disabled", Some("chat_template")),
        ];
        for (error, status, code, param) in cases {
            let message = error.to_string();
            let api = ApiError::from(error);
            assert_eq!((api.status.as_u16(), api.code, api.param), (status, code, param), "{message}");
            assert_eq!(api.message, message);
        }
    }
}
