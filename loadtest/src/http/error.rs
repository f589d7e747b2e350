//! Errors returned to HTTP clients: always a JSON body in vLLM's (OpenAI-style) error shape,
//! `{"object": "error", "message", "type", "param", "code"}`, never a panic or a bare text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::NOT_FOUND, message: message.into() }
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::CONFLICT, message: message.into() }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: message.into() }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::CONFLICT => "ConflictError",
            _ => "InternalServerError",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "object": "error",
            "message": self.message,
            "type": self.kind(),
            "param": null,
            "code": self.status.as_u16(),
        });
        (self.status, Json(body)).into_response()
    }
}

/// Parses a JSON body ourselves so that malformed bodies get this error shape (axum's `Json`
/// extractor answers with plain text).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}
