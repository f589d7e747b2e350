//! Reads an SGLang pod's load from its Prometheus `/metrics` text, by SGLang's own names
//! (`sglang/srt/observability/metrics_collector.py`): `sglang:num_running_reqs` and
//! `sglang:num_queue_reqs` (running and waiting), `sglang:token_usage` (KV usage, 0–1), and the
//! KV capacity in pages from `sglang:num_pages`, or `sglang:max_total_num_tokens` over
//! `sglang:page_size` (all three set once at start-up; 0.5.19 has them, 0.5.6 only the token
//! count, so a 0.5.6 pod's capacity is unknown).
//!
//! One series per scheduler, labelled `tp_rank`, `pp_rank`, `moe_ep_rank` and, with data
//! parallelism, `dp_rank`. Each `dp_rank` is its own engine: the pod sums their requests and
//! reports its fullest engine's usage and its smallest engine's capacity, as for vLLM's
//! engines. Only a data-parallel group's first attention rank logs by default; with
//! `--enable-metrics-for-all-schedulers` every rank of a group repeats the group's numbers, so
//! series of one `dp_rank` count once (their largest). With priority scheduling the total is the
//! `priority=""` series and the per-priority breakdowns (`priority="<n>"`) are skipped.

use std::collections::BTreeMap;

use crate::pods::engine_load::EngineLoad;
use crate::pods::prom_text::{label, sample, Sample};

const RUNNING: &str = "sglang:num_running_reqs";
const WAITING: &str = "sglang:num_queue_reqs";
const TOKEN_USAGE: &str = "sglang:token_usage";
const NUM_PAGES: &str = "sglang:num_pages";
const MAX_TOTAL_NUM_TOKENS: &str = "sglang:max_total_num_tokens";
const PAGE_SIZE: &str = "sglang:page_size";

/// Most engines (distinct `dp_rank` values) read from one page: a peer cannot make the router
/// keep a map entry per line of a 4 MiB body. Series of further engines are ignored.
const MAX_ENGINES: usize = 1024;

/// One engine's (one `dp_rank`'s) gauges as read so far.
#[derive(Default)]
struct Engine {
    running: f64,
    waiting: f64,
    token_usage: Option<f64>,
    num_pages: Option<f64>,
    max_total_num_tokens: Option<f64>,
    page_size: Option<f64>,
}

fn keep_max(slot: &mut Option<f64>, value: f64) {
    *slot = Some(slot.map_or(value, |v| v.max(value)));
}

