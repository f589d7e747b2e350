//! A seeded fleet workload for the core benchmarks, shaped like the one used to measure
//! Dynamo's indexer on this machine (`docs/reference/anchors.md`): shared "system prompt"
//! prefixes with Zipf popularity, per-conversation suffixes stored in chunks chained to the
//! previous block, 10% of conversations replicated on 2–4 pods. Events are built as vLLM's
//! block pool builds them (engine hash = a function of the block's content prefix), and can be
//! encoded as vLLM 0.33 map-form msgpack so decode cost is part of the measurement.
#![allow(dead_code)]

use kvindex::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch};
use kvindex::KvIndex;

pub const MODEL: &str = "bench-model";

pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Token ids of a block identified by `id`: deterministic, vocabulary-sized.
pub fn block_tokens(id: u64, block_size: usize, out: &mut Vec<u32>) {
    let mut rng = SplitMix(id);
    out.extend((0..block_size).map(|_| (rng.next() % 151_936) as u32));
}

pub fn pod_name(p: usize) -> String {
    format!("10.1.{}.{}:8000", p / 250, p % 250)
}

/// Block ids of a conversation: its prefix's blocks, then its own suffix blocks.
pub struct Conversation {
    pub blocks: Vec<u64>,
    pub prefix_len: usize,
}

pub struct Fleet {
    pub pods: usize,
    pub block_size: usize,
    /// Conversations with the pods holding them.
    pub conversations: Vec<(Conversation, Vec<usize>)>,
}

/// Fills `index` with about `target_entries` (block, pod) residencies and returns the fleet.
pub fn fill(index: &KvIndex, pods: usize, target_entries: u64, suffix: (u64, u64), seed: u64) -> Fleet {
    let bs = index.block_size();
    let mut rng = SplitMix(seed);
    let prefixes: Vec<Vec<u64>> = (0..200u64).map(|p| (0..rng.range(8, 64)).map(|i| (p << 40) | i).collect()).collect();
    // Zipf(1.0) over prefixes by inverse CDF on harmonic weights.
    let weights: Vec<f64> = (1..=prefixes.len()).map(|r| 1.0 / r as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut has_prefix = vec![vec![false; prefixes.len()]; pods];
    let mut fleet = Fleet { pods, block_size: bs, conversations: Vec::new() };
    let mut tokens = Vec::new();
    let mut conv_id = 1u64;
    while index.table().entries() < target_entries {
        let mut x = (rng.next() % 1_000_000) as f64 / 1_000_000.0 * total;
        let p = weights.iter().position(|w| {
            x -= w;
            x <= 0.0
        });
        let p = p.unwrap_or(prefixes.len() - 1);
        let suffix_len = rng.range(suffix.0, suffix.1) as usize;
        let mut blocks = prefixes[p].clone();
        blocks.extend((0..suffix_len as u64).map(|i| (1 << 63) | (conv_id << 24) | i));
        conv_id += 1;
        let copies = if rng.next().is_multiple_of(10) { rng.range(2, 4) as usize } else { 1 };
        let mut holders = Vec::new();
        while holders.len() < copies.min(pods) {
            let pod = (rng.next() % pods as u64) as usize;
            if !holders.contains(&pod) {
                holders.push(pod);
            }
        }
        let conv = Conversation { blocks, prefix_len: prefixes[p].len() };
        for &pod in &holders {
            let name = pod_name(pod);
            let mut start = 0;
            if !has_prefix[pod][p] {
                has_prefix[pod][p] = true;
                apply_store(index, &name, &conv.blocks, 0, conv.prefix_len, &mut tokens);
            }
            start = start.max(conv.prefix_len);
            while start < conv.blocks.len() {
                let chunk = (rng.range(1, 32) as usize).min(conv.blocks.len() - start);
                apply_store(index, &name, &conv.blocks, start, start + chunk, &mut tokens);
                start += chunk;
            }
        }
        fleet.conversations.push((conv, holders));
    }
    fleet
}

/// Engine hash of block `i` of a chain: a function of the content prefix, as in vLLM.
pub fn engine_hash(blocks: &[u64], i: usize) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(
        &blocks[i].to_le_bytes(),
        if i == 0 { 7 } else { engine_hash_fast(blocks[i - 1]) },
    )
}

fn engine_hash_fast(id: u64) -> u64 {
    id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995
}

pub fn stored_event<'a>(blocks: &[u64], from: usize, to: usize, bs: usize, tokens: &mut Vec<u32>) -> BlockStored<'a> {
    tokens.clear();
    for &b in &blocks[from..to] {
        block_tokens(b, bs, tokens);
    }
    BlockStored {
        block_hashes: (from..to).map(|i| EngineHash::Uint(engine_hash(blocks, i))).collect(),
        parent_block_hash: (from > 0).then(|| EngineHash::Uint(engine_hash(blocks, from - 1))),
        token_ids: Some(tokens.clone()),
        block_size: Some(bs as i64),
        medium: Some("GPU"),
        group_idx: Some(0),
        ..Default::default()
    }
}

fn apply_store(index: &KvIndex, pod: &str, blocks: &[u64], from: usize, to: usize, tokens: &mut Vec<u32>) {
    let ev = stored_event(blocks, from, to, index.block_size(), tokens);
    index.apply(pod, MODEL, &EventBatch { ts: 0.0, events: vec![Event::BlockStored(ev)], data_parallel_rank: Some(0) });
}

