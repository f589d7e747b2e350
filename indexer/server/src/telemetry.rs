//! Telemetry: the metric names (every one is documented in docs/METRICS.md) and the Prometheus
//! recorder behind `/metrics`. Named so that it does not shadow the `metrics` crate. A leaf:
//! every part of the service names its metrics here, so this names nothing of theirs.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const EVENTS: &str = "kvindex_events_total";
pub const BLOCKS: &str = "kvindex_blocks_total";
pub const SKIPPED: &str = "kvindex_skipped_blocks_total";
pub const MESSAGES: &str = "kvindex_messages_received_total";
pub const DECODE_ERRORS: &str = "kvindex_decode_errors_total";
pub const GAPS: &str = "kvindex_gaps_total";
pub const DUPLICATES: &str = "kvindex_duplicates_total";
pub const REPLAYS: &str = "kvindex_replays_total";
pub const CLEARS: &str = "kvindex_clears_total";
pub const TRANSITIONS: &str = "kvindex_source_transitions_total";
pub const SOURCES: &str = "kvindex_sources";
pub const INDEX_ENTRIES: &str = "kvindex_index_entries";
pub const INDEX_KEYS: &str = "kvindex_index_keys";
pub const INDEX_BYTES: &str = "kvindex_index_bytes";
pub const QUEUE_DEPTH: &str = "kvindex_queue_depth";
pub const QUEUE_CAPACITY: &str = "kvindex_queue_capacity";
pub const QUEUE_FULL: &str = "kvindex_queue_full_total";
pub const SOURCE_LAG: &str = "kvindex_source_lag_seconds";
pub const EVENT_TO_VISIBLE: &str = "kvindex_event_to_visible_seconds";
pub const RECEIVE_TO_VISIBLE: &str = "kvindex_receive_to_visible_seconds";
pub const SCORE_REQUESTS: &str = "kvindex_score_requests_total";
pub const SCORE_LATENCY: &str = "kvindex_score_latency_seconds";
pub const ZMQ_ERRORS: &str = "kvindex_zmq_errors_total";
pub const ZMQ_CONNECTIONS: &str = "kvindex_zmq_connections_total";
pub const ZMQ_DISCONNECTS: &str = "kvindex_zmq_disconnects_total";
pub const ZMQ_REJECTED: &str = "kvindex_zmq_rejected_total";
pub const ZMQ_BYTES_IN_FLIGHT: &str = "kvindex_zmq_bytes_in_flight";
pub const RECONNECTIONS: &str = "kvindex_subscriber_reconnections_total";
pub const REGISTRATIONS: &str = "kvindex_registrations_total";
pub const CONFIG_ERRORS: &str = "kvindex_config_errors_total";
pub const HTTP_INVALID: &str = "kvindex_http_invalid_requests_total";
pub const HTTP_CONNECTIONS: &str = "kvindex_http_connections";
pub const HTTP_REFUSED: &str = "kvindex_http_refused_total";
pub const HTTP_BODY_BYTES: &str = "kvindex_http_body_bytes";
pub const GRPC_REJECTED: &str = "kvindex_grpc_rejected_total";
pub const GRPC_SHED: &str = "kvindex_grpc_shed_total";
pub const GRPC_LARGE_IN_FLIGHT: &str = "kvindex_grpc_large_in_flight";
pub const GRPC_QUEUED_TOKENS: &str = "kvindex_grpc_queued_tokens";
pub const TLS_HANDSHAKE_FAILURES: &str = "kvindex_tls_handshake_failures_total";
pub const CONTROL_DENIED: &str = "kvindex_control_denied_total";
pub const TOPIC_CONFLICTS: &str = "kvindex_topic_conflicts_total";
pub const SOURCES_REFUSED: &str = "kvindex_sources_refused_total";
pub const SOURCES_RECLAIMED: &str = "kvindex_sources_reclaimed_total";
pub const READY: &str = "kvindex_ready";
pub const PODS: &str = "kvindex_pods";
pub const HASH_MISMATCHES: &str = "kvindex_hash_check_mismatches_total";
pub const HASH_CHECKED: &str = "kvindex_hash_check_blocks_total";
pub const GET_POD_SCORES_REQUESTS: &str = "kvindex_get_pod_scores_requests_total";
pub const GET_POD_SCORES_SECONDS: &str = "kvindex_get_pod_scores_seconds";
pub const SNAPSHOT_WRITES: &str = "kvindex_snapshot_writes_total";
pub const SNAPSHOT_SECONDS: &str = "kvindex_snapshot_seconds";
pub const SNAPSHOT_BYTES: &str = "kvindex_snapshot_bytes";
pub const SNAPSHOT_STREAMS: &str = "kvindex_snapshot_streams_total";
pub const SNAPSHOT_RESIDENCIES: &str = "kvindex_snapshot_residencies";
pub const SNAPSHOT_EXPORT_WAITS: &str = "kvindex_snapshot_export_waits_total";
pub const SNAPSHOT_LOADS: &str = "kvindex_snapshot_loads_total";
pub const SNAPSHOT_LOAD_ERRORS: &str = "kvindex_snapshot_load_errors_total";
pub const SNAPSHOT_LOAD_SECONDS: &str = "kvindex_snapshot_load_seconds";
pub const DUMP_RECORDS: &str = "kvindex_dump_records_total";
pub const DUMP_ERRORS: &str = "kvindex_dump_write_errors_total";
pub const DUMP_ROTATIONS: &str = "kvindex_dump_rotations_total";
pub const SNAPSHOT_RESTORES: &str = "kvindex_snapshot_restored_pods_total";
pub const RECORD_ROUTE_REQUESTS: &str = "kvindex_record_route_requests_total";
pub const SPECULATIVE_BLOCKS: &str = "kvindex_speculative_blocks_total";
pub const SPECULATIVE_ENTRIES: &str = "kvindex_speculative_entries";
pub const SPECULATIVE_BYTES: &str = "kvindex_speculative_bytes";
pub const SPECULATIVE_CLEARED: &str = "kvindex_speculative_cleared_total";

