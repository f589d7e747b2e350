//! Reads an SGLang pod's load from its Prometheus `/metrics` text, by SGLang's own names
//! (`sglang/srt/observability/metrics_collector.py`): `sglang:num_running_reqs` and
//! `sglang:num_queue_reqs` (running and waiting), `sglang:token_usage` (KV usage, 0–1), and the
//! KV capacity in tokens from `sglang:max_total_num_tokens`, or `sglang:num_pages` ×
//! `sglang:page_size` (all three set once at start-up; 0.5.19 has them, 0.5.6 only the token
//! count). Tokens, not pages: a page-size-1 pod's pages are tokens, and pods of several page and
//! block sizes share one fleet.
//!
//! One series per scheduler, labelled `tp_rank`, `pp_rank`, `moe_ep_rank` and, with data
//! parallelism, `dp_rank`. Each `dp_rank` is its own engine: the pod sums their requests and
//! reports its fullest engine's usage and its smallest engine's capacity, as for vLLM's
//! engines; a pod that is one rank of the engine (the router names the rank) reads that
//! `dp_rank`'s series only. Only a data-parallel group's first attention rank logs by default; with
//! `--enable-metrics-for-all-schedulers` every rank of a group repeats the group's numbers, so
//! series of one `dp_rank` count once (their largest). With priority scheduling the total is the
//! `priority=""` series and the per-priority breakdowns (`priority="<n>"`) are skipped.

use std::collections::BTreeMap;

use crate::pods::engine_load::{of_rank, EngineLoad, Unread, MAX_ENGINES};
use crate::pods::prom_text::{label, sample, Sample};

const RUNNING: &str = "sglang:num_running_reqs";
const WAITING: &str = "sglang:num_queue_reqs";
const TOKEN_USAGE: &str = "sglang:token_usage";
const NUM_PAGES: &str = "sglang:num_pages";
const MAX_TOTAL_NUM_TOKENS: &str = "sglang:max_total_num_tokens";
const PAGE_SIZE: &str = "sglang:page_size";

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

/// The label naming a scheduler's data-parallel rank.
const RANK_LABEL: &str = "dp_rank";

