//! The bounds of the HTTP listeners (`http_*` settings), as plain values: what
//! `crate::read::http::serve` holds each connection to and `crate::read::http::body` each request body to.
//! Kept apart from the code that applies them so that the configuration names no server code.

use std::time::Duration;

/// The per-listener connection bounds (`http_header_timeout_ms`, `http_write_timeout_ms`,
/// `http_max_connections`, `http_max_connections_per_address`,
/// `http_max_connections_per_network`), the router's alike.
pub use kvindex_conn_caps::{ConnLimits, PROBE_MAX_CONNECTIONS};

/// The bounds on request bodies (`http_max_body_bytes`, `http_max_inflight_body_bytes`,
/// `http_body_timeout_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub max_inflight_bytes: usize,
    pub timeout: Duration,
}
