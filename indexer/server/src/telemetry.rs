//! Telemetry: the metric names, the table that declares each metric's kind, labels and help
//! (docs/METRICS.md is held to it), and the Prometheus recorder behind `/metrics`. Named so
//! that it does not shadow the `metrics` crate. A leaf: every part of the service names its
//! metrics here, so this names nothing of theirs.

use std::sync::OnceLock;

use kvindex_metric_defs::Kind::{Counter, Gauge, Histogram};
use kvindex_metric_defs::{Metric, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const EVENTS: &str = "kvindex_events_total";
pub const BLOCKS: &str = "kvindex_blocks_total";
pub const SKIPPED: &str = "kvindex_skipped_blocks_total";
pub const UNWEIGHTED_TIER_BLOCKS: &str = "kvindex_unweighted_tier_blocks_total";
pub const BLOCK_SIZE_CHANGES: &str = "kvindex_block_size_changes_total";
pub const MESSAGES: &str = "kvindex_messages_received_total";
pub const DECODE_ERRORS: &str = "kvindex_decode_errors_total";
pub const GAPS: &str = "kvindex_gaps_total";
pub const DUPLICATES: &str = "kvindex_duplicates_total";
pub const REPLAYS: &str = "kvindex_replays_total";
pub const REPLAY_REQUESTS: &str = "kvindex_replay_requests_total";
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
pub const STALE_SOURCES: &str = "kvindex_stale_sources";
pub const SCORES_WITHHELD: &str = "kvindex_scores_withheld_total";
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
pub const HTTP_EVICTED: &str = "kvindex_http_evicted_total";
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
pub const RESERVATIONS: &str = "kvindex_reservations_total";
pub const RESERVATIONS_HELD: &str = "kvindex_reservations";
pub const RESERVATIONS_EXPIRED: &str = "kvindex_reservations_expired_total";
pub const RESERVATION_RELEASES: &str = "kvindex_reservation_releases_total";
pub const RELEASE_ROUTE_REQUESTS: &str = "kvindex_release_route_requests_total";
pub const BOOTSTRAPS: &str = "kvindex_bootstrap_total";
pub const BOOTSTRAP_SECONDS: &str = "kvindex_bootstrap_seconds";
pub const BOOTSTRAP_BYTES: &str = "kvindex_bootstrap_bytes";
pub const SIBLING_EXPORTS: &str = "kvindex_sibling_exports_total";
pub const SIBLING_EXPORT_SECONDS: &str = "kvindex_sibling_export_seconds";
pub const SIBLING_EXPORTS_RUNNING: &str = "kvindex_sibling_exports_running";
pub const SIBLING_CHECKS: &str = "kvindex_sibling_checks_total";
pub const SIBLING_PODS: &str = "kvindex_sibling_pods";

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

/// Every metric `kvindex serve` exports: what `/metrics` describes (HELP and TYPE) and what
/// tests/it/metrics_docs.rs holds docs/METRICS.md to. The labels are every label any series of
/// the metric carries.
pub const METRICS: &[Metric] = &[
    Metric { name: EVENTS, kind: Counter, labels: &["source", "type"], unit: None, help: "KV events applied, by type and source pod" },
    Metric { name: BLOCKS, kind: Counter, labels: &["op"], unit: None, help: "Engine blocks stored / removed by applied events" },
    Metric { name: SKIPPED, kind: Counter, labels: &["reason"], unit: None, help: "Blocks not applied (under-report only), by reason" },
    Metric { name: UNWEIGHTED_TIER_BLOCKS, kind: Counter, labels: &[], unit: None, help: "Engine blocks stored in a tier no weight is known for (held, scored 0)" },
    Metric { name: BLOCK_SIZE_CHANGES, kind: Counter, labels: &[], unit: None, help: "Stores whose engine block size differs from what the pod stored before in the same KV-cache group and tier since it was last cleared (applied; the pod is credited in the lcm of the sizes)" },
    Metric { name: MESSAGES, kind: Counter, labels: &["socket"], unit: None, help: "ZeroMQ messages received, by socket kind" },
    Metric { name: DECODE_ERRORS, kind: Counter, labels: &["reason"], unit: None, help: "Frames or payloads that could not be decoded, by reason" },
    Metric { name: GAPS, kind: Counter, labels: &["source"], unit: None, help: "Sequence gaps seen, by source pod" },
    Metric { name: DUPLICATES, kind: Counter, labels: &[], unit: None, help: "Messages dropped because their seq was already applied" },
    Metric { name: REPLAYS, kind: Counter, labels: &["outcome"], unit: None, help: "Replays, by outcome" },
    Metric { name: REPLAY_REQUESTS, kind: Counter, labels: &["reason"], unit: None, help: "Replays asked, by why (initial_sync, gap, catch_up)" },
    Metric { name: CLEARS, kind: Counter, labels: &["reason"], unit: None, help: "Pod clears, by reason" },
    Metric { name: TRANSITIONS, kind: Counter, labels: &["from", "reason", "to"], unit: None, help: "Source state transitions" },
    Metric { name: SOURCES, kind: Gauge, labels: &["state"], unit: None, help: "Sources (per DP rank) by state" },
    Metric { name: INDEX_ENTRIES, kind: Gauge, labels: &[], unit: None, help: "Resident (block, pod) entries" },
    Metric { name: INDEX_KEYS, kind: Gauge, labels: &[], unit: None, help: "Distinct prefix keys" },
    Metric { name: INDEX_BYTES, kind: Gauge, labels: &[], unit: Some(Unit::Bytes), help: "Approximate index memory" },
    Metric { name: QUEUE_DEPTH, kind: Gauge, labels: &[], unit: None, help: "Messages waiting for the apply workers" },
    Metric { name: QUEUE_CAPACITY, kind: Gauge, labels: &[], unit: None, help: "Capacity of the apply queues" },
    Metric { name: QUEUE_FULL, kind: Counter, labels: &[], unit: None, help: "Live messages that found their apply queue full and waited for room (their socket stopped reading meanwhile)" },
    Metric { name: STALE_SOURCES, kind: Gauge, labels: &[], unit: None, help: "Sources too far behind their engine (max_source_staleness_ms): kept, not credited in scores" },
    Metric { name: SCORES_WITHHELD, kind: Counter, labels: &[], unit: None, help: "Pod matches left out of ScoreTokens/GetPodScores answers because the pod's source was too far behind its engine" },
    Metric { name: SOURCE_LAG, kind: Gauge, labels: &[], unit: Some(Unit::Seconds), help: "Largest lag of any source: age of the oldest live batch received and not yet visible" },
    Metric { name: EVENT_TO_VISIBLE, kind: Histogram, labels: &[], unit: Some(Unit::Seconds), help: "Batch ts (publisher clock) to applied" },
    Metric { name: RECEIVE_TO_VISIBLE, kind: Histogram, labels: &[], unit: Some(Unit::Seconds), help: "Socket receive to applied" },
    Metric { name: SCORE_REQUESTS, kind: Counter, labels: &["outcome"], unit: None, help: "ScoreTokens requests, by outcome" },
    Metric { name: SCORE_LATENCY, kind: Histogram, labels: &[], unit: Some(Unit::Seconds), help: "ScoreTokens handling time" },
    Metric { name: ZMQ_ERRORS, kind: Counter, labels: &["operation", "reason"], unit: None, help: "ZeroMQ failures outside a connection (connect, accept, replay), by operation and reason" },
    Metric { name: ZMQ_CONNECTIONS, kind: Counter, labels: &["socket"], unit: None, help: "Publisher connections that finished the ZMTP handshake, by socket" },
    Metric { name: ZMQ_DISCONNECTS, kind: Counter, labels: &["reason", "socket"], unit: None, help: "Publisher connections closed, by socket and reason" },
    Metric { name: ZMQ_REJECTED, kind: Counter, labels: &["reason", "socket"], unit: None, help: "Connections refused by the central SUB (caps, allowlist, bad handshake), by reason" },
    Metric { name: ZMQ_BYTES_IN_FLIGHT, kind: Gauge, labels: &["socket"], unit: Some(Unit::Bytes), help: "Bytes held by ZeroMQ sockets: unfinished and queued messages" },
    Metric { name: RECONNECTIONS, kind: Counter, labels: &["pod"], unit: None, help: "Per-pod subscriber reconnections" },
    Metric { name: REGISTRATIONS, kind: Counter, labels: &["op", "origin"], unit: None, help: "Pod registrations and unregistrations, by origin" },
    Metric { name: CONFIG_ERRORS, kind: Counter, labels: &["source"], unit: None, help: "Rejected configuration (pods file, registration)" },
    Metric { name: HTTP_INVALID, kind: Counter, labels: &["reason"], unit: None, help: "Rejected HTTP admin requests" },
    Metric { name: HTTP_CONNECTIONS, kind: Gauge, labels: &["listener"], unit: None, help: "Open HTTP connections, by listener" },
    Metric { name: HTTP_REFUSED, kind: Counter, labels: &["listener", "reason"], unit: None, help: "HTTP connections and requests refused for a bound (connection caps, slow or oversized heads and bodies)" },
    Metric { name: HTTP_EVICTED, kind: Counter, labels: &["listener", "reason"], unit: None, help: "Idle HTTP connections closed to make room for a new one at a full connection cap, by the cap" },
    Metric { name: HTTP_BODY_BYTES, kind: Gauge, labels: &[], unit: Some(Unit::Bytes), help: "HTTP request body bytes held now (http_max_inflight_body_bytes)" },
    Metric { name: GRPC_REJECTED, kind: Counter, labels: &["reason"], unit: None, help: "gRPC requests refused before their handler (too_large: over max_message_bytes)" },
    Metric { name: GRPC_SHED, kind: Counter, labels: &["method"], unit: None, help: "Requests over grpc_small_query_tokens refused RESOURCE_EXHAUSTED: every slot busy and the queue full, by method" },
    Metric { name: GRPC_LARGE_IN_FLIGHT, kind: Gauge, labels: &[], unit: None, help: "Requests over grpc_small_query_tokens being computed" },
    Metric { name: GRPC_QUEUED_TOKENS, kind: Gauge, labels: &[], unit: None, help: "Tokens of requests over grpc_small_query_tokens waiting for a slot" },
    Metric { name: TLS_HANDSHAKE_FAILURES, kind: Counter, labels: &["listener", "reason"], unit: None, help: "TLS handshakes that failed (no or a bad client certificate, timeout)" },
    Metric { name: CONTROL_DENIED, kind: Counter, labels: &["api", "reason"], unit: None, help: "Control-plane calls refused (registration disabled, bad token, operator pod), by api and reason" },
    Metric { name: TOPIC_CONFLICTS, kind: Counter, labels: &[], unit: None, help: "Central-mode messages dropped: their topic (any of its DP ranks) is bound to another source address" },
    Metric { name: SOURCES_REFUSED, kind: Counter, labels: &["reason"], unit: None, help: "Messages dropped because they would start a source past max_sources or max_sources_per_address, name one badly, or feed a pod another stream owns" },
    Metric { name: SOURCES_RECLAIMED, kind: Counter, labels: &["reason"], unit: None, help: "Streams forgotten to make room in a full source table (never EXACT and silent, holding no block, or silent past stale_after_ms), or to give a contested pod to another stream" },
    Metric { name: READY, kind: Gauge, labels: &[], unit: None, help: "1 once the initial replays are done" },
    Metric { name: PODS, kind: Gauge, labels: &[], unit: None, help: "Pods with index state" },
    Metric { name: HASH_MISMATCHES, kind: Counter, labels: &["source"], unit: None, help: "Engine block hashes that differ from vLLM's recipe (sampled cross-check)" },
    Metric { name: HASH_CHECKED, kind: Counter, labels: &["source"], unit: None, help: "Engine block hashes recomputed by the sampled cross-check" },
    Metric { name: GET_POD_SCORES_REQUESTS, kind: Counter, labels: &["outcome"], unit: None, help: "llm-d GetPodScores requests, by outcome" },
    Metric { name: GET_POD_SCORES_SECONDS, kind: Histogram, labels: &[], unit: Some(Unit::Seconds), help: "llm-d GetPodScores latency, tokenization included" },
    Metric { name: SNAPSHOT_WRITES, kind: Counter, labels: &["outcome"], unit: None, help: "Snapshots written to snapshot_dir (periodic and at shutdown), by outcome" },
    Metric { name: SNAPSHOT_SECONDS, kind: Histogram, labels: &[], unit: Some(Unit::Seconds), help: "Time to take one snapshot (workers' export, encode, RocksDB write)" },
    Metric { name: SNAPSHOT_BYTES, kind: Gauge, labels: &[], unit: Some(Unit::Bytes), help: "Bytes the last snapshot wrote" },
    Metric { name: SNAPSHOT_STREAMS, kind: Counter, labels: &["outcome"], unit: None, help: "Stream records per snapshot: written again, or kept unchanged" },
    Metric { name: SNAPSHOT_RESIDENCIES, kind: Gauge, labels: &[], unit: None, help: "(block, pod, tier) residencies in the last snapshot" },
    Metric { name: SNAPSHOT_EXPORT_WAITS, kind: Counter, labels: &[], unit: None, help: "Times an apply worker waited for a pod's snapshot export" },
    Metric { name: SNAPSHOT_LOADS, kind: Counter, labels: &["outcome"], unit: None, help: "Snapshot loads at start, by outcome" },
    Metric { name: SNAPSHOT_LOAD_ERRORS, kind: Counter, labels: &["reason"], unit: None, help: "Why a snapshot was refused at start, by reason" },
    Metric { name: SNAPSHOT_LOAD_SECONDS, kind: Histogram, labels: &[], unit: Some(Unit::Seconds), help: "Time to open, read and verify a snapshot" },
    Metric { name: DUMP_RECORDS, kind: Counter, labels: &[], unit: None, help: "Messages appended to the dump (kvindex record)" },
    Metric { name: DUMP_ERRORS, kind: Counter, labels: &[], unit: None, help: "Dump writes that failed (the message is still indexed)" },
    Metric { name: DUMP_ROTATIONS, kind: Counter, labels: &[], unit: None, help: "Dump rotations by the size/age bound" },
    Metric { name: SNAPSHOT_RESTORES, kind: Counter, labels: &["outcome"], unit: None, help: "Snapshot records taken up once their stream continued from the cursor, or dropped" },
    Metric { name: RECORD_ROUTE_REQUESTS, kind: Counter, labels: &["outcome"], unit: None, help: "RecordRoute requests, by outcome" },
    Metric { name: SPECULATIVE_BLOCKS, kind: Counter, labels: &["bound", "result"], unit: None, help: "Blocks credited / refused (by the bound: table, pod, caller) by RecordRoute" },
    Metric { name: SPECULATIVE_ENTRIES, kind: Gauge, labels: &[], unit: None, help: "Speculative credits held (block, pod)" },
    Metric { name: SPECULATIVE_BYTES, kind: Gauge, labels: &[], unit: Some(Unit::Bytes), help: "Approximate memory of the speculative credits" },
    Metric { name: SPECULATIVE_CLEARED, kind: Counter, labels: &["reason"], unit: None, help: "Speculative credits ended early, by reason (pod cleared, degraded, removed)" },
    Metric { name: RESERVATIONS, kind: Counter, labels: &["bound", "result"], unit: None, help: "RecordRoute reservations (shared in-flight load) taken, renewed, released before they came, or refused (by the bound: table, pod, caller; or unknown_pod, disabled)" },
    Metric { name: RESERVATIONS_HELD, kind: Gauge, labels: &[], unit: None, help: "RecordRoute reservations held (requests in flight reserved by routers)" },
    Metric { name: RESERVATIONS_EXPIRED, kind: Counter, labels: &[], unit: None, help: "RecordRoute reservations that reached their TTL unreleased (a router died or lost its indexer)" },
    Metric { name: RESERVATION_RELEASES, kind: Counter, labels: &["part", "result"], unit: None, help: "ReleaseRoute releases by part (prefill, request) and whether they found their reservation" },
    Metric { name: RELEASE_ROUTE_REQUESTS, kind: Counter, labels: &["outcome"], unit: None, help: "ReleaseRoute requests, by outcome" },
    Metric { name: BOOTSTRAPS, kind: Counter, labels: &["outcome"], unit: None, help: "Bootstraps from a sibling (--bootstrap-from), by outcome: loaded, or why not (then the replica starts as without it)" },
    Metric { name: BOOTSTRAP_SECONDS, kind: Histogram, labels: &[], unit: Some(Unit::Seconds), help: "Time to stream and verify a sibling's index" },
    Metric { name: BOOTSTRAP_BYTES, kind: Gauge, labels: &[], unit: Some(Unit::Bytes), help: "Bytes the last bootstrap received" },
    Metric { name: SIBLING_EXPORTS, kind: Counter, labels: &["outcome"], unit: None, help: "Index exports to bootstrapping siblings (ExportIndex), by outcome" },
    Metric { name: SIBLING_EXPORT_SECONDS, kind: Histogram, labels: &[], unit: Some(Unit::Seconds), help: "Time to capture, encode and send an export to a sibling" },
    Metric { name: SIBLING_EXPORTS_RUNNING, kind: Gauge, labels: &[], unit: None, help: "Exports to siblings running now (at most sibling_export_max_concurrent, one per caller)" },
    Metric { name: SIBLING_CHECKS, kind: Counter, labels: &["outcome"], unit: None, help: "Periodic digest checks of a sibling (sibling_check_interval_ms), by outcome" },
    Metric { name: SIBLING_PODS, kind: Gauge, labels: &["sibling", "verdict"], unit: None, help: "Pods by how their digest compared with a sibling's at the last check: agree, differ (same cursor), behind, missing, unsettled" },
];

fn describe() {
    kvindex_metric_defs::describe(METRICS);
}
