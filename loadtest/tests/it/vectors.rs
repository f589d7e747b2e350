//! The simulator against vLLM's own outputs: its block hashes equal the public hash vectors,
//! its encoder reproduces vLLM's captured payloads byte for byte, and kvindex's decoder reads
//! what it publishes.

use crate::support::{hash_u64, hex, read_jsonl};
use kvindex::wire::{decode_batch, Event};
use kvindex_loadtest::engine::{Engine, EngineConfig, KvEvent, NewRequest};
use kvindex_loadtest::fleet::offset_endpoint_port;
use kvindex_loadtest::wire::{encode_batch, WireVersion};
use serde_json::Value;

/// All events of running one request to completion.
fn events_of(engine: &mut Engine, prompt: Vec<u32>, max_tokens: usize) -> Vec<KvEvent> {
    engine.submit(NewRequest { prompt, max_tokens }, 0.0).expect("accepted");
    let mut events = Vec::new();
    let mut now = 0.0;
    while engine.has_work() {
        let out = engine.step(now);
        now += out.duration;
        events.extend(out.events);
    }
    events
}

#[test]
fn block_hashes_equal_vllm_hash_vectors() {
    let mut checked = 0;
    for case in read_jsonl("hashes.jsonl") {
        let plain = case["extra_keys_per_block"].as_array().is_some_and(|keys| keys.iter().all(Value::is_null));
        if case["version"] != "0.33.0" || case["algo"] != "sha256_cbor" || !plain {
            continue;
        }
        let block_size = case["block_size"].as_u64().unwrap() as usize;
        let tokens: Vec<u32> =
            case["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let expected: Vec<u64> =
            case["event_u64"].as_array().unwrap().iter().map(|h| hash_u64(h.as_str().unwrap())).collect();
        let config = EngineConfig {
            block_size,
            num_gpu_blocks: tokens.len() / block_size + 8,
            hash_seed: case["pythonhashseed"].as_str().map(str::to_string),
            ..EngineConfig::default()
        };
        let mut engine = Engine::new(config).unwrap();
        // One token more than the case, so every full block of the case is computed in prefill.
        let mut prompt = tokens.clone();
        prompt.push(7);
        let events = events_of(&mut engine, prompt, 1);
        let KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, .. } = &events[0] else {
            panic!("first event is not a store: {events:?}")
        };
        // With block size 1 the extra token is a block of its own: compare the case's blocks.
        assert_eq!(&block_hashes[..expected.len().min(block_hashes.len())], &expected[..], "case {}", case["case"]);
        assert_eq!(parent_block_hash, &None);
        assert_eq!(&token_ids[..tokens.len()], &tokens[..]);
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} hash cases checked");
}

/// A vectors event the simulator could have produced: a plain GPU block of group 0.
fn simulator_event(event: &Value) -> Option<KvEvent> {
    let hashes = |value: &Value| -> Option<Vec<u64>> {
        value.as_array()?.iter().map(|h| h.as_str().filter(|s| s.starts_with("0x")).map(hash_u64)).collect()
    };
    let none = |key: &str| event.get(key).is_none_or(Value::is_null);
    match event["type"].as_str()? {
        "BlockStored" => {
            let block_hashes = hashes(&event["block_hashes"])?;
            let token_ids: Vec<u32> =
                event["token_ids"].as_array()?.iter().map(|t| t.as_u64().map(|t| t as u32)).collect::<Option<_>>()?;
            let block_size = event["block_size"].as_u64()? as u32;
            let extra_plain = event["extra_keys"]
                .as_array()
                .is_some_and(|k| k.len() == block_hashes.len() && k.iter().all(Value::is_null));
            let plain = event["medium"] == "GPU"
                && none("lora_id")
                && none("lora_name")
                && extra_plain
                && event["group_idx"] == 0
                && [
                    "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window",
                    "locality",
                    "ownership",
                    "session_id",
                    "lookahead_token_ids",
                ]
                .iter()
                .all(|k| none(k))
                && token_ids.len() == block_hashes.len() * block_size as usize;
            let parent_block_hash = match &event["parent_block_hash"] {
                Value::Null => None,
                value => Some(hash_u64(value.as_str().filter(|s| s.starts_with("0x"))?)),
            };
            plain.then_some(KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size })
        }
        "BlockRemoved" => {
            let plain = event["medium"] == "GPU"
                && event["group_idx"] == 0
                && ["locality", "ownership"].iter().all(|k| none(k));
            plain.then_some(KvEvent::BlockRemoved { block_hashes: hashes(&event["block_hashes"])? })
        }
        "AllBlocksCleared" => Some(KvEvent::AllBlocksCleared),
        _ => None,
    }
}

