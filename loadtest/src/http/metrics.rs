//! `/metrics`: the pod's engine state under vLLM's Prometheus names, so load-aware routers
//! and llm-d's scrapers read the simulator as they read vLLM.
//!
//! Rendered directly from the engine snapshot rather than through the `metrics` facade: one
//! process hosts many pods, each with its own `/metrics`, and the facade's recorder is global.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::pod::Pod;

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

pub fn render(pod: &Pod) -> String {
    let stats = pod.stats();
    let labels = format!("engine=\"0\",model_name=\"{}\"", escape_label(&pod.info.model));
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, extra_labels: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{labels}{extra_labels}}} {value:?}");
    };
    metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", "", stats.num_running as f64);
    metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "", stats.num_waiting as f64);
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "", stats.kv_usage);
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        "",
        stats.prefix_cache_queries as f64,
    );
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        "",
        stats.prefix_cache_hits as f64,
    );
    let cache_labels = format!(
        ",block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"sha256_cbor\"",
        stats.block_size, stats.num_gpu_blocks
    );
    metric("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", &cache_labels, 1.0);
    metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.", "", stats.preemptions as f64);
    out
}

pub async fn metrics(State(pod): State<Pod>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], render(&pod))
}
