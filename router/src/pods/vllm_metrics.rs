//! Reads an engine's load from its Prometheus `/metrics` text: the three gauges vLLM exports
//! for routers (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
//! `vllm:kv_cache_usage_perc`, or `vllm:gpu_cache_usage_perc` before vLLM 0.10), and the KV
//! capacity in tokens from `vllm:cache_config_info`'s `num_gpu_blocks` × `block_size` labels
//! (the cost scales the KV term with it; tokens, because pods of one fleet may run different
//! block sizes). A pod with several engines (data-parallel ranks, one series each) sums its
//! requests and reports its fullest engine's KV usage and its smallest engine's capacity (a
//! request runs on one engine). A pod that is one rank of such an engine reads the series of
//! its `engine` label only.

use std::collections::BTreeSet;

use crate::pods::engine_load::{of_rank, EngineLoad, Unread, MAX_ENGINES};
use crate::pods::prom_text::{label, sample, Sample};

const WAITING: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
const KV_USAGE_OLD: &str = "vllm:gpu_cache_usage_perc";
const CACHE_CONFIG: &str = "vllm:cache_config_info";
const NUM_GPU_BLOCKS: &str = "num_gpu_blocks";
const BLOCK_SIZE: &str = "block_size";

/// The label naming a series' engine (its data-parallel rank).
const RANK_LABEL: &str = "engine";

/// Parses a `/metrics` body, the series of engine `rank` only when given; an error when it
/// has no vLLM request gauges at all, or none of that rank.
pub fn parse(text: &str, rank: Option<u32>) -> Result<EngineLoad, Unread> {
    let mut load = EngineLoad::default();
    let (mut seen_requests, mut seen_rank, mut kv_old) = (false, false, None::<f64>);
    let mut engines: BTreeSet<&str> = BTreeSet::new();
    for Sample { name, labels, value } in text.lines().filter_map(sample) {
        let requests = name == WAITING || name == RUNNING;
        seen_requests |= requests;
        if !of_rank(labels, RANK_LABEL, rank) {
            continue;
        }
        seen_rank |= requests;
        if let Some(engine) = label(labels, RANK_LABEL).filter(|_| requests) {
            if !engines.contains(engine) && engines.len() >= MAX_ENGINES {
                continue;
            }
            engines.insert(engine);
        }
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
                let positive = |name| label(labels, name).and_then(|v| v.parse::<u64>().ok()).filter(|&n| n > 0);
                if let Some(tokens) =
                    positive(NUM_GPU_BLOCKS).zip(positive(BLOCK_SIZE)).and_then(|(n, size)| n.checked_mul(size))
                {
                    load.kv_tokens = Some(load.kv_tokens.map_or(tokens, |t| t.min(tokens)));
                }
            }
            _ => {}
        }
    }
    if !seen_requests {
        return Err(Unread::NotThisEngine);
    }
    if !seen_rank {
        return Err(Unread::NoSuchRank);
    }
    load.kv_usage = load.kv_usage.or(kv_old).map(|u| u.clamp(0.0, 1.0));
    load.engines = engines.len().max(1) as u32;
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
        let load = parse(text, None).unwrap();
        assert_eq!(load, EngineLoad { waiting: 4.0, running: 5.0, kv_usage: Some(0.75), kv_tokens: None, engines: 2 });
    }

    #[test]
    fn the_kv_capacity_in_tokens_comes_from_cache_config_info_and_is_the_smallest_engines() {
        // As vLLM writes it (CacheConfig.metrics_info(): every field, `num_gpu_blocks_override`
        // included), and kvindex-sim.
        let text = "vllm:num_requests_running{engine=\"0\"} 1\n\
            # HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
            # TYPE vllm:cache_config_info gauge\n\
            vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",engine=\"0\",num_cpu_blocks=\"None\",num_gpu_blocks_override=\"None\",num_gpu_blocks=\"1280\",prefix_caching_hash_algo=\"sha256_cbor\"} 1.0\n\
            vllm:cache_config_info{block_size=\"16\",engine=\"1\",note=\"a \\\" } b\",num_gpu_blocks=\"1000\"} 1.0\n";
        assert_eq!(parse(text, None).unwrap().kv_tokens, Some(16_000));
        // Blocks of 64 tokens: fewer blocks, more tokens (engine 0's 20,480 tokens are fewer).
        let text = "vllm:num_requests_running 1\n\
            vllm:cache_config_info{block_size=\"64\",engine=\"0\",num_gpu_blocks=\"320\"} 1.0\n\
            vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"1500\"} 1.0\n";
        assert_eq!(parse(text, None).unwrap().kv_tokens, Some(20_480));
        for unknown in [
            "num_gpu_blocks=\"None\",block_size=\"16\"",
            "num_gpu_blocks=\"0\",block_size=\"16\"",
            "num_gpu_blocks=\"-3\",block_size=\"16\"",
            "num_gpu_blocks=\"1000\"",
            "num_gpu_blocks=\"1000\",block_size=\"0\"",
            "num_gpu_blocks=\"18446744073709551615\",block_size=\"16\"",
            "block_size=\"16\"",
            "",
        ] {
            let text = format!("vllm:num_requests_running 1\nvllm:cache_config_info{{{unknown}}} 1\n");
            assert_eq!(parse(&text, None).unwrap().kv_tokens, None, "{unknown}");
        }
    }

    #[test]
    fn older_vllm_names_and_garbage() {
        let load =
            parse("vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.5\nnot a sample\n{}\n", None).unwrap();
        assert_eq!(load, EngineLoad { waiting: 1.0, running: 0.0, kv_usage: Some(0.5), kv_tokens: None, engines: 1 });
        assert!(parse("up 1\n", None).is_err());
        assert!(parse("vllm:num_requests_waiting{engine=\"0 1\n", None).is_err(), "unterminated labels");
        assert_eq!(parse("vllm:num_requests_running NaN\nvllm:num_requests_waiting -3\n", None).unwrap().running, 0.0);
    }
}
