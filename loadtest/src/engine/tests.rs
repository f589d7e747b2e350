//! Unit tests of the engine model: hits, the `prompt_len − 1` rule, LRU eviction order, the
//! event stream, KV pressure and the timing model.

use super::*;

fn config(blocks: usize) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_gpu_blocks: blocks,
        decode_s_per_token: 0.01,
        prefill_tokens_per_s: 1000.0,
        ..EngineConfig::default()
    }
}

/// Steps until every request finished; returns all events, updates and the final time.
fn run(engine: &mut Engine, mut now: f64) -> (Vec<KvEvent>, Vec<RequestUpdate>, f64) {
    let (mut events, mut updates) = (Vec::new(), Vec::new());
    for _ in 0..10_000 {
        if !engine.has_work() {
            break;
        }
        let out = engine.step(now);
        now += out.duration;
        events.extend(out.events);
        updates.extend(out.updates);
    }
    assert!(!engine.has_work(), "engine did not drain");
    (events, updates, now)
}

fn summaries(updates: &[RequestUpdate]) -> Vec<RequestSummary> {
    updates
        .iter()
        .filter_map(|u| match u {
            RequestUpdate::Finished { summary, .. } => Some(summary.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn first_blocks_match_vllm_recipe() {
    // The documented capture: tokens 1..8, block size 4, PYTHONHASHSEED=0, sha256_cbor.
    let mut engine = Engine::new(config(16)).unwrap();
    engine.submit(NewRequest { prompt: (1..=9).collect(), max_tokens: 1 }, 0.0).unwrap();
    let (events, _, _) = run(&mut engine, 0.0);
    assert_eq!(
        events[0],
        KvEvent::BlockStored {
            block_hashes: vec![0x1e0b2e028ef071cb, 0xefad121d154ab2d6],
            parent_block_hash: None,
            token_ids: (1..=8).collect(),
            block_size: 4,
        }
    );
}

#[test]
fn hits_are_whole_blocks_and_leave_one_token() {
    let mut engine = Engine::new(config(64)).unwrap();
    let prompt: Vec<u32> = (100..112).collect(); // exactly 3 blocks
    engine.submit(NewRequest { prompt: prompt.clone(), max_tokens: 1 }, 0.0).unwrap();
    run(&mut engine, 0.0);
    // Same 12 tokens: only 2 blocks may hit (at most 11 tokens from cache).
    assert_eq!(engine.peek_cached_tokens(&prompt), 8);
    let mut longer = prompt.clone();
    longer.extend([7, 7]);
    assert_eq!(engine.peek_cached_tokens(&longer), 12);
    engine.submit(NewRequest { prompt: longer, max_tokens: 2 }, 1.0).unwrap();
    engine.submit(NewRequest { prompt, max_tokens: 1 }, 1.0).unwrap();
    let (_, updates, _) = run(&mut engine, 1.0);
    let cached: Vec<usize> = summaries(&updates).iter().map(|s| s.cached_tokens).collect();
    assert_eq!(cached, vec![8, 12]); // the shorter one finishes first (1 token)
    let stats = engine.stats();
    assert_eq!((stats.prefix_cache_queries, stats.prefix_cache_hits), (12 + 14 + 12, 20));
}

#[test]
fn decode_blocks_are_cached_with_generated_tokens() {
    let mut engine = Engine::new(config(64)).unwrap();
    engine.submit(NewRequest { prompt: vec![1, 2, 3], max_tokens: 6 }, 0.0).unwrap();
    let (events, updates, _) = run(&mut engine, 0.0);
    let outputs: Vec<u32> = updates
        .iter()
        .filter_map(|u| match u {
            RequestUpdate::Token { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(outputs.len(), 6);
    // 3 + 6 tokens, the last sampled one is never computed: 8 in KV = 2 full blocks.
    let stored: Vec<(Vec<u64>, Vec<u32>)> = events
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockStored { block_hashes, token_ids, .. } => Some((block_hashes.clone(), token_ids.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0].1, vec![1, 2, 3, outputs[0]]);
    assert_eq!(stored[1].1, outputs[1..5].to_vec());
    let expected = engine.hasher().hash_chain(None, &[&[1, 2, 3][..], &outputs[..5]].concat(), 4, &[]);
    assert_eq!(stored[1].0, vec![expected[1].published_u64().unwrap()]);
    // A follow-up turn with the generated text hits both blocks.
    let mut next = vec![1, 2, 3];
    next.extend(&outputs);
    next.push(42);
    assert_eq!(engine.peek_cached_tokens(&next), 8);
}

#[test]
fn eviction_is_lru_and_tail_first_with_one_removal_per_hash() {
    // 1 null + 4 usable blocks.
    let mut engine = Engine::new(config(5)).unwrap();
    engine.submit(NewRequest { prompt: (0..9).collect(), max_tokens: 1 }, 0.0).unwrap(); // blocks A0 A1 (+partial)
    let (first, _, now) = run(&mut engine, 0.0);
    let KvEvent::BlockStored { block_hashes: a, .. } = &first[0] else { panic!("expected a store") };
    // The next request needs 3 blocks: the never-used block first, then A's tail (A1) before A0.
    engine.submit(NewRequest { prompt: (50..59).collect(), max_tokens: 1 }, now).unwrap();
    let (events, _, _) = run(&mut engine, now);
    let removed: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockRemoved { block_hashes } => Some(block_hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(
        matches!(events.iter().find(|e| matches!(e, KvEvent::BlockRemoved { .. })), Some(KvEvent::BlockRemoved { block_hashes }) if block_hashes.len() == 1)
    );
    assert_eq!(removed, vec![a[1]]);
    // A0 is still cached: a prompt sharing it hits one block.
    assert_eq!(engine.peek_cached_tokens(&(0..6).collect::<Vec<u32>>()), 4);
}

#[test]
fn kv_pressure_makes_requests_wait_and_ttft_follows_the_model() {
    // 8 usable blocks of 4 tokens; each request needs 5 blocks (17 tokens + 2 outputs).
    let mut engine = Engine::new(config(9)).unwrap();
    engine.submit(NewRequest { prompt: (0..17).collect(), max_tokens: 2 }, 0.0).unwrap();
    engine.submit(NewRequest { prompt: (1000..1017).collect(), max_tokens: 2 }, 0.0).unwrap();
    let out = engine.step(0.0);
    assert_eq!(out.scheduled, 1, "the second request must wait for blocks");
    assert_eq!(engine.stats().num_waiting, 1);
    assert!((out.duration - 17.0 / 1000.0).abs() < 1e-9);
    let (_, updates, _) = run(&mut engine, out.duration);
    let done = summaries(&[out.updates, updates].concat());
    assert_eq!(done.len(), 2);
    // First: prefill 17 tokens at 1000 tok/s. Second: waits for the first's decode step, then
    // prefills its own 17 tokens.
    assert!((done[0].ttft() - 0.017).abs() < 1e-9, "{:?}", done[0]);
    assert!((done[1].ttft() - (0.017 + 0.01 + 0.017)).abs() < 1e-9, "{:?}", done[1]);
}

#[test]
fn long_prefills_are_chunked_by_the_token_budget() {
    let mut engine = Engine::new(EngineConfig { max_num_batched_tokens: 8, ..config(64) }).unwrap();
    engine.submit(NewRequest { prompt: (0..20).collect(), max_tokens: 1 }, 0.0).unwrap();
    let durations: Vec<f64> = (0..3).map(|_| engine.step(0.0).duration).collect();
    assert_eq!(durations, vec![0.008, 0.008, 0.004]);
    assert!(!engine.has_work());
}

#[test]
fn reset_is_refused_while_blocks_are_held_then_clears() {
    let mut engine = Engine::new(config(64)).unwrap();
    engine.submit(NewRequest { prompt: (0..9).collect(), max_tokens: 3 }, 0.0).unwrap();
    let _ = engine.step(0.0);
    assert!(!engine.reset_prefix_cache());
    run(&mut engine, 1.0);
    assert!(engine.reset_prefix_cache());
    assert_eq!(engine.step(2.0).events, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(engine.peek_cached_tokens(&(0..9).collect::<Vec<u32>>()), 0);
}

#[test]
fn preemption_under_decode_pressure_recomputes_and_finishes() {
    // 4 usable blocks; two requests of 7 tokens + 6 outputs need 4 blocks each eventually.
    let mut engine = Engine::new(config(5)).unwrap();
    engine.submit(NewRequest { prompt: (0..7).collect(), max_tokens: 6 }, 0.0).unwrap();
    engine.submit(NewRequest { prompt: (100..107).collect(), max_tokens: 6 }, 0.0).unwrap();
    let (_, updates, _) = run(&mut engine, 0.0);
    let done = summaries(&updates);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|s| s.completion_tokens == 6));
    assert!(engine.stats().preemptions >= 1);
}

#[test]
fn impossible_requests_are_rejected() {
    let mut engine = Engine::new(config(5)).unwrap();
    assert_eq!(engine.submit(NewRequest { prompt: vec![], max_tokens: 1 }, 0.0), Err(RejectReason::EmptyPrompt));
    assert_eq!(engine.submit(NewRequest { prompt: vec![1], max_tokens: 0 }, 0.0), Err(RejectReason::NoOutput));
    assert!(matches!(
        engine.submit(NewRequest { prompt: vec![1; 16], max_tokens: 1 }, 0.0),
        Err(RejectReason::TooLong { .. })
    ));
}

#[test]
fn hash_seed_is_configurable() {
    // docs/reference/vllm-kv-events.md §5: tokens 1..=16, block 16, sha256_cbor.
    let first_block = |seed: Option<&str>| {
        let mut engine =
            Engine::new(EngineConfig { block_size: 16, hash_seed: seed.map(str::to_string), ..config(8) }).unwrap();
        engine.submit(NewRequest { prompt: (1..=17).collect(), max_tokens: 1 }, 0.0).unwrap();
        match run(&mut engine, 0.0).0.remove(0) {
            KvEvent::BlockStored { block_hashes, .. } => block_hashes[0],
            other => panic!("expected a store, got {other:?}"),
        }
    };
    assert_eq!(first_block(Some("0")), 0x2ceabcfae6d332ea);
    // PYTHONHASHSEED unset on vLLM ≥ 0.29: seeded with "vllm-none-hash".
    assert_eq!(first_block(None), 0x7b0bf7bf7fd01682);
    assert_ne!(first_block(Some("1")), first_block(Some("0")));
}