pub fn removed_event<'a>(hash: u64) -> BlockRemoved<'a> {
    BlockRemoved {
        block_hashes: vec![EngineHash::Uint(hash)],
        medium: Some("GPU"),
        group_idx: Some(0),
        ..Default::default()
    }
}

/// The prompt's token ids for a conversation's first `held` blocks plus `fresh` unseen blocks.
pub fn query_tokens(conv: &Conversation, held: usize, fresh: usize, bs: usize) -> Vec<u32> {
    let mut tokens = Vec::new();
    for &b in conv.blocks.iter().take(held) {
        block_tokens(b, bs, &mut tokens);
    }
    for i in 0..fresh as u64 {
        block_tokens(0xfeed_0000_0000 + i, bs, &mut tokens);
    }
    tokens
}

/// One engine step's worth of traffic per pod: a 64-block request stored in 16-block events,
/// then evicted one hash per `BlockRemoved` (as vLLM's block pool does), all as msgpack.
pub fn apply_payloads(bs: usize, pods: usize) -> (Vec<(String, Vec<u8>)>, u64) {
    let mut out = Vec::new();
    let mut tokens = Vec::new();
    let mut ops = 0;
    for p in 0..pods {
        let blocks: Vec<u64> = (0..64u64).map(|i| ((p as u64 + 1) << 32) | i).collect();
        let stores: Vec<Event<'_>> =
            (0..4).map(|c| Event::BlockStored(stored_event(&blocks, c * 16, c * 16 + 16, bs, &mut tokens))).collect();
        let removes: Vec<Event<'_>> =
            (0..64).rev().map(|i| Event::BlockRemoved(removed_event(engine_hash(&blocks, i)))).collect();
        for events in [stores, removes] {
            let mut buf = Vec::new();
            encode_batch(1.7e9, &events, &mut buf);
            out.push((pod_name(1000 + p), buf));
        }
        ops += 128;
    }
    (out, ops)
}

/// A 300-or-more-block conversation stored in 64-block chunks by `holders`, for planted queries.
pub fn planted(index: &KvIndex, len: usize, holders: &[usize]) -> Conversation {
    let blocks: Vec<u64> = (0..len as u64).map(|i| (0x7777u64 << 40) | i).collect();
    let mut tokens = Vec::new();
    for &p in holders {
        for start in (0..len).step_by(64) {
            let ev = stored_event(&blocks, start, (start + 64).min(len), index.block_size(), &mut tokens);
            let batch = EventBatch { ts: 0.0, events: vec![Event::BlockStored(ev)], data_parallel_rank: Some(0) };
            index.apply(&pod_name(p), MODEL, &batch);
        }
    }
    Conversation { blocks, prefix_len: 0 }
}

// ---- vLLM 0.33 map-form msgpack, written with `rmp` (an independent encoder from our decoder).

pub fn encode_batch(ts: f64, events: &[Event<'_>], out: &mut Vec<u8>) {
    use rmp::encode::*;
    write_array_len(out, 3).unwrap();
    write_f64(out, ts).unwrap();
    write_array_len(out, events.len() as u32).unwrap();
    for e in events {
        match e {
            Event::BlockStored(s) => {
                write_map_len(out, 10).unwrap();
                write_str(out, "type").unwrap();
                write_str(out, "BlockStored").unwrap();
                write_str(out, "block_hashes").unwrap();
                write_hashes(out, &s.block_hashes);
                write_str(out, "parent_block_hash").unwrap();
                match &s.parent_block_hash {
                    Some(h) => write_hashes_one(out, h),
                    None => write_nil(out).unwrap(),
                }
                write_str(out, "token_ids").unwrap();
                let tokens = s.token_ids.as_deref().unwrap_or(&[]);
                write_array_len(out, tokens.len() as u32).unwrap();
                for &t in tokens {
                    write_uint(out, u64::from(t)).unwrap();
                }
                write_str(out, "block_size").unwrap();
                write_uint(out, s.block_size.unwrap_or(0) as u64).unwrap();
                write_str(out, "lora_id").unwrap();
                write_nil(out).unwrap();
                write_str(out, "medium").unwrap();
                write_str(out, "GPU").unwrap();
                write_str(out, "lora_name").unwrap();
                write_nil(out).unwrap();
                write_str(out, "extra_keys").unwrap();
                write_array_len(out, s.block_hashes.len() as u32).unwrap();
                for _ in &s.block_hashes {
                    write_nil(out).unwrap();
                }
                write_str(out, "group_idx").unwrap();
                write_uint(out, 0).unwrap();
            }
            Event::BlockRemoved(r) => {
                write_map_len(out, 4).unwrap();
                write_str(out, "type").unwrap();
                write_str(out, "BlockRemoved").unwrap();
                write_str(out, "block_hashes").unwrap();
                write_hashes(out, &r.block_hashes);
                write_str(out, "medium").unwrap();
                write_str(out, "GPU").unwrap();
                write_str(out, "group_idx").unwrap();
                write_uint(out, 0).unwrap();
            }
            _ => unreachable!("the benchmark emits stores and removals"),
        }
    }
    write_uint(out, 0).unwrap();
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[EngineHash<'_>]) {
    rmp::encode::write_array_len(out, hashes.len() as u32).unwrap();
    for h in hashes {
        write_hashes_one(out, h);
    }
}

fn write_hashes_one(out: &mut Vec<u8>, h: &EngineHash<'_>) {
    // msgspec writes every u64 ≥ 2^63 as `cf`; force the 8-byte form like real sha256 values.
    out.push(0xcf);
    out.extend_from_slice(&h.key().to_be_bytes());
}
