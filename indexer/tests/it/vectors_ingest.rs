//! Applying vLLM's own captured streams to the index gives exactly the prefixes the engine
//! holds: checked after every message against a reference built independently from the
//! events' token prefixes (no hashing, no shared code with the index: `support/reference.rs`). A stream whose engine
//! publishes several KV-cache groups (or a group that is not full attention) is scored as
//! vLLM's coordinator serves it: the reference tries every length from the longest down and
//! takes the first every group can serve.

use crate::support;

use std::collections::HashMap;

use kvindex::wire::{self, Event};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use serde_json::Value;

use crate::support::reference::{Reference, BLOCK};
use crate::support::{frame_files, frames_of, read_records};

/// Blocks `pod` is credited for the plain prompt `tokens`.
fn score_exactly(index: &KvIndex, pod: &str, tokens: &[u32]) -> u32 {
    let pods = [pod];
    let q = ScoreQuery {
        model: "Qwen/Qwen3-0.6B",
        lora_name: None,
        cache_salt: None,
        token_ids: tokens,
        pods: Some(&pods),
    };
    index.score(&q).matches.first().map_or(0, |m| m.matched_blocks)
}

/// Blocks `pod` is credited for `tokens` and one more token (the engine computes a prompt's last
/// token, so a prompt of exactly its held blocks is credited one block less).
fn score(index: &KvIndex, pod: &str, tokens: &[u32], lora: Option<&str>, salt: Option<&str>) -> u32 {
    let pods = [pod];
    let prompt = [tokens, &[0]].concat();
    let q = ScoreQuery {
        model: "Qwen/Qwen3-0.6B",
        lora_name: lora,
        cache_salt: salt,
        token_ids: &prompt,
        pods: Some(&pods),
    };
    index.score(&q).matches.first().map_or(0, |m| m.matched_blocks)
}

#[test]
fn live_streams_index_exactly_what_the_engine_holds() {
    for path in frame_files() {
        let records = read_records(&path);
        let mut by_scenario: HashMap<String, Vec<&Value>> = HashMap::new();
        for r in records.iter().filter(|r| r["kind"] == "live") {
            by_scenario.entry(r["scenario"].as_str().unwrap().to_string()).or_default().push(r);
        }
        for (scenario, live) in by_scenario {
            let index = KvIndex::new(KvIndexConfig { block_size: BLOCK, ..Default::default() });
            let mut reference = Reference::default();
            let mut all_prompts: Vec<Vec<u32>> = Vec::new();
            for record in live {
                let frames = frames_of(record);
                let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
                let msg = wire::parse_live(&frames).unwrap();
                let batch = wire::decode_batch(msg.payload).unwrap();
                let pod = kvindex::wire::dp_pod_id("10.0.0.7:8000", batch.data_parallel_rank);
                index.apply(&pod, "Qwen/Qwen3-0.6B", &batch);
                for e in &batch.events {
                    reference.apply(e);
                    if let Event::BlockStored(s) = e {
                        if let Some(t) = &s.token_ids {
                            all_prompts.push(t.clone());
                        }
                    }
                }
                // Every plain prefix the reference holds must score exactly; anything else
                // (e.g. the prompts of LoRA, salted or multimodal stores, queried as plain
                // text) must never score more than the reference allows.
                let mut queries: Vec<Vec<u32>> =
                    reference.groups.keys().flat_map(|&g| reference.plain_prefixes(g)).collect();
                queries.extend(all_prompts.iter().cloned());
                // The same prompts one token longer: vLLM serves a hit of at most the prompt's
                // tokens minus one.
                let longer: Vec<Vec<u32>> = queries.iter().map(|q| [q.as_slice(), &[7]].concat()).collect();
                queries.extend(longer);
                for q in &queries {
                    let want = reference.expected(q);
                    let got = score_exactly(&index, &pod, q);
                    assert_eq!(got, want, "{} {scenario} seq {}: query of {} tokens", path.display(), msg.seq, q.len());
                }
            }
        }
    }
}

