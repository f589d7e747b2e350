//! Reads an engine's load from its Prometheus `/metrics` text: the three gauges vLLM exports
//! for routers (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
//! `vllm:kv_cache_usage_perc`, or `vllm:gpu_cache_usage_perc` before vLLM 0.10), and the KV
//! capacity from `vllm:cache_config_info`'s `num_gpu_blocks` label (the cost scales the KV term
//! with it). A pod with several engines (data-parallel ranks, one series each) sums its requests
//! and reports its fullest engine's KV usage and its smallest engine's capacity (a request runs
//! on one engine).

use crate::pods::engine_load::EngineLoad;
use crate::pods::prom_text::{label, sample, Sample};

const WAITING: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
const KV_USAGE_OLD: &str = "vllm:gpu_cache_usage_perc";
const CACHE_CONFIG: &str = "vllm:cache_config_info";
const NUM_GPU_BLOCKS: &str = "num_gpu_blocks";

/// Parses a `/metrics` body; an error when it has no vLLM request gauges at all.
pub fn parse(text: &str) -> Result<EngineLoad, &'static str> {
    let mut load = EngineLoad::default();
    let (mut seen_requests, mut kv_old) = (false, None::<f64>);
    for Sample { name, labels, value } in text.lines().filter_map(sample) {
        seen_requests |= name == WAITING || name == RUNNING;
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        match name {
            WAITING => load.waiting += value,
            RUNNING => load.running += value,
            KV_USAGE => load.kv_usage = Some(load.kv_usage.map_or(value, |u| u.max(value))),
            KV_USAGE_OLD => kv_old = Some(kv_old.map_or(value, |u| u.max(value))),
            // vLLM writes `num_gpu_blocks="None"` before the cache is profiled: unknown.
            CACHE_CONFIG => {
                if let Some(blocks) =
                    label(labels, NUM_GPU_BLOCKS).and_then(|v| v.parse::<u64>().ok()).filter(|&b| b > 0)
                {
                    load.kv_blocks = Some(load.kv_blocks.map_or(blocks, |b| b.min(blocks)));
                }
            }
            _ => {}
        }
    }
    if !seen_requests {
        return Err("no vllm:num_requests_waiting / vllm:num_requests_running series");
    }
    load.kv_usage = load.kv_usage.or(kv_old).map(|u| u.clamp(0.0, 1.0));
    Ok(load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_engines_and_keeps_the_fullest_kv_usage() {
        let text = "# HELP vllm:num_requests_running Number of requests.\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"a } b\"} 4.0 1700000000000\n\
            vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n\
            vllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n\
            vllm:num_requests_running_total 99\n";
        let load = parse(text).unwrap();
        assert_eq!(load, EngineLoad { waiting: 4.0, running: 5.0, kv_usage: Some(0.75), kv_blocks: None });
    }

    #[test]
    fn the_kv_capacity_comes_from_cache_config_info_and_is_the_smallest_engines() {
        // As vLLM writes it (CacheConfig.metrics_info(): every field, `num_gpu_blocks_override`
        // included), and kvindex-sim.
        let text = "vllm:num_requests_running{engine=\"0\"} 1\n\
            # HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
            # TYPE vllm:cache_config_info gauge\n\
            vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",engine=\"0\",num_cpu_blocks=\"None\",num_gpu_blocks_override=\"None\",num_gpu_blocks=\"1280\",prefix_caching_hash_algo=\"sha256_cbor\"} 1.0\n\
            vllm:cache_config_info{block_size=\"16\",engine=\"1\",note=\"a \\\" } b\",num_gpu_blocks=\"1000\"} 1.0\n";
        assert_eq!(parse(text).unwrap().kv_blocks, Some(1000));
        for unknown in
            ["num_gpu_blocks=\"None\"", "num_gpu_blocks=\"0\"", "num_gpu_blocks=\"-3\"", "block_size=\"16\"", ""]
        {
            let text = format!("vllm:num_requests_running 1\nvllm:cache_config_info{{{unknown}}} 1\n");
            assert_eq!(parse(&text).unwrap().kv_blocks, None, "{unknown}");
        }
    }

    #[test]
    fn older_vllm_names_and_garbage() {
        let load = parse("vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.5\nnot a sample\n{}\n").unwrap();
        assert_eq!(load, EngineLoad { waiting: 1.0, running: 0.0, kv_usage: Some(0.5), kv_blocks: None });
        assert!(parse("up 1\n").is_err());
        assert!(parse("vllm:num_requests_waiting{engine=\"0 1\n").is_err(), "unterminated labels");
        assert_eq!(parse("vllm:num_requests_running NaN\nvllm:num_requests_waiting -3\n").unwrap().running, 0.0);
    }
}
