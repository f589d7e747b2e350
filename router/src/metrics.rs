//! Metric names, the table that declares each one's kind, labels and help (docs/ROUTER-CONFIG.md
//! is held to it by tests/it/metrics_docs.rs), and the Prometheus recorder. One place,
//! so names cannot drift between the code that counts and the page that explains.

use kvindex_metric_defs::Kind::{Counter, Gauge, Histogram};
use kvindex_metric_defs::{Metric, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const REQUESTS: &str = "kvindex_router_requests_total";
pub const REQUEST_ERRORS: &str = "kvindex_router_request_errors_total";
pub const ROUTE_SECONDS: &str = "kvindex_router_route_seconds";
pub const SCORE_ATTEMPTS: &str = "kvindex_router_score_attempts_total";
pub const FAIL_OPEN: &str = "kvindex_router_fail_open_total";
pub const TOKENIZE: &str = "kvindex_router_tokenize_total";
pub const TOKENS_TOKENIZED: &str = "kvindex_router_tokens_tokenized_total";
pub const PICKS: &str = "kvindex_router_picks_total";
pub const PROMPT_BLOCKS: &str = "kvindex_router_prompt_blocks_total";
pub const CACHED_BLOCKS: &str = "kvindex_router_predicted_cached_blocks_total";
pub const KV_CUTOFF: &str = "kvindex_router_kv_cutoff_total";
pub const OVERLAP_PICKS: &str = "kvindex_router_overlap_picks_total";
pub const BEST_CACHED_BLOCKS: &str = "kvindex_router_best_cached_blocks_total";
pub const OVERLAP_GIVEN_UP_BLOCKS: &str = "kvindex_router_overlap_given_up_blocks";
pub const CACHE_PREDICTION: &str = "kvindex_router_cache_prediction_total";
pub const ENGINE_CACHED_TOKENS: &str = "kvindex_router_engine_cached_tokens_total";
pub const ENGINE_PROMPT_TOKENS: &str = "kvindex_router_engine_prompt_tokens_total";
pub const PREDICTED_CACHED_TOKENS: &str = "kvindex_router_predicted_cached_tokens_total";
pub const UPSTREAM_RETRIES: &str = "kvindex_router_upstream_retries_total";
pub const UPSTREAM_FIRST_BYTE: &str = "kvindex_router_upstream_first_byte_seconds";
pub const CLIENT_DISCONNECTS: &str = "kvindex_router_client_disconnects_total";
pub const INFLIGHT: &str = "kvindex_router_inflight";
pub const PODS: &str = "kvindex_router_pods";
pub const POD_LOAD: &str = "kvindex_router_pod_load";
pub const SCRAPES: &str = "kvindex_router_scrapes_total";
pub const POD_CHANGES: &str = "kvindex_router_pod_changes_total";
pub const RECORD_ROUTE: &str = "kvindex_router_record_route_total";
pub const RESERVATIONS: &str = "kvindex_router_reservations_total";
pub const RELEASES: &str = "kvindex_router_releases_total";
pub const RELEASE_CALLS: &str = "kvindex_router_release_calls_total";
pub const LOAD_VIEW: &str = "kvindex_router_load_view_total";
pub const TOKENIZER_CACHE_REQUESTS: &str = "kvindex_router_tokenizer_prefix_cache_requests";
pub const TOKENIZER_CACHE_BYTES: &str = "kvindex_router_tokenizer_prefix_cache_bytes";
pub const EXTPROC_STREAMS: &str = "kvindex_router_extproc_streams_total";
pub const EXTPROC_PROTOCOL_ERRORS: &str = "kvindex_router_extproc_protocol_errors_total";
pub const EXTPROC_PICK_SECONDS: &str = "kvindex_router_extproc_pick_seconds";
pub const PREFILTER: &str = "kvindex_router_prefilter_total";
pub const HTTP_CONNECTIONS: &str = "kvindex_router_http_connections";
pub const HTTP_CONNECTIONS_REFUSED: &str = "kvindex_router_http_connections_refused_total";
pub const HTTP_CONNECTIONS_EVICTED: &str = "kvindex_router_http_connections_evicted_total";
pub const HTTP_TIMEOUTS: &str = "kvindex_router_http_timeouts_total";
pub const HTTP_BODY_BYTES: &str = "kvindex_router_http_body_bytes";

/// Installs the global recorder; `None` when one is already installed (a second router in
/// one process, e.g. a benchmark), which then records nothing of its own.
pub fn install() -> Option<PrometheusHandle> {
    let fast = [0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5];
    let slow = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
    // Blocks: 0 is a best-overlap pick; then a block to a 64k-token prefix.
    let blocks = [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(ROUTE_SECONDS.into()), &fast)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(EXTPROC_PICK_SECONDS.into()), &fast)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(UPSTREAM_FIRST_BYTE.into()), &slow)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(OVERLAP_GIVEN_UP_BLOCKS.into()), &blocks)
        .ok()?
        .install_recorder()
        .ok()?;
    describe();
    Some(handle)
}