/// Finds the first live BlockStored in `version`'s main scenario matching `pred`.
fn first_store(version: &str, pred: impl Fn(&wire::BlockStored<'_>) -> bool) -> Option<(Vec<u32>, u64)> {
    let path = support::vectors_dir().join(format!("frames-{version}.jsonl"));
    for record in read_records(&path).iter().filter(|r| r["kind"] == "live" && r["scenario"] == "main") {
        let frames = frames_of(record);
        let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let msg = wire::parse_live(&frames).unwrap();
        let batch = wire::decode_batch(msg.payload).unwrap();
        for e in &batch.events {
            if let Event::BlockStored(s) = e {
                if pred(s) {
                    return Some((s.token_ids.clone().unwrap_or_default(), msg.seq));
                }
            }
        }
    }
    None
}

/// Applies `version`'s main live stream up to and including `last_seq`.
fn index_through(version: &str, last_seq: u64) -> KvIndex {
    let index = KvIndex::new(KvIndexConfig { block_size: BLOCK, ..Default::default() });
    let path = support::vectors_dir().join(format!("frames-{version}.jsonl"));
    for record in read_records(&path).iter().filter(|r| r["kind"] == "live" && r["scenario"] == "main") {
        let frames = frames_of(record);
        let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let msg = wire::parse_live(&frames).unwrap();
        if msg.seq > last_seq {
            break;
        }
        index.apply("10.0.0.7:8000", "Qwen/Qwen3-0.6B", &wire::decode_batch(msg.payload).unwrap());
    }
    index
}

#[test]
fn lora_salt_and_multimodal_blocks_match_only_their_own_queries() {
    for version in ["0.17.0", "0.23.0", "0.33.0"] {
        let (lora_tokens, seq) = first_store(version, |s| s.lora_name.is_some()).expect("a LoRA store");
        let index = index_through(version, seq);
        assert_eq!(score(&index, "10.0.0.7:8000", &lora_tokens, Some("sql-lora"), None), 3, "{version} LoRA");
        assert_eq!(score(&index, "10.0.0.7:8000", &lora_tokens, None, None), 0, "{version} LoRA as base model");

        let salted = |s: &wire::BlockStored<'_>| matches!(s.extra_keys.as_deref(), Some([wire::Value::Array(items), ..]) if items == &[wire::Value::Str("tenant-a-salt")]);
        let (salt_tokens, seq) = first_store(version, salted).expect("a salted store");
        let index = index_through(version, seq);
        assert_eq!(score(&index, "10.0.0.7:8000", &salt_tokens, None, Some("tenant-a-salt")), 2, "{version} salt");
        assert_eq!(score(&index, "10.0.0.7:8000", &salt_tokens, None, None), 0, "{version} salted block, no salt");
        assert_eq!(score(&index, "10.0.0.7:8000", &salt_tokens, None, Some("other")), 0, "{version} wrong salt");

        let mm = |s: &wire::BlockStored<'_>| {
            s.lora_name.is_none()
                && s.extra_keys
                    .as_ref()
                    .is_some_and(|e| e.len() == 4 && e.iter().all(|x| !matches!(x, wire::Value::Nil)))
        };
        let (mm_tokens, seq) = first_store(version, mm).expect("a multimodal store");
        let index = index_through(version, seq);
        assert_eq!(score(&index, "10.0.0.7:8000", &mm_tokens, None, None), 0, "{version} multimodal as text");
    }
}

#[test]
fn cpu_tier_reannouncement_and_large_engine_blocks() {
    let path = support::vectors_dir().join("frames-0.33.0.jsonl");
    let index = KvIndex::new(KvIndexConfig { block_size: BLOCK, ..Default::default() });
    let mut cpu_seen = false;
    let mut bs64_tokens = None;
    for record in read_records(&path).iter().filter(|r| r["kind"] == "live" && r["scenario"] == "main") {
        let frames = frames_of(record);
        let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let batch = wire::decode_batch(wire::parse_live(&frames).unwrap().payload).unwrap();
        let report = index.apply("10.0.0.7:8000", "Qwen/Qwen3-0.6B", &batch);
        // The same engine without its sliding-window group: plain full attention.
        let mut group0 = batch.clone();
        group0.events.retain(|e| match e {
            Event::BlockStored(s) => s.group_idx.unwrap_or(0) == 0,
            Event::BlockRemoved(r) => r.group_idx.unwrap_or(0) == 0,
            _ => true,
        });
        index.apply("plain:8000", "Qwen/Qwen3-0.6B", &group0);
        for e in &batch.events {
            match e {
                Event::BlockStored(s) if s.medium == Some("CPU") => {
                    cpu_seen = true;
                    assert_eq!(
                        report.skipped,
                        [0; kvindex::SkipReason::ALL.len()],
                        "CPU re-announcement of known blocks resolves"
                    );
                    let stats = index.pod_stats("10.0.0.7:8000").unwrap();
                    let cpu = index.tiers().lookup("cpu").unwrap();
                    assert!(stats.tier_blocks[cpu.0 as usize] >= 1, "CPU tier counted: {stats:?}");
                }
                Event::BlockStored(s) if s.block_size == Some(64) => bs64_tokens = s.token_ids.clone(),
                _ => {}
            }
        }
        if let Some(tokens) = bs64_tokens.take() {
            assert_eq!(
                score(&index, "plain:8000", &tokens, None, None),
                8,
                "2 engine blocks of 64 = 8 canonical blocks"
            );
            // The full stream's engine also has a sliding-window group (4096 tokens) holding none
            // of these blocks: vLLM would serve none of them.
            assert_eq!(
                score(&index, "10.0.0.7:8000", &tokens, None, None),
                0,
                "hybrid: the window group holds nothing"
            );
        }
    }
    assert!(cpu_seen);
}