/// Parses a `/metrics` body, the series of data-parallel rank `rank` only when given; an error
/// when it has no SGLang request gauges at all, or none of that rank.
pub fn parse(text: &str, rank: Option<u32>) -> Result<EngineLoad, Unread> {
    let mut engines: BTreeMap<&str, Engine> = BTreeMap::new();
    let (mut seen_requests, mut seen_rank) = (false, false);
    for Sample { name, labels, value } in text.lines().filter_map(sample) {
        if !matches!(name, RUNNING | WAITING | TOKEN_USAGE | NUM_PAGES | MAX_TOTAL_NUM_TOKENS | PAGE_SIZE) {
            continue;
        }
        // A per-priority breakdown repeats part of the total.
        if label(labels, "priority").is_some_and(|p| !p.is_empty()) {
            continue;
        }
        let requests = name == RUNNING || name == WAITING;
        seen_requests |= requests;
        if !of_rank(labels, RANK_LABEL, rank) {
            continue;
        }
        seen_rank |= requests;
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        let engine_rank = label(labels, RANK_LABEL).unwrap_or("");
        if !engines.contains_key(engine_rank) && engines.len() >= MAX_ENGINES {
            continue;
        }
        let engine = engines.entry(engine_rank).or_default();
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
        return Err(Unread::NotThisEngine);
    }
    if !seen_rank {
        return Err(Unread::NoSuchRank);
    }
    let mut load = EngineLoad { engines: engines.len().max(1) as u32, ..EngineLoad::default() };
    for engine in engines.values() {
        load.running += engine.running;
        load.waiting += engine.waiting;
        if let Some(usage) = engine.token_usage {
            keep_max(&mut load.kv_usage, usage.clamp(0.0, 1.0));
        }
        let usable = |n: f64| n >= 1.0 && n < u64::MAX as f64;
        let from_pages = || {
            let (pages, page_size) =
                (engine.num_pages.filter(|&p| usable(p))?, engine.page_size.filter(|&p| usable(p))?);
            Some(pages.floor() * page_size.floor())
        };
        let tokens = engine.max_total_num_tokens.filter(|&t| usable(t)).or_else(from_pages);
        if let Some(tokens) = tokens.filter(|&t| usable(t)).map(|t| t as u64) {
            load.kv_tokens = Some(load.kv_tokens.map_or(tokens, |t| t.min(tokens)));
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
        let load = parse(DP_ATTENTION_PAGE, None).unwrap();
        assert_eq!(
            load,
            EngineLoad { waiting: 7.0, running: 7.0, kv_usage: Some(0.26), kv_tokens: Some(320_000), engines: 2 }
        );
    }

    #[test]
    fn one_rank_of_a_data_parallel_pod_reads_its_own_series_only() {
        let rank = |r| parse(DP_ATTENTION_PAGE, Some(r));
        assert_eq!(
            rank(0),
            Ok(EngineLoad { waiting: 2.0, running: 3.0, kv_usage: Some(0.13), kv_tokens: Some(327_680), engines: 1 })
        );
        assert_eq!(
            rank(1),
            Ok(EngineLoad { waiting: 5.0, running: 4.0, kv_usage: Some(0.26), kv_tokens: Some(320_000), engines: 1 })
        );
        assert_eq!(rank(2), Err(Unread::NoSuchRank), "a rank the engine does not run");
        let single = "sglang:num_running_reqs{tp_rank=\"0\"} 1.0\n";
        assert_eq!(parse(single, Some(0)), Err(Unread::NoSuchRank), "no dp_rank label: not a data-parallel engine");
        assert_eq!(parse("vllm:num_requests_running{engine=\"0\"} 1\n", Some(0)), Err(Unread::NotThisEngine));
    }

    #[test]
    fn the_capacity_is_in_tokens_whatever_the_page_size_and_unknown_without_it() {
        // The token pool's size (every release from 0.5.6 on has it).
        for page_size in ["1.0", "16.0", "64.0"] {
            let page = format!(
                "sglang:num_running_reqs{{tp_rank=\"0\"}} 1.0\n\
                 sglang:max_total_num_tokens{{tp_rank=\"0\"}} 20480.0\n\
                 sglang:page_size{{tp_rank=\"0\"}} {page_size}\n"
            );
            assert_eq!(parse(&page, None).unwrap().kv_tokens, Some(20_480), "page size {page_size}");
        }
        let page = "sglang:num_running_reqs{tp_rank=\"0\"} 1.0\nsglang:max_total_num_tokens{tp_rank=\"0\"} 1000.0\n";
        assert_eq!(parse(page, None).unwrap().kv_tokens, Some(1000));
        // Without it: pages × page size.
        let page = "sglang:num_running_reqs{tp_rank=\"0\"} 1.0\n\
            sglang:num_pages{tp_rank=\"0\"} 320.0\n\
            sglang:page_size{tp_rank=\"0\"} 64.0\n";
        assert_eq!(parse(page, None).unwrap().kv_tokens, Some(20_480));
        let page = "sglang:num_running_reqs{tp_rank=\"0\"} 1.0\nsglang:num_pages{tp_rank=\"0\"} 320.0\n";
        assert_eq!(parse(page, None).unwrap().kv_tokens, None, "pages of an unknown size");
        for bad in ["0.0", "-3.0", "NaN", "+Inf", "1e30"] {
            let page = format!("sglang:num_running_reqs 1\nsglang:max_total_num_tokens {bad}\n");
            assert_eq!(parse(&page, None).unwrap().kv_tokens, None, "{bad}");
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
            parse(page, None).unwrap(),
            EngineLoad { waiting: 5.0, running: 2.0, kv_usage: Some(1.0), kv_tokens: None, engines: 1 }
        );
    }

    #[test]
    fn vllm_pages_and_garbage_are_not_sglang() {
        assert!(parse("vllm:num_requests_running 1\n", None).is_err());
        assert!(parse("sglang:token_usage 0.5\nsglang:num_pages 10\n", None).is_err(), "no request gauges");
        assert!(parse("sglang:num_running_reqs{dp_rank=\"0 1\n", None).is_err(), "unterminated labels");
        let load = parse("sglang:num_running_reqs NaN\nsglang:num_queue_reqs -3\nnot a sample\n", None).unwrap();
        assert_eq!(load, EngineLoad::default());
    }

    #[test]
    fn a_page_naming_many_engines_keeps_a_bounded_map() {
        let page: String =
            (0..MAX_ENGINES + 10).map(|rank| format!("sglang:num_running_reqs{{dp_rank=\"{rank}\"}} 1\n")).collect();
        let load = parse(&page, None).unwrap();
        assert_eq!((load.running, load.engines), (MAX_ENGINES as f64, MAX_ENGINES as u32));
    }
}
