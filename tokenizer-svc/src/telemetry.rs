//! The tokenizer's metrics, declared once: the name constants the code counts with and the
//! table (kind, labels, help) that `kvindex-tokenizer` describes and tests/it/metrics_docs.rs holds
//! README.md to. The same metrics count inside the router and the indexer when they tokenize in
//! process. Named so that it does not shadow the `metrics` crate.

use kvindex_metric_defs::Kind::{Counter, Histogram};
use kvindex_metric_defs::{Metric, Unit};

pub const REQUESTS: &str = "kvindex_tokenizer_requests_total";
pub const REQUEST_SECONDS: &str = "kvindex_tokenizer_request_duration_seconds";
pub const MODEL_LOADS: &str = "kvindex_tokenizer_model_loads_total";
pub const MODEL_EVICTIONS: &str = "kvindex_tokenizer_model_evictions_total";
pub const PREFIX_CACHE_REQUESTS: &str = "kvindex_tokenizer_prefix_cache_requests_total";
pub const PREFIX_CACHE_TOKENS: &str = "kvindex_tokenizer_prefix_cache_tokens_total";
pub const PREFIX_CACHE_EVICTIONS: &str = "kvindex_tokenizer_prefix_cache_evictions_total";

/// Every metric of the tokenizer (the chat-template sandbox's are
/// [`crate::client_template::METRICS`]).
pub const METRICS: &[Metric] = &[
    Metric {
        name: REQUESTS,
        kind: Counter,
        labels: &["method", "outcome"],
        unit: None,
        help: "Tokenizer requests, by method and outcome",
    },
    Metric {
        name: REQUEST_SECONDS,
        kind: Histogram,
        labels: &["method"],
        unit: Some(Unit::Seconds),
        help: "Tokenizer request latency, by method",
    },
    Metric { name: MODEL_LOADS, kind: Counter, labels: &["outcome"], unit: None, help: "Model loads, by outcome" },
    Metric {
        name: MODEL_EVICTIONS,
        kind: Counter,
        labels: &[],
        unit: None,
        help: "Loaded models evicted to make room for another",
    },
    Metric {
        name: PREFIX_CACHE_REQUESTS,
        kind: Counter,
        labels: &["outcome"],
        unit: None,
        help: "Incremental tokenizations by prefix-cache outcome (hit, miss, bypass)",
    },
    Metric {
        name: PREFIX_CACHE_TOKENS,
        kind: Counter,
        labels: &["source"],
        unit: None,
        help: "Prompt tokens reused from the prefix cache or tokenized",
    },
    Metric {
        name: PREFIX_CACHE_EVICTIONS,
        kind: Counter,
        labels: &[],
        unit: None,
        help: "Prefix-cache entries evicted",
    },
];

/// Describes the tokenizer's metrics and the sandbox's to the installed recorder.
pub fn describe() {
    kvindex_metric_defs::describe(METRICS);
    kvindex_metric_defs::describe(crate::client_template::METRICS);
}