#[test]
fn data_parallel_rank_is_its_own_pod() {
    let path = support::vectors_dir().join("frames-0.33.0.jsonl");
    let index = KvIndex::new(KvIndexConfig { block_size: BLOCK, ..Default::default() });
    let record = read_records(&path)
        .into_iter()
        .find(|r| r["kind"] == "live" && r["scenario"] == "dp-rank-1")
        .expect("dp-rank-1 record");
    let frames = frames_of(&record);
    let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let msg = wire::parse_live(&frames).unwrap();
    let topic = kvindex::wire::parse_topic(std::str::from_utf8(msg.topic.unwrap()).unwrap());
    let batch = wire::decode_batch(msg.payload).unwrap();
    assert_eq!(batch.data_parallel_rank, Some(1));
    // The rank-1 publisher's topic already names port 8001; llm-d derives the pod from the
    // rank-0 endpoint, so both conventions must land on the same pod id.
    assert_eq!(topic.id, "10.0.0.7:8001");
    assert_eq!(kvindex::wire::dp_pod_id("10.0.0.7:8000", batch.data_parallel_rank), "10.0.0.7:8001");
    index.apply("10.0.0.7:8001", topic.model, &batch);
    assert!(index.pod_stats("10.0.0.7:8001").is_some());
    assert!(index.pod_stats("10.0.0.7:8000").is_none());
}

fn hash_checked(version: &str, algo: &str, seed: Option<&str>, block_size: usize) -> kvindex::vllm_hash::Verification {
    use kvindex::vllm_hash::{BlockHasher, VllmHashConfig};
    let hasher = BlockHasher::new(&VllmHashConfig {
        version: version.parse().unwrap(),
        algo: algo.parse().unwrap(),
        pythonhashseed: seed.map(str::to_string),
    })
    .unwrap();
    let config =
        KvIndexConfig { block_size, hash_check: Some(kvindex::HashCheck { hasher, every: 1 }), ..Default::default() };
    let index = KvIndex::new(config);
    let mut total = kvindex::vllm_hash::Verification::default();
    let path = support::vectors_dir().join(format!("frames-{version}.jsonl"));
    for record in read_records(&path).iter().filter(|r| r["kind"] == "live") {
        let frames = frames_of(record);
        let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let msg = wire::parse_live(&frames).unwrap();
        let batch = wire::decode_batch(msg.payload).unwrap();
        let pod = format!("{}#{}", record["scenario"], batch.data_parallel_rank.unwrap_or(0));
        total.merge(&index.apply(&pod, "Qwen/Qwen3-0.6B", &batch).hash_check);
    }
    total
}

#[test]
fn hash_check_confirms_a_right_configuration_and_flags_a_wrong_one() {
    for (version, algo) in [
        ("0.10.1", "sha256_cbor_64bit"),
        ("0.17.0", "sha256_cbor"),
        ("0.23.0", "sha256_cbor"),
        ("0.33.0", "sha256_cbor"),
    ] {
        let right = hash_checked(version, algo, Some("0"), 16);
        assert!(right.checked >= 10, "{version}: {right:?}");
        if version == "0.10.1" {
            // Before 0.17 events carry no extra keys, so salted and multimodal blocks cannot be
            // recomputed from the event: a few mismatches among many matches, by design.
            assert!(right.mismatched * 10 <= right.checked, "{version}: {right:?}");
        } else {
            assert_eq!(right.mismatched, 0, "{version}: {right:?}");
        }
        let wrong_seed = hash_checked(version, algo, Some("1"), 16);
        // Every chain rooted at NONE_HASH mismatches. A chain continuing from a published full
        // internal hash (raw-bytes digests, or sha256_cbor_64bit's u64) does not involve the
        // seed and still verifies.
        assert!(wrong_seed.mismatched >= 5, "{version} wrong seed: {wrong_seed:?}");
        assert!(wrong_seed.mismatched > right.mismatched, "{version} wrong seed: {wrong_seed:?}");
        if version != "0.10.1" {
            // There every block after a published parent verifies on its own u64, so only the
            // first block of each root chain can tell the seed apart.
            assert!(wrong_seed.mismatched > wrong_seed.matched, "{version} wrong seed: {wrong_seed:?}");
        }
    }
    let wrong_algo = hash_checked("0.33.0", "sha256", Some("0"), 16);
    assert_eq!(wrong_algo.matched, 0, "{wrong_algo:?}");
    assert!(wrong_algo.mismatched > 0);
}