/// Every metric the router exports of its own: what `/metrics` describes (HELP and TYPE) and
/// what tests/it/metrics_docs.rs holds docs/ROUTER-CONFIG.md to. The labels are every label any
/// series of the metric carries.
pub const METRICS: &[Metric] = &[
    Metric { name: REQUESTS, kind: Counter, labels: &["endpoint", "status"], unit: None, help: "Proxied requests by endpoint and HTTP status" },
    Metric { name: REQUEST_ERRORS, kind: Counter, labels: &["reason"], unit: None, help: "Requests answered with an error by the router itself, by reason" },
    Metric { name: ROUTE_SECONDS, kind: Histogram, labels: &["stage"], unit: Some(Unit::Seconds), help: "Routing overhead by stage (tokenize, score, pick, total)" },
    Metric { name: SCORE_ATTEMPTS, kind: Counter, labels: &["endpoint", "outcome"], unit: None, help: "ScoreTokens calls by indexer endpoint and outcome" },
    Metric { name: FAIL_OPEN, kind: Counter, labels: &["reason"], unit: None, help: "Requests placed by load only, by reason" },
    Metric { name: TOKENIZE, kind: Counter, labels: &["outcome", "where"], unit: None, help: "Prompt tokenizations by where and outcome" },
    Metric { name: TOKENS_TOKENIZED, kind: Counter, labels: &["where"], unit: None, help: "Tokens the router's tokenizers produced for prompts (counted up to where tokenization stopped)" },
    Metric { name: PICKS, kind: Counter, labels: &["pod", "role"], unit: None, help: "Requests sent to each pod, by role" },
    Metric { name: PROMPT_BLOCKS, kind: Counter, labels: &[], unit: None, help: "Full prompt blocks of routed requests" },
    Metric { name: CACHED_BLOCKS, kind: Counter, labels: &["kind"], unit: None, help: "Prompt blocks the chosen pod was predicted to hold, by kind" },
    Metric { name: KV_CUTOFF, kind: Counter, labels: &[], unit: None, help: "Picks that passed over a pod at or above the KV-usage cutoff" },
    Metric { name: OVERLAP_PICKS, kind: Counter, labels: &["outcome"], unit: None, help: "Requests by how the pick compares with the best cached prefix on offer (best, below_best, no_overlap, unscored)" },
    Metric { name: BEST_CACHED_BLOCKS, kind: Counter, labels: &[], unit: None, help: "Cached blocks on the best-overlap pod of each scored request, picked or not (over prompt_blocks: the reachable hit rate)" },
    Metric { name: OVERLAP_GIVEN_UP_BLOCKS, kind: Histogram, labels: &[], unit: None, help: "Per scored request with some overlap: best pod's cached blocks minus the chosen pod's (0 = best pick)" },
    Metric { name: CACHE_PREDICTION, kind: Counter, labels: &["outcome"], unit: None, help: "Responses by the engine's cached_tokens against the router's prediction (exact, over, under, unreported)" },
    Metric { name: ENGINE_CACHED_TOKENS, kind: Counter, labels: &[], unit: None, help: "Cached prompt tokens the engines reported in responses' usage" },
    Metric { name: ENGINE_PROMPT_TOKENS, kind: Counter, labels: &[], unit: None, help: "Prompt tokens of the responses whose usage reported cached_tokens" },
    Metric { name: PREDICTED_CACHED_TOKENS, kind: Counter, labels: &[], unit: None, help: "Cached tokens the router predicted for the responses whose usage reported cached_tokens" },
    Metric { name: UPSTREAM_RETRIES, kind: Counter, labels: &["reason"], unit: None, help: "Requests retried on the next pod before any response byte, by reason" },
    Metric { name: UPSTREAM_FIRST_BYTE, kind: Histogram, labels: &[], unit: Some(Unit::Seconds), help: "Upstream response head latency" },
    Metric { name: CLIENT_DISCONNECTS, kind: Counter, labels: &[], unit: None, help: "Responses abandoned by the client before the end (upstream cancelled)" },
    Metric { name: INFLIGHT, kind: Gauge, labels: &["pod"], unit: None, help: "Requests in flight per pod" },
    Metric { name: PODS, kind: Gauge, labels: &["role"], unit: None, help: "Pods by role" },
    Metric { name: POD_LOAD, kind: Gauge, labels: &["kind", "pod"], unit: None, help: "Last scraped load per pod (waiting, running, kv_usage, kv_tokens)" },
    Metric { name: SCRAPES, kind: Counter, labels: &["outcome"], unit: None, help: "Scrapes of pod /metrics by outcome" },
    Metric { name: POD_CHANGES, kind: Counter, labels: &["op", "source"], unit: None, help: "Pod table changes by source and operation" },
    Metric { name: RECORD_ROUTE, kind: Counter, labels: &["outcome"], unit: None, help: "RecordRoute calls to the indexer by outcome" },
    Metric { name: RESERVATIONS, kind: Counter, labels: &["outcome"], unit: None, help: "Requests reserved on the indexers (shared in-flight load), per indexer: reserved, refused, failed (the call failed) or skipped (indexer out of rotation or overloaded)" },
    Metric { name: RELEASES, kind: Counter, labels: &["outcome"], unit: None, help: "Reservation releases sent to the indexers (first byte, end of response): released, not_held, failed (the call failed) or dropped (queue full)" },
    Metric { name: RELEASE_CALLS, kind: Counter, labels: &["outcome"], unit: None, help: "ReleaseRoute calls (batches of releases) by outcome" },
    Metric { name: LOAD_VIEW, kind: Counter, labels: &["view"], unit: None, help: "Placements by the load they saw: shared (every router's reservations, from the indexer) or own (this router's counts only)" },
    Metric { name: TOKENIZER_CACHE_REQUESTS, kind: Gauge, labels: &["result"], unit: None, help: "In-process tokenizations by prefix-cache result (hit, miss, bypass), since start" },
    Metric { name: TOKENIZER_CACHE_BYTES, kind: Gauge, labels: &["kind"], unit: Some(Unit::Bytes), help: "In-process tokenizer prefix cache: bytes used and capacity" },
    Metric { name: EXTPROC_STREAMS, kind: Counter, labels: &["outcome"], unit: None, help: "ext_proc streams (gateway requests) by how they ended" },
    Metric { name: EXTPROC_PROTOCOL_ERRORS, kind: Counter, labels: &["reason"], unit: None, help: "ext_proc streams ended for breaking the protocol, by reason" },
    Metric { name: EXTPROC_PICK_SECONDS, kind: Histogram, labels: &["mode"], unit: Some(Unit::Seconds), help: "ext_proc: first request body byte in to destination out" },
    Metric { name: PREFILTER, kind: Counter, labels: &["outcome"], unit: None, help: "Pre-filter answers: hint, miss (no hint) or error (no hint, request passed on)" },
    Metric { name: HTTP_CONNECTIONS, kind: Gauge, labels: &["listener"], unit: None, help: "Open HTTP connections by listener" },
    Metric { name: HTTP_CONNECTIONS_REFUSED, kind: Counter, labels: &["listener", "reason"], unit: None, help: "HTTP connections closed at accept, by the full cap (max_connections, max_connections_per_address, max_connections_per_network) under which every connection was answering a request" },
    Metric { name: HTTP_CONNECTIONS_EVICTED, kind: Counter, labels: &["listener", "reason"], unit: None, help: "Idle HTTP connections closed to make room for a new one at a full cap (max_connections, max_connections_per_address, max_connections_per_network), the oldest first" },
    Metric { name: HTTP_TIMEOUTS, kind: Counter, labels: &["listener", "phase"], unit: None, help: "HTTP requests cut off for a slow client, by phase (header, body, write)" },
    Metric { name: HTTP_BODY_BYTES, kind: Gauge, labels: &[], unit: Some(Unit::Bytes), help: "Request body bytes held by the proxy now (bounded by --max-inflight-body-bytes)" },
];

/// Describes the router's metrics, and those of the libraries it runs (discovery, the
/// chat-template sandbox).
fn describe() {
    kvindex_metric_defs::describe(METRICS);
    kvindex_metric_defs::describe(kvindex_tokenizer::client_template::METRICS);
}
