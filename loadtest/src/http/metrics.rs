//! `/metrics`: the pod's engine state under its engine's Prometheus names (vLLM's, or SGLang's
//! for `--engine sglang`), so load-aware routers and llm-d's scrapers read the simulator as they
//! read that engine.
//!
//! Rendered directly from the engine snapshot rather than through the `metrics` facade: one
//! process hosts many pods, each with its own `/metrics`, and the facade's recorder is global.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::engine::EngineStats;
use crate::pod::{MetricsDialect, Pod};

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The pod's `/metrics` page in its engine's names.
pub fn render(pod: &Pod) -> String {
    match pod.info.metrics_dialect {
        MetricsDialect::Vllm => render_vllm(pod),
        MetricsDialect::Sglang => render_sglang(pod),
    }
}

/// One series per data-parallel rank (`engine="<rank>"`), as vLLM labels its engines.
fn render_vllm(pod: &Pod) -> String {
    let model = escape_label(&pod.info.model);
    let ranks: Vec<(u32, EngineStats)> = pod.ranks().iter().map(|rank| (rank.rank, rank.stats())).collect();
    let mut out = String::new();
    let mut metric = |name: &str,
                      kind: &str,
                      help: &str,
                      extra_labels: &dyn Fn(&EngineStats) -> String,
                      value: &dyn Fn(&EngineStats) -> f64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (rank, stats) in &ranks {
            let _ = writeln!(
                out,
                "{name}{{engine=\"{rank}\",model_name=\"{model}\"{}}} {:?}",
                extra_labels(stats),
                value(stats)
            );
        }
    };
    let none = |_: &EngineStats| String::new();
    metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", &none, &|s| {
        s.num_running as f64
    });
    metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", &none, &|s| {
        s.num_waiting as f64
    });
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", &none, &|s| s.kv_usage);
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        &none,
        &|s| s.prefix_cache_queries as f64,
    );
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        &none,
        &|s| s.prefix_cache_hits as f64,
    );
    let cache_labels = |s: &EngineStats| {
        format!(
            ",block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"sha256_cbor\"",
            s.block_size, s.num_gpu_blocks
        )
    };
    metric("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", &cache_labels, &|_| 1.0);
    metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.", &none, &|s| {
        s.preemptions as f64
    });
    out
}

/// SGLang's scheduler gauges (`sglang/srt/observability/metrics_collector.py`), labelled as
/// its schedulers label them: one series per data-parallel rank, `dp_rank` only with more than
/// one, and the KV pool's size as SGLang reports it at start-up (tokens, page size, pages).
fn render_sglang(pod: &Pod) -> String {
    let model = escape_label(&pod.info.model);
    let ranks: Vec<(u32, EngineStats)> = pod.ranks().iter().map(|rank| (rank.rank, rank.stats())).collect();
    let data_parallel = ranks.len() > 1;
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, value: &dyn Fn(&EngineStats) -> f64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (rank, stats) in &ranks {
            let dp_rank = if data_parallel { format!(",dp_rank=\"{rank}\"") } else { String::new() };
            let _ = writeln!(
                out,
                "{name}{{model_name=\"{model}\",engine_type=\"unified\",tp_rank=\"{rank}\",pp_rank=\"0\",moe_ep_rank=\"0\"{dp_rank}}} {:?}",
                value(stats)
            );
        }
    };
    gauge("sglang:num_running_reqs", "The number of running requests.", &|s| s.num_running as f64);
    gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", &|s| s.num_waiting as f64);
    gauge("sglang:token_usage", "The token usage.", &|s| s.kv_usage);
    gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", &|s| {
        if s.prefix_cache_queries == 0 {
            0.0
        } else {
            s.prefix_cache_hits as f64 / s.prefix_cache_queries as f64
        }
    });
    gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", &|s| {
        (s.num_gpu_blocks * s.block_size) as f64
    });
    gauge("sglang:page_size", "KV cache page size in tokens.", &|s| s.block_size as f64);
    gauge("sglang:num_pages", "Number of KV cache pages.", &|s| s.num_gpu_blocks as f64);
    out
}

pub async fn metrics(State(pod): State<Pod>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], render(&pod))
}