/// Parses a `/metrics` body; an error when it has no SGLang request gauges at all.
pub fn parse(text: &str) -> Result<EngineLoad, &'static str> {
    let mut engines: BTreeMap<&str, Engine> = BTreeMap::new();
    let mut seen_requests = false;
    for Sample { name, labels, value } in text.lines().filter_map(sample) {
        if !matches!(name, RUNNING | WAITING | TOKEN_USAGE | NUM_PAGES | MAX_TOTAL_NUM_TOKENS | PAGE_SIZE) {
            continue;
        }
        // A per-priority breakdown repeats part of the total.
        if label(labels, "priority").is_some_and(|p| !p.is_empty()) {
            continue;
        }
        seen_requests |= name == RUNNING || name == WAITING;
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        let rank = label(labels, "dp_rank").unwrap_or("");
        if !engines.contains_key(rank) && engines.len() >= MAX_ENGINES {
            continue;
        }
        let engine = engines.entry(rank).or_default();
        match name {
            RUNNING => engine.running = engine.running.max(value),
            WAITING => engine.waiting = engine.waiting.max(value),
            TOKEN_USAGE => keep_max(&mut engine.token_usage, value),
            NUM_PAGES => keep_max(&mut engine.num_pages, value),
            MAX_TOTAL_NUM_TOKENS => keep_max(&mut engine.max_total_num_tokens, value),
            _ => keep_max(&mut engine.page_size, value),
        }
    }
    if !seen_requests {
        return Err("no sglang:num_running_reqs / sglang:num_queue_reqs series");
    }
    let mut load = EngineLoad::default();
    for engine in engines.values() {
        load.running += engine.running;
        load.waiting += engine.waiting;
        if let Some(usage) = engine.token_usage {
            keep_max(&mut load.kv_usage, usage.clamp(0.0, 1.0));
        }
        let pages = engine.num_pages.or_else(|| {
            let (tokens, page_size) = (engine.max_total_num_tokens?, engine.page_size?);
            (page_size >= 1.0).then(|| (tokens / page_size).floor())
        });
        if let Some(pages) = pages.filter(|&p| p >= 1.0 && p <= u64::MAX as f64).map(|p| p as u64) {
            load.kv_blocks = Some(load.kv_blocks.map_or(pages, |b| b.min(pages)));
        }
    }
    Ok(load)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Built from SGLang 0.5.23's collector code (see `testdata/sglang-metrics/README.md`).
    const DP_ATTENTION_PAGE: &str = include_str!("../../../testdata/sglang-metrics/0.5.23-dp-attention.txt");

    #[test]
    fn a_data_parallel_pod_sums_its_engines_and_keeps_the_fullest_and_the_smallest() {
        let load = parse(DP_ATTENTION_PAGE).unwrap();
        assert_eq!(load, EngineLoad { waiting: 7.0, running: 7.0, kv_usage: Some(0.26), kv_blocks: Some(20_000) });
    }

    #[test]
    fn the_capacity_falls_back_to_tokens_over_page_size_and_is_unknown_without_either() {
        let page = "sglang:num_running_reqs{tp_rank=\"0\"} 1.0\n\
            sglang:max_total_num_tokens{tp_rank=\"0\"} 1000.0\n\
            sglang:page_size{tp_rank=\"0\"} 16.0\n";
        assert_eq!(parse(page).unwrap().kv_blocks, Some(62));
        // SGLang 0.5.6: the token pool's size without its page size.
        let page = "sglang:num_running_reqs{tp_rank=\"0\"} 1.0\nsglang:max_total_num_tokens{tp_rank=\"0\"} 1000.0\n";
        assert_eq!(parse(page).unwrap().kv_blocks, None);
        for bad in ["0.0", "-3.0", "NaN", "+Inf"] {
            let page = format!("sglang:num_running_reqs 1\nsglang:num_pages {bad}\n");
            assert_eq!(parse(&page).unwrap().kv_blocks, None, "{bad}");
        }
    }

    #[test]
    fn priority_breakdowns_and_repeating_ranks_count_once() {
        // Priority scheduling: the total under priority="", the breakdown under "<n>".
        // --enable-metrics-for-all-schedulers: tp_rank 1 repeats tp_rank 0's numbers.
        let page = "sglang:num_queue_reqs{tp_rank=\"0\",priority=\"\"} 5.0\n\
            sglang:num_queue_reqs{tp_rank=\"0\",priority=\"0\"} 3.0\n\
            sglang:num_queue_reqs{tp_rank=\"0\",priority=\"1\"} 2.0\n\
            sglang:num_queue_reqs{tp_rank=\"1\",priority=\"\"} 5.0\n\
            sglang:num_running_reqs{tp_rank=\"0\",priority=\"\"} 2.0\n\
            sglang:num_running_reqs{tp_rank=\"1\",priority=\"\"} 2.0\n\
            sglang:token_usage{tp_rank=\"0\",priority=\"\"} 1.5\n";
        assert_eq!(
            parse(page).unwrap(),
            EngineLoad { waiting: 5.0, running: 2.0, kv_usage: Some(1.0), kv_blocks: None }
        );
    }

    #[test]
    fn vllm_pages_and_garbage_are_not_sglang() {
        assert!(parse("vllm:num_requests_running 1\n").is_err());
        assert!(parse("sglang:token_usage 0.5\nsglang:num_pages 10\n").is_err(), "no request gauges");
        assert!(parse("sglang:num_running_reqs{dp_rank=\"0 1\n").is_err(), "unterminated labels");
        let load = parse("sglang:num_running_reqs NaN\nsglang:num_queue_reqs -3\nnot a sample\n").unwrap();
        assert_eq!(load, EngineLoad::default());
    }

    #[test]
    fn a_page_naming_many_engines_keeps_a_bounded_map() {
        let page: String =
            (0..MAX_ENGINES + 10).map(|rank| format!("sglang:num_running_reqs{{dp_rank=\"{rank}\"}} 1\n")).collect();
        assert_eq!(parse(&page).unwrap().running, MAX_ENGINES as f64);
    }
}
