//! Pod registration on `--admin-addr`: `POST /pods {"id", "url", "role"}` adds or updates a
//! pod, `DELETE /pods/{id}` removes one. Pods from the command line cannot be changed here.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router as AxumRouter};
use serde_json::json;

use super::app::App;
use crate::config::normalize_url;
use crate::error::ApiError;
use crate::metrics as m;
use crate::pods::fleet::Source;
use crate::pods::spec::PodSpec;

/// The routes of `--admin-addr`; `/metrics` and `/debug/pods` too when `with_metrics`.
pub fn admin(app: Arc<App>, with_metrics: bool) -> AxumRouter {
    AxumRouter::new()
        .route("/pods", post(register))
        .route("/pods/{id}", delete(unregister))
        .merge(super::common(with_metrics))
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .fallback(|| async { ApiError::not_found() })
        .with_state(app)
}

fn refused(message: String) -> Response {
    metrics::counter!(m::POD_CHANGES, "source" => "registration", "op" => "refused").increment(1);
    (StatusCode::BAD_REQUEST, Json(json!({"error": message}))).into_response()
}

async fn register(State(app): State<Arc<App>>, body: Result<Json<PodSpec>, JsonRejection>) -> Response {
    let mut spec = match body {
        Ok(Json(spec)) => spec,
        Err(rejection) => return refused(format!("expected {{\"id\", \"url\", \"role\"}}: {}", rejection.body_text())),
    };
    if spec.id.trim().is_empty() || spec.id.len() > 1024 {
        return refused("id must be a non-empty pod id".into());
    }
    spec.url = match normalize_url("url", &spec.url) {
        Ok(url) => url,
        Err(e) => return refused(e.to_string()),
    };
    if let Some(message) = spec.dp_refusal() {
        return refused(message);
    }
    match app.router.fleet().upsert(&spec, Source::Registered) {
        Ok(()) => {
            metrics::counter!(m::POD_CHANGES, "source" => "registration", "op" => "add").increment(1);
            tracing::info!(pod = %spec.id, url = %spec.url, role = spec.role.label(), "pod registered");
            Json(json!({"registered": spec.id})).into_response()
        }
        Err(e) => refused(e.to_string()),
    }
}

async fn unregister(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.router.fleet().remove(&id, Source::Registered) {
        Ok(existed) => {
            metrics::counter!(m::POD_CHANGES, "source" => "registration", "op" => "remove").increment(1);
            Json(json!({"removed": existed})).into_response()
        }
        Err(e) => refused(e.to_string()),
    }
}
