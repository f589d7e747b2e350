//! The small endpoints: `/health`, `/v1/models`, `/reset_prefix_cache`, and the admin
//! endpoints that drive the publisher's fault knobs in tests and demos.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::error::{parse_json, ApiError};
use crate::pod::Pod;

pub async fn health() -> impl IntoResponse {
    axum::http::StatusCode::OK
}

pub async fn models(State(pod): State<Pod>) -> impl IntoResponse {
    Json(json!({
        "object": "list",
        "data": [{
            "id": pod.info.model,
            "object": "model",
            "created": 0,
            "owned_by": "kvindex-sim",
            "root": pod.info.model,
            "max_model_len": pod.info.max_model_len,
        }],
    }))
}

/// vLLM refuses to reset while requests hold blocks; the simulator says so with a 409.
pub async fn reset_prefix_cache(State(pod): State<Pod>) -> Response {
    match pod.reset_prefix_cache().await {
        Ok(true) => Json(json!({"reset": true})).into_response(),
        Ok(false) => ApiError::conflict("requests are running; the prefix cache was not reset").into_response(),
        Err(error) => ApiError::unavailable(error.to_string()).into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct DropBody {
    batches: u64,
}

// Fault knobs apply to every data-parallel rank's publisher of the pod.

/// `POST /admin/faults/drop {"batches": n}`: the next n batches are numbered but not sent.
pub async fn drop_batches(State(pod): State<Pod>, body: Bytes) -> Response {
    match parse_json::<DropBody>(&body) {
        Ok(body) => {
            for rank in pod.ranks() {
                rank.publisher.drop_next(body.batches).await;
            }
            Json(json!({"dropping": body.batches})).into_response()
        }
        Err(error) => error.into_response(),
    }
}

pub async fn pause(State(pod): State<Pod>) -> impl IntoResponse {
    for rank in pod.ranks() {
        rank.publisher.pause().await;
    }
    Json(json!({"paused": true}))
}

pub async fn resume(State(pod): State<Pod>) -> impl IntoResponse {
    for rank in pod.ranks() {
        rank.publisher.resume().await;
    }
    Json(json!({"paused": false}))
}

pub async fn restart_publisher(State(pod): State<Pod>) -> Response {
    for rank in pod.ranks() {
        if let Err(error) = rank.publisher.restart().await {
            return ApiError::unavailable(error).into_response();
        }
    }
    Json(json!({"restarted": true})).into_response()
}

/// Engine and publisher counters per data-parallel rank plus the pod's identity.
pub async fn stats(State(pod): State<Pod>) -> impl IntoResponse {
    let ranks: Vec<_> = pod
        .ranks()
        .iter()
        .map(|rank| {
            let engine = rank.stats();
            json!({
                "rank": rank.rank,
                "engine": {
                    "num_running": engine.num_running,
                    "num_waiting": engine.num_waiting,
                    "kv_cache_usage": engine.kv_usage,
                    "prefix_cache_queries": engine.prefix_cache_queries,
                    "prefix_cache_hits": engine.prefix_cache_hits,
                    "preemptions": engine.preemptions,
                    "steps": engine.steps,
                },
                "publisher": rank.publisher.stats(),
            })
        })
        .collect();
    Json(json!({"pod_id": pod.info.pod_id, "topic": pod.info.topic, "model": pod.info.model, "ranks": ranks}))
}
