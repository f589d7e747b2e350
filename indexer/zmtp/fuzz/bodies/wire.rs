//! The body of the `wire` fuzz target, shared by cargo-fuzz (nightly, `fuzz_targets/wire.rs`)
//! and the stable, bounded run in the test suite (`indexer/tests/it/fuzz_corpus.rs`): what the
//! server does with a message's frames once ZMTP has delivered them: vLLM's live and replay
//! frame layouts (`parse_live`, `parse_replay`), the msgpack event batch (`decode_batch`), the
//! topic (`parse_topic`) and applying whatever decodes to an index. The input's first byte
//! chooses how many frames (1-5) the rest is cut into, the next ones where. Nothing may panic,
//! and an index fed garbage must still answer a score.

use kvindex::wire::{self, ReplayReply};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};

pub fn run(data: &[u8]) {
    let Some((&shape, rest)) = data.split_first() else { return };
    let parts = usize::from(shape % 5) + 1;
    let (cuts, mut body) = rest.split_at(rest.len().min(parts - 1));
    let mut frames: Vec<&[u8]> = Vec::with_capacity(parts);
    for &cut in cuts {
        let (frame, tail) = body.split_at(usize::from(cut).min(body.len()));
        frames.push(frame);
        body = tail;
    }
    frames.push(body);

    let index = KvIndex::new(KvIndexConfig {
        block_size: 16,
        shards: 2,
        max_entries: 10_000,
        hash_check: None,
        ..Default::default()
    });
    if let Ok(raw) = wire::parse_live(&frames) {
        if let Some(topic) = raw.topic.and_then(|t| std::str::from_utf8(t).ok()) {
            let _ = wire::parse_topic(topic);
        }
        if let Ok(batch) = wire::decode_batch(raw.payload) {
            index.apply("pod", "model", &batch);
        }
    }
    if let Ok(ReplayReply::Message(raw)) = wire::parse_replay(&frames) {
        if let Ok(batch) = wire::decode_batch(raw.payload) {
            index.apply("pod", "model", &batch);
        }
    }
    // The whole input as one payload: the msgpack decoder on its own.
    if let Ok(batch) = wire::decode_batch(rest) {
        index.apply("pod", "model", &batch);
    }
    let tokens: Vec<u32> = (0..64).collect();
    let query = ScoreQuery { model: "model", lora_name: None, cache_salt: None, token_ids: &tokens, pods: None };
    let _ = index.score(&query);
}
