//! A real vLLM engine serving a hybrid model, replayed: kvindex's score must be what the engine
//! itself served.
//!
//! `loadtest/real-vllm/captures/*-real-hybrid.jsonl` were captured from vLLM 0.32.0's CPU engine
//! on `tiny-model-hybrid` (Gemma 3: group 0 a 64-token sliding window, group 1 full attention;
//! 32-token blocks, 40 blocks, evictions; `hybrid_engine_probe.py`). The sliding-window group
//! keeps only the window's blocks, so its stores name fewer blocks than their tokens cover
//! (parent null, token ids of the whole range): the case the dense-store rule alone would skip.
//! The requests file gives, per request in order, the prompt and the engine's own
//! `cached_tokens`; after each request the probe sent a fence (a fresh 33-token prompt that
//! stores one block), so the index state a request is scored against is every message up to
//! the previous fence. Scored with both groups the answer must equal the engine's exactly;
//! the full-attention group alone over-reports on two of the requests.

use std::path::{Path, PathBuf};

use kvindex::wire::{self, Event};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery, SkipReason};
use serde_json::Value;

use crate::support;

const POD: &str = "127.0.0.1:18300";
const MODEL: &str = "tiny";

fn captures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../loadtest/real-vllm/captures")
}

fn messages() -> Vec<Vec<u8>> {
    support::read_records(&captures().join("frames-0.32.0-real-hybrid.jsonl"))
        .iter()
        .map(|r| {
            let frames = support::frames_of(r);
            let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            wire::parse_live(&frames).expect("live frames").payload.to_vec()
        })
        .collect()
}

/// A fence's message: every store is one block of 32 tokens with no parent.
fn is_fence(payload: &[u8]) -> bool {
    let batch = wire::decode_batch(payload).expect("decodes");
    let stores: Vec<_> = batch
        .events
        .iter()
        .filter_map(|e| match e {
            Event::BlockStored(s) => Some(s),
            _ => None,
        })
        .collect();
    !stores.is_empty()
        && stores.iter().all(|s| {
            s.block_hashes.len() == 1
                && s.parent_block_hash.is_none()
                && s.token_ids.as_ref().is_some_and(|t| t.len() == 32)
        })
}

fn score(index: &KvIndex, tokens: &[u32]) -> u32 {
    let q = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: tokens, pods: None };
    index
        .score(&q)
        .matches
        .iter()
        .find(|m| index.pods().name(m.pod).as_deref() == Some(POD))
        .map_or(0, |m| m.matched_blocks)
}

/// A fresh index holding what `index` exports (a warm restart's snapshot, in memory).
fn restored(index: &KvIndex, block_size: usize) -> KvIndex {
    let fresh = KvIndex::new(KvIndexConfig { block_size, ..Default::default() });
    for pod in index.export_all() {
        assert_eq!(fresh.import_pod(&pod).refused, 0);
    }
    fresh
}

fn replay(block_size: usize) -> (Vec<(String, u64, u64)>, u64) {
    replay_scoring(block_size, false)
}

/// Replays the capture; with `through_snapshot`, the index is replaced by a restore of its
/// export before each request (which is scored there, and the replay continues there).
fn replay_scoring(block_size: usize, through_snapshot: bool) -> (Vec<(String, u64, u64)>, u64) {
    let requests = support::read_records(&captures().join("requests-0.32.0-real-hybrid.jsonl"));
    let mut index = KvIndex::new(KvIndexConfig { block_size, ..Default::default() });
    let mut messages = messages().into_iter();
    let mut skipped = 0;
    let mut results = Vec::new();
    for request in &requests {
        let tokens: Vec<u32> =
            request["prompt_token_ids"].as_array().expect("ids").iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let engine = request["cached_tokens"].as_u64().expect("cached_tokens");
        if through_snapshot {
            index = restored(&index, block_size);
        }
        let ours = u64::from(score(&index, &tokens)) * block_size as u64;
        results.push((request["label"].as_str().unwrap_or("").to_string(), engine, ours));
        // Everything the request and its fence published.
        for payload in messages.by_ref() {
            let report = index.apply(POD, MODEL, &wire::decode_batch(&payload).expect("decodes"));
            skipped += SkipReason::ALL.iter().map(|r| report.skipped(*r)).sum::<u64>();
            if is_fence(&payload) {
                break;
            }
        }
    }
    (results, skipped)
}

#[test]
fn every_request_scores_what_the_engine_served() {
    for block_size in [32, 16] {
        let (results, skipped) = replay(block_size);
        assert_eq!(results.len(), 9);
        assert_eq!(skipped, 0, "every store of the real engine applies (block size {block_size})");
        for (label, engine, ours) in &results {
            assert_eq!(ours, engine, "{label:?} at canonical block size {block_size}: engine served {engine} tokens");
        }
        // The capture exercises what matters: hits, and requests where the sliding-window
        // group's evictions or sparse retention make the engine serve less than full attention
        // holds.
        assert!(results.iter().filter(|r| r.1 > 0).count() >= 3);
    }
}

#[test]
fn a_snapshot_of_the_hybrid_pod_scores_what_the_engine_served() {
    for block_size in [32, 16] {
        let (results, _) = replay_scoring(block_size, true);
        assert_eq!(results.len(), 9);
        for (label, engine, ours) in &results {
            assert_eq!(ours, engine, "{label:?} restored at canonical block size {block_size}");
        }
        assert!(results.iter().filter(|r| r.1 > 0).count() >= 3);
    }
}

#[test]
fn hybrid_requests_include_ones_full_attention_alone_over_reports() {
    let requests = support::read_records(&captures().join("requests-0.32.0-real-hybrid.jsonl"));
    let over =
        requests.iter().filter(|r: &&Value| r["full_attention_alone"].as_u64() > r["cached_tokens"].as_u64()).count();
    assert!(over >= 2, "the capture must hold the false positives a group-0-only index would give");
}

#[test]
fn a_sparse_store_without_its_dense_sibling_is_skipped_not_guessed() {
    let payload = &messages()[0];
    let mut batch = wire::decode_batch(payload).expect("decodes");
    // Keep the sliding-window group's sparse store (2 hashes over 192 tokens) alone.
    batch.events.retain(|e| matches!(e, Event::BlockStored(s) if s.group_idx == Some(0)));
    assert_eq!(batch.events.len(), 1);
    let index = KvIndex::new(KvIndexConfig { block_size: 32, ..Default::default() });
    let report = index.apply(POD, MODEL, &batch);
    assert_eq!(report.skipped(SkipReason::TokenCountMismatch), 2);
    assert_eq!(index.table().entries(), 0);
    let request = &support::read_records(&captures().join("requests-0.32.0-real-hybrid.jsonl"))[1];
    let tokens: Vec<u32> =
        request["prompt_token_ids"].as_array().expect("ids").iter().map(|t| t.as_u64().unwrap() as u32).collect();
    assert_eq!(score(&index, &tokens), 0);
}