#[test]
fn encoder_reproduces_vllm_payloads_byte_for_byte() {
    for (file, wire) in [("frames-0.33.0.jsonl", WireVersion::V0_33), ("frames-0.23.0.jsonl", WireVersion::V0_23)] {
        let mut compared = 0;
        for record in read_jsonl(file) {
            let expect = &record["expect"];
            if record["kind"] != "live" {
                continue;
            }
            let Some(events) =
                expect["events"].as_array().unwrap().iter().map(simulator_event).collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let frames = record["frames_hex"].as_array().unwrap();
            let payload = hex(frames[2].as_str().unwrap());
            let ts = expect["ts"].as_f64().unwrap();
            let rank = expect["dp_rank"].as_u64().unwrap() as u32;
            assert_eq!(
                encode_batch(wire, ts, &events, rank),
                payload,
                "{file} scenario {} seq {}",
                record["scenario"],
                expect["seq"]
            );
            compared += 1;
        }
        assert!(compared >= 8, "{file}: only {compared} payloads compared");
    }
}

#[test]
fn kvindex_decodes_what_the_simulator_publishes() {
    let mut engine =
        Engine::new(EngineConfig { block_size: 16, num_gpu_blocks: 6, ..EngineConfig::default() }).unwrap();
    let mut events = events_of(&mut engine, (0..40).collect(), 30);
    events.extend(events_of(&mut engine, (1000..1070).collect(), 2)); // evicts
    assert!(engine.reset_prefix_cache());
    events.extend(engine.step(0.0).events);
    assert!(events.iter().any(|e| matches!(e, KvEvent::BlockRemoved { .. })));
    for wire in [WireVersion::V0_33, WireVersion::V0_23] {
        let payload = encode_batch(wire, 1.5, &events, 0);
        let batch = decode_batch(&payload).expect("decodes");
        assert_eq!(batch.ts, 1.5);
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(batch.events.len(), events.len());
        for (decoded, original) in batch.events.iter().zip(&events) {
            match (decoded, original) {
                (
                    Event::BlockStored(d),
                    KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size },
                ) => {
                    assert_eq!(d.block_hashes.iter().map(|h| h.key()).collect::<Vec<_>>(), *block_hashes);
                    assert_eq!(d.parent_block_hash.map(|h| h.key()), *parent_block_hash);
                    assert_eq!(d.token_ids.as_ref(), Some(token_ids));
                    assert_eq!(d.block_size, Some(i64::from(*block_size)));
                    assert_eq!(d.medium, Some("GPU"));
                    assert_eq!(d.group_idx, Some(0));
                }
                (Event::BlockRemoved(d), KvEvent::BlockRemoved { block_hashes }) => {
                    assert_eq!(d.block_hashes.iter().map(|h| h.key()).collect::<Vec<_>>(), *block_hashes);
                }
                (Event::AllBlocksCleared { .. }, KvEvent::AllBlocksCleared) => {}
                other => panic!("mismatch: {other:?}"),
            }
        }
    }
}

#[test]
fn data_parallel_endpoints_follow_vllm_0_33() {
    let mut checked = 0;
    for record in read_jsonl("endpoints.jsonl").iter().filter(|r| r["version"] == "0.33.0") {
        let endpoint = record["endpoint"].as_str().unwrap();
        let rank = record["data_parallel_rank"].as_u64().unwrap() as u32;
        let ours = offset_endpoint_port(endpoint, rank);
        match record["result"].as_str() {
            Some(expected) => assert_eq!(ours.as_deref(), Ok(expected), "{endpoint} rank {rank}"),
            None => assert!(ours.is_err(), "{endpoint} rank {rank}: vLLM refuses it"),
        }
        checked += 1;
    }
    assert!(checked >= 10, "{checked} endpoint cases");
}
