//! The simulator's `cached_tokens` equals what its own event stream implies: every step's
//! events go through the real wire (encode → `kvindex::wire::decode_batch`) into a
//! `kvindex::KvIndex`, and before each request the index's match for the prompt (whole blocks,
//! at most `prompt_len − 1` tokens) must equal what the engine then reports. kvindex's own
//! hash cross-check recomputes every published hash chain with vLLM's recipe on the way.

use kvindex::vllm_hash::BlockHasher;
use kvindex::wire::decode_batch;
use kvindex::{HashCheck, KvIndex, KvIndexConfig, ScoreQuery};
use kvindex_loadtest::engine::request::splitmix64;
use kvindex_loadtest::engine::{Engine, EngineConfig, KvEvent, NewRequest, RequestUpdate};
use kvindex_loadtest::wire::{encode_batch, WireVersion};

const BLOCK: usize = 16;
const POD: &str = "127.0.0.1:8000";
const MODEL: &str = "sim-model";

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = splitmix64(self.0);
        self.0 % n.max(1)
    }
}

fn implied_cached_tokens(index: &KvIndex, prompt: &[u32]) -> usize {
    let result =
        index.score(&ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: prompt, pods: None });
    let matched = result.matches.first().map_or(0, |m| m.matched_blocks as usize);
    matched.min((prompt.len() - 1) / BLOCK) * BLOCK
}

fn run(wire: WireVersion, seed: u64) {
    let config = EngineConfig {
        block_size: BLOCK,
        num_gpu_blocks: 48, // 47 usable blocks: conversations keep evicting each other
        max_num_seqs: 1,    // one admission per step, so the index is exactly the pre-step state
        ..EngineConfig::default()
    };
    let hasher = BlockHasher::new(&config.hash_config()).unwrap();
    let mut engine = Engine::new(config).unwrap();
    let index = KvIndex::new(KvIndexConfig {
        block_size: BLOCK,
        hash_check: Some(HashCheck { hasher, every: 1 }),
        ..KvIndexConfig::default()
    });
    let mut rng = Rng(seed);
    let system_prompts: Vec<Vec<u32>> =
        (0..3).map(|s| (0..40 + 13 * s).map(|i| 50_000 + 1000 * s as u32 + i as u32).collect()).collect();
    let mut conversations: Vec<Vec<u32>> = (0..8).map(|c| system_prompts[c % 3].clone()).collect();
    let (mut now, mut hits, mut removals, mut checked_hashes) = (0.0, 0, 0, 0);

    for turn in 0..120 {
        let conversation = rng.below(conversations.len() as u64) as usize;
        if conversations[conversation].len() > 400 {
            conversations[conversation] = system_prompts[conversation % 3].clone();
        }
        let mut prompt = conversations[conversation].clone();
        let mut question = 5 + rng.below(40) as usize;
        // A block-aligned prompt recomputes its last (cached) block, which vLLM publishes as a
        // duplicate store; keep prompts unaligned so the comparison is exact.
        if (prompt.len() + question) % BLOCK == 0 {
            question += 1;
        }
        prompt.extend((0..question).map(|_| 1 + rng.below(30_000) as u32));
        let expected = implied_cached_tokens(&index, &prompt);
        assert_eq!(engine.peek_cached_tokens(&prompt), expected, "turn {turn}: engine peek vs index");
        let max_tokens = 1 + rng.below(24) as usize;
        let id = engine.submit(NewRequest { prompt: prompt.clone(), max_tokens }, now).unwrap();
        let mut reported = None;
        let mut outputs = Vec::new();
        while engine.has_work() {
            let out = engine.step(now);
            now += out.duration;
            removals += out.events.iter().filter(|e| matches!(e, KvEvent::BlockRemoved { .. })).count();
            if !out.events.is_empty() {
                let payload = encode_batch(wire, now, &out.events, 0);
                let report = index.apply(POD, MODEL, &decode_batch(&payload).expect("decodes"));
                assert_eq!(report.hash_check.mismatched, 0, "turn {turn}: published hashes differ from vLLM's recipe");
                assert_eq!(report.removed_unknown, 0, "turn {turn}: removal of a block never stored");
                checked_hashes += report.hash_check.checked;
            }
            for update in out.updates {
                match update {
                    RequestUpdate::Scheduled { id: got, cached_tokens } if got == id => reported = Some(cached_tokens),
                    RequestUpdate::Token { id: got, token, .. } if got == id => outputs.push(token),
                    _ => {}
                }
            }
        }
        assert_eq!(reported, Some(expected), "turn {turn}: cached_tokens vs the event stream");
        hits += usize::from(expected > 0);
        prompt.extend(outputs);
        conversations[conversation] = prompt;
    }
    assert!(hits > 30, "the workload must exercise hits ({hits})");
    assert!(removals > 30, "the workload must exercise evictions ({removals})");
    assert!(checked_hashes > 100, "kvindex's hash cross-check ran on {checked_hashes} blocks");
}

#[test]
fn cached_tokens_match_the_event_stream_map_form() {
    run(WireVersion::V0_33, 1);
}

#[test]
fn cached_tokens_match_the_event_stream_array_form() {
    run(WireVersion::V0_23, 2);
}
