//! Hybrid models scored exactly as vLLM's coordinator serves them, checked against vLLM itself.
//!
//! The fixture (`fixtures/hybrid_coordinator.json`) holds event streams published by vLLM's own
//! KV-cache manager on hybrid configurations (full attention with one or two sliding windows, a
//! sliding window alone, groups with different block sizes, full attention with Mamba), with
//! evictions by the pool's LRU and by hand, and after every step the longest hit vLLM's
//! `HybridKVCacheCoordinator.find_longest_cache_hit` (or `UnitaryKVCacheCoordinator`) gives for
//! a set of prompts. `tests/hybrid/gen_coordinator_cases.py` generates it (see there to
//! regenerate); CI cannot install vLLM, so it is committed.
//!
//! Every step's events are applied to one pod and every query scored: equal to vLLM's answer,
//! or never above it where vLLM itself serves more than its events say (it caches duplicate
//! blocks under one hash and publishes a removal per duplicate; kvindex drops the hash at the
//! first, as it must to never over-report) and for Mamba. The same streams with the group kinds
//! stripped (what vLLM 0.20–0.21 publish) must never score above vLLM either.

use kvindex::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use serde_json::Value;

const MODEL: &str = "hybrid-model";
const POD: &str = "10.0.0.9:8000";

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hybrid_coordinator.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn hashes(v: &Value) -> Vec<EngineHash<'static>> {
    v.as_array().expect("hash list").iter().map(|h| EngineHash::Uint(h.as_u64().expect("u64 hash"))).collect()
}

/// The step's events as vLLM publishes them; with `kinds` false, as 0.20–0.21 do (no kind, no
/// window: kvindex must then hold every group to the full-attention rule).
fn batch(events: &Value, kinds: bool) -> EventBatch<'_> {
    let events = events
        .as_array()
        .expect("events")
        .iter()
        .map(|e| match e["type"].as_str().expect("type") {
            "BlockStored" => Event::BlockStored(BlockStored {
                block_hashes: hashes(&e["block_hashes"]),
                parent_block_hash: e["parent_block_hash"].as_u64().map(EngineHash::Uint),
                token_ids: Some(
                    e["token_ids"]
                        .as_array()
                        .expect("tokens")
                        .iter()
                        .map(|t| t.as_u64().expect("token") as u32)
                        .collect(),
                ),
                block_size: e["block_size"].as_i64(),
                medium: e["medium"].as_str(),
                group_idx: e["group_idx"].as_i64(),
                kv_cache_spec_kind: e["kv_cache_spec_kind"].as_str().filter(|_| kinds),
                kv_cache_spec_sliding_window: e["kv_cache_spec_sliding_window"].as_i64().filter(|_| kinds),
                ..Default::default()
            }),
            "BlockRemoved" => Event::BlockRemoved(BlockRemoved {
                block_hashes: hashes(&e["block_hashes"]),
                medium: e["medium"].as_str(),
                group_idx: e["group_idx"].as_i64(),
                ..Default::default()
            }),
            "AllBlocksCleared" => Event::AllBlocksCleared { other: vec![] },
            other => panic!("unexpected event {other}"),
        })
        .collect();
    EventBatch { ts: 0.0, events, data_parallel_rank: Some(0) }
}

fn matched_tokens(index: &KvIndex, tokens: &[u32]) -> u64 {
    let pods = [POD];
    let q = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: tokens, pods: Some(&pods) };
    let result = index.score(&q);
    result.matches.first().map_or(0, |m| u64::from(m.matched_blocks)) * index.block_size() as u64
}

/// Replays every case; `check(at, exact, ours, vllm, tokens)` judges each answer, `exact`
/// when vLLM's answer is the one kvindex must equal. Returns the number of queries.
fn replay(kinds: bool, mut check: impl FnMut(&str, bool, u64, u64, &[u32])) -> usize {
    let fixture = fixture();
    let block = fixture["hash_block_size"].as_u64().expect("hash block size") as usize;
    let mut queries = 0;
    for case in fixture["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let modelled = case["exact"].as_bool().expect("exact");
        let prompts: Vec<Vec<u32>> = case["prompts"]
            .as_array()
            .expect("prompts")
            .iter()
            .map(|p| p.as_array().expect("prompt").iter().map(|t| t.as_u64().expect("token") as u32).collect())
            .collect();
        let index = KvIndex::new(KvIndexConfig { block_size: block, ..Default::default() });
        for (step, s) in case["steps"].as_array().expect("steps").iter().enumerate() {
            let report = index.apply(POD, MODEL, &batch(&s["events"], kinds));
            if modelled {
                assert_eq!(
                    report.skipped,
                    [0; kvindex::SkipReason::ALL.len()],
                    "{name} step {step}: every event applies"
                );
            }
            let exact = modelled && s["events_exact"].as_bool().expect("events_exact");
            for q in s["queries"].as_array().expect("queries") {
                let prompt = &prompts[q["prompt"].as_u64().expect("prompt") as usize];
                let len = q["len"].as_u64().expect("len") as usize;
                let tokens: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat(7)).take(len).collect();
                let vllm = q["hit_tokens"].as_u64().expect("hit");
                check(&format!("{name} step {step}"), exact, matched_tokens(&index, &tokens), vllm, &tokens);
                queries += 1;
            }
        }
    }
    queries
}

#[test]
fn every_answer_is_vllms_own() {
    let mut compared = 0;
    let n = replay(true, |at, exact, ours, vllm, tokens| {
        if exact {
            assert_eq!(ours, vllm, "{at}: query of {} tokens", tokens.len());
            compared += 1;
        } else {
            assert!(ours <= vllm, "{at}: {ours} tokens scored, vLLM serves {vllm} (query of {} tokens)", tokens.len());
        }
    });
    assert!(compared > 1_500, "{compared} exact answers of {n}");
}

#[test]
fn without_group_kinds_never_above_vllm() {
    let n = replay(false, |at, _, ours, vllm, tokens| {
        // Without kinds, an engine with one group reads as plain full attention, scored as the
        // blocks it holds up to the prompt's full blocks; vLLM serves one token fewer. Compare
        // at vLLM's cap.
        let ours = ours.min((tokens.len() as u64).saturating_sub(1) / 16 * 16);
        assert!(ours <= vllm, "{at}: {ours} tokens scored without kinds, vLLM serves {vllm} ({} tokens)", tokens.len());
    });
    assert!(n > 2_000);
}
