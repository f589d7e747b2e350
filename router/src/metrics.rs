//! Metric names (each documented in router/README.md) and the Prometheus recorder. One place,
//! so names cannot drift between the code that counts and the page that explains.

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
pub const TOKENIZER_CACHE_REQUESTS: &str = "kvindex_router_tokenizer_prefix_cache_requests";
pub const TOKENIZER_CACHE_BYTES: &str = "kvindex_router_tokenizer_prefix_cache_bytes";
pub const EXTPROC_STREAMS: &str = "kvindex_router_extproc_streams_total";
pub const EXTPROC_PROTOCOL_ERRORS: &str = "kvindex_router_extproc_protocol_errors_total";
pub const EXTPROC_PICK_SECONDS: &str = "kvindex_router_extproc_pick_seconds";
pub const PREFILTER: &str = "kvindex_router_prefilter_total";
pub const HTTP_CONNECTIONS: &str = "kvindex_router_http_connections";
pub const HTTP_CONNECTIONS_REFUSED: &str = "kvindex_router_http_connections_refused_total";
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

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(REQUESTS, "Proxied requests by endpoint and HTTP status");
    describe_counter!(REQUEST_ERRORS, "Requests answered with an error by the router itself, by reason");
    describe_histogram!(ROUTE_SECONDS, Unit::Seconds, "Routing overhead by stage (tokenize, score, pick, total)");
    describe_counter!(SCORE_ATTEMPTS, "ScoreTokens calls by indexer endpoint and outcome");
    describe_counter!(FAIL_OPEN, "Requests placed by load only, by reason");
    describe_counter!(TOKENIZE, "Prompt tokenizations by where and outcome");
    describe_counter!(
        TOKENS_TOKENIZED,
        "Tokens the router's tokenizers produced for prompts (counted up to where tokenization stopped)"
    );
    describe_counter!(PICKS, "Requests sent to each pod, by role");
    describe_counter!(PROMPT_BLOCKS, "Full prompt blocks of routed requests");
    describe_counter!(CACHED_BLOCKS, "Prompt blocks the chosen pod was predicted to hold, by kind");
    describe_counter!(KV_CUTOFF, "Picks that passed over a pod at or above the KV-usage cutoff");
    describe_counter!(
        OVERLAP_PICKS,
        "Requests by how the pick compares with the best cached prefix on offer (best, below_best, no_overlap, unscored)"
    );
    describe_counter!(
        BEST_CACHED_BLOCKS,
        "Cached blocks on the best-overlap pod of each scored request, picked or not (over prompt_blocks: the reachable hit rate)"
    );
    describe_histogram!(
        OVERLAP_GIVEN_UP_BLOCKS,
        "Per scored request with some overlap: best pod's cached blocks minus the chosen pod's (0 = best pick)"
    );
    describe_counter!(
        CACHE_PREDICTION,
        "Responses by the engine's cached_tokens against the router's prediction (exact, over, under, unreported)"
    );
    describe_counter!(ENGINE_CACHED_TOKENS, "Cached prompt tokens the engines reported in responses' usage");
    describe_counter!(ENGINE_PROMPT_TOKENS, "Prompt tokens of the responses whose usage reported cached_tokens");
    describe_counter!(
        PREDICTED_CACHED_TOKENS,
        "Cached tokens the router predicted for the responses whose usage reported cached_tokens"
    );
    describe_counter!(UPSTREAM_RETRIES, "Requests retried on the next pod before any response byte, by reason");
    describe_histogram!(UPSTREAM_FIRST_BYTE, Unit::Seconds, "Upstream response head latency");
    describe_counter!(CLIENT_DISCONNECTS, "Responses abandoned by the client before the end (upstream cancelled)");
    describe_gauge!(INFLIGHT, "Requests in flight per pod");
    describe_gauge!(PODS, "Pods by role");
    describe_gauge!(POD_LOAD, "Last scraped load per pod (waiting, running, kv_usage, kv_blocks)");
    describe_gauge!(
        TOKENIZER_CACHE_REQUESTS,
        "In-process tokenizations by prefix-cache result (hit, miss, bypass), since start"
    );
    describe_gauge!(TOKENIZER_CACHE_BYTES, Unit::Bytes, "In-process tokenizer prefix cache: bytes used and capacity");
    describe_counter!(SCRAPES, "Scrapes of pod /metrics by outcome");
    describe_counter!(POD_CHANGES, "Pod table changes by source and operation");
    describe_counter!(RECORD_ROUTE, "RecordRoute calls to the indexer by outcome");
    describe_counter!(EXTPROC_STREAMS, "ext_proc streams (gateway requests) by how they ended");
    describe_counter!(EXTPROC_PROTOCOL_ERRORS, "ext_proc streams ended for breaking the protocol, by reason");
    describe_histogram!(EXTPROC_PICK_SECONDS, Unit::Seconds, "ext_proc: first request body byte in to destination out");
    describe_gauge!(HTTP_CONNECTIONS, "Open HTTP connections by listener");
    describe_counter!(
        HTTP_CONNECTIONS_REFUSED,
        "HTTP connections closed at accept: the listener was at --max-connections"
    );
    describe_counter!(HTTP_TIMEOUTS, "HTTP requests cut off for a slow client, by phase (header, body)");
    describe_gauge!(
        HTTP_BODY_BYTES,
        Unit::Bytes,
        "Request body bytes held by the proxy now (bounded by --max-inflight-body-bytes)"
    );
    describe_counter!(PREFILTER, "Pre-filter answers: hint, miss (no hint) or error (no hint, request passed on)");
}
