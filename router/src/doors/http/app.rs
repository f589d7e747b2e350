//! What every HTTP handler shares (the pipeline, the pods' HTTP client, the body bounds), apart
//! from the route tables so the handlers and the tables can each name it without naming each
//! other.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::doors::budget::Budget;
use crate::place::Router;
use crate::upstream::HttpClient;

/// Shared by every handler.
pub struct App {
    pub router: Arc<Router>,
    pub client: HttpClient,
    pub prometheus: Option<PrometheusHandle>,
    pub max_body_bytes: usize,
    /// Request body bytes held over all requests (`--max-inflight-body-bytes`).
    pub body_budget: Arc<Budget>,
    /// Time for a whole request body to arrive.
    pub body_timeout: std::time::Duration,
    pub upstream_retries: usize,
}