/// Why the Prometheus recorder could not be installed (another recorder holds the process's
/// one slot, or a bucket setting was refused).
#[derive(Debug, Clone, thiserror::Error)]
#[error("metrics recorder: {0}")]
pub struct RecorderError(String);

/// The process's Prometheus recorder, installed on first use. The `metrics` facade has one
/// global recorder, so servers run in one process (tests) share it.
pub fn recorder() -> Result<PrometheusHandle, RecorderError> {
    static RECORDER: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();
    RECORDER.get_or_init(install).clone().map_err(RecorderError)
}

/// Installs the global recorder. Every latency is a Prometheus histogram with explicit buckets.
fn install() -> Result<PrometheusHandle, String> {
    let score_buckets =
        [0.000_025, 0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5];
    // Ingest latencies: log-spaced from 50 µs to ~2 min (×1.25 per bucket), so quantiles over a
    // whole run, overload included, can be read off the buckets.
    let ingest_buckets: Vec<f64> = (0..67).map(|i| 50e-6 * 1.25f64.powi(i)).collect();
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(SCORE_LATENCY.to_string()), &score_buckets)
        .map_err(|e| e.to_string())?
        .set_buckets_for_metric(Matcher::Full(EVENT_TO_VISIBLE.to_string()), &ingest_buckets)
        .map_err(|e| e.to_string())?
        .set_buckets_for_metric(Matcher::Full(RECEIVE_TO_VISIBLE.to_string()), &ingest_buckets)
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    describe();
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(EVENTS, "KV events applied, by type and source pod");
    describe_counter!(BLOCKS, "Engine blocks stored / removed by applied events");
    describe_counter!(SKIPPED, "Blocks not applied (under-report only), by reason");
    describe_counter!(MESSAGES, "ZeroMQ messages received, by socket kind");
    describe_counter!(DECODE_ERRORS, "Frames or payloads that could not be decoded, by reason");
    describe_counter!(GAPS, "Sequence gaps seen, by source pod");
    describe_counter!(DUPLICATES, "Messages dropped because their seq was already applied");
    describe_counter!(REPLAYS, "Replays, by outcome");
    describe_counter!(CLEARS, "Pod clears, by reason");
    describe_counter!(TRANSITIONS, "Source state transitions");
    describe_gauge!(SOURCES, "Sources (per DP rank) by state");
    describe_gauge!(INDEX_ENTRIES, "Resident (block, pod) entries");
    describe_gauge!(INDEX_KEYS, "Distinct prefix keys");
    describe_gauge!(INDEX_BYTES, Unit::Bytes, "Approximate index memory");
    describe_gauge!(QUEUE_DEPTH, "Messages waiting for the apply workers");
    describe_gauge!(QUEUE_CAPACITY, "Capacity of the apply queues");
    describe_counter!(
        QUEUE_FULL,
        "Live messages that found their apply queue full and waited for room (their socket stopped reading meanwhile)"
    );
    describe_gauge!(
        SOURCE_LAG,
        Unit::Seconds,
        "Largest lag of any source: age of the oldest live batch received and not yet visible"
    );
    describe_histogram!(EVENT_TO_VISIBLE, Unit::Seconds, "Batch ts (publisher clock) to applied");
    describe_histogram!(RECEIVE_TO_VISIBLE, Unit::Seconds, "Socket receive to applied");
    describe_counter!(SCORE_REQUESTS, "ScoreTokens requests, by outcome");
    describe_histogram!(SCORE_LATENCY, Unit::Seconds, "ScoreTokens handling time");
    describe_counter!(
        ZMQ_ERRORS,
        "ZeroMQ failures outside a connection (connect, accept, replay), by operation and reason"
    );
    describe_counter!(ZMQ_CONNECTIONS, "Publisher connections that finished the ZMTP handshake, by socket");
    describe_counter!(ZMQ_DISCONNECTS, "Publisher connections closed, by socket and reason");
    describe_counter!(
        ZMQ_REJECTED,
        "Connections refused by the central SUB (caps, allowlist, bad handshake), by reason"
    );
    describe_gauge!(ZMQ_BYTES_IN_FLIGHT, Unit::Bytes, "Bytes held by ZeroMQ sockets: unfinished and queued messages");
    describe_counter!(RECONNECTIONS, "Per-pod subscriber reconnections");
    describe_counter!(REGISTRATIONS, "Pod registrations and unregistrations, by origin");
    describe_counter!(CONFIG_ERRORS, "Rejected configuration (pods file, registration)");
    describe_counter!(HTTP_INVALID, "Rejected HTTP admin requests");
    describe_gauge!(HTTP_CONNECTIONS, "Open HTTP connections, by listener");
    describe_counter!(
        HTTP_REFUSED,
        "HTTP connections and requests refused for a bound (connection caps, slow or oversized heads and bodies)"
    );
    describe_gauge!(HTTP_BODY_BYTES, Unit::Bytes, "HTTP request body bytes held now (http_max_inflight_body_bytes)");
    describe_counter!(TLS_HANDSHAKE_FAILURES, "TLS handshakes that failed (no or a bad client certificate, timeout)");
    describe_counter!(GRPC_REJECTED, "gRPC requests refused before their handler (too_large: over max_message_bytes)");
    describe_counter!(
        GRPC_SHED,
        "Requests over grpc_small_query_tokens refused RESOURCE_EXHAUSTED: every slot busy and the queue full, by method"
    );
    describe_gauge!(GRPC_LARGE_IN_FLIGHT, "Requests over grpc_small_query_tokens being computed");
    describe_gauge!(GRPC_QUEUED_TOKENS, "Tokens of requests over grpc_small_query_tokens waiting for a slot");
    describe_counter!(
        CONTROL_DENIED,
        "Control-plane calls refused (registration disabled, bad token, operator pod), by api and reason"
    );
    describe_counter!(TOPIC_CONFLICTS, "Central-mode messages dropped: their topic is bound to another source address");
    describe_counter!(
        SOURCES_REFUSED,
        "Messages dropped because they would start a source past max_sources or max_sources_per_address, or name one too long"
    );
    describe_counter!(
        SOURCES_RECLAIMED,
        "Streams forgotten to make room in a full source table: never EXACT and silent, or silent past stale_after_ms"
    );
    describe_gauge!(READY, "1 once the initial replays are done");
    describe_gauge!(PODS, "Pods with index state");
    describe_counter!(HASH_MISMATCHES, "Engine block hashes that differ from vLLM's recipe (sampled cross-check)");
    describe_counter!(HASH_CHECKED, "Engine block hashes recomputed by the sampled cross-check");
    describe_counter!(GET_POD_SCORES_REQUESTS, "llm-d GetPodScores requests, by outcome");
    describe_histogram!(GET_POD_SCORES_SECONDS, Unit::Seconds, "llm-d GetPodScores latency, tokenization included");
    describe_counter!(RECORD_ROUTE_REQUESTS, "RecordRoute requests, by outcome");
    describe_counter!(
        SPECULATIVE_BLOCKS,
        "Blocks credited / refused (by the bound: table, pod, caller) by RecordRoute"
    );
    describe_gauge!(SPECULATIVE_ENTRIES, "Speculative credits held (block, pod)");
    describe_gauge!(SPECULATIVE_BYTES, Unit::Bytes, "Approximate memory of the speculative credits");
    describe_counter!(
        SPECULATIVE_CLEARED,
        "Speculative credits ended early, by reason (pod cleared, degraded, removed)"
    );
}
