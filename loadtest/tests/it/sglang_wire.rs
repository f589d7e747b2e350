//! `kvindex-sim --engine sglang` speaks SGLang's layout byte for byte: every event batch SGLang's
//! own publisher captured (testdata/sglang-vectors) whose events the simulator can produce
//! (GPU pages of plain token ids, no salt, adapter or session) is re-encoded from its decoded
//! form and must equal the captured payload; and kvindex decodes what the simulator sends.

use crate::support::{read_records, sglang_frame_files};
use kvindex::wire::{decode_batch_as, Engine, Event};
use kvindex_loadtest::engine::KvEvent;
use kvindex_loadtest::wire::{encode_batch, WireVersion};
use serde_json::Value;

/// `"0x…"` or a signed decimal → the id's u64 bits.
fn id_bits(text: &str) -> u64 {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
        None => text.parse::<i64>().unwrap() as u64,
    }
}

/// The simulator's events for a captured batch, or `None` when it holds something the
/// simulator never produces.
fn sim_events(expect: &Value) -> Option<Vec<KvEvent>> {
    let mut out = Vec::new();
    for e in expect["events"].as_array()? {
        let plain_extras =
            ["cache_salt", "session_id", "lora_name", "metadata", "lora_id"].iter().all(|k| e[*k].is_null());
        let gpu = e["medium"].is_null() || e["medium"] == "GPU";
        if !plain_extras || !gpu {
            return None;
        }
        let hashes = || e["block_hashes"].as_array().map(|h| h.iter().map(|h| id_bits(h.as_str().unwrap())).collect());
        out.push(match e["type"].as_str()? {
            "BlockStored" => KvEvent::BlockStored {
                block_hashes: hashes()?,
                parent_block_hash: e["parent_block_hash"].as_str().map(id_bits),
                token_ids: e["token_ids"]
                    .as_array()?
                    .iter()
                    .map(|t| t.as_u64().map(|t| t as u32))
                    .collect::<Option<_>>()?,
                block_size: e["block_size"].as_u64()? as u32,
            },
            "BlockRemoved" => KvEvent::BlockRemoved { block_hashes: hashes()? },
            "AllBlocksCleared" => KvEvent::AllBlocksCleared,
            _ => return None,
        });
    }
    Some(out)
}

#[test]
fn the_sglang_encoder_reproduces_sglang_payloads() {
    let mut checked = 0;
    let mut releases = std::collections::BTreeSet::new();
    for path in sglang_frame_files() {
        for record in read_records(&path) {
            let expect = &record["expect"];
            if expect["end_of_replay"] == true {
                continue;
            }
            let Some(events) = sim_events(expect) else { continue };
            let version = record["version"].as_str().unwrap();
            let wire = WireVersion::parse_sglang(version).expect("an SGLang release");
            let payload_hex = record["frames_hex"].as_array().unwrap().last().unwrap().as_str().unwrap();
            let ts = expect["ts"].as_f64().unwrap();
            let rank = expect["dp_rank"].as_u64().unwrap() as u32;
            let encoded = encode_batch(wire, ts, &events, rank);
            let hex: String = encoded.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, payload_hex, "{version} {} seq {}", record["scenario"], expect["seq"]);
            // kvindex reads it back as the same events.
            let batch = decode_batch_as(Engine::Sglang, &encoded).unwrap();
            assert_eq!(batch.events.len(), events.len());
            assert!(batch.events.iter().all(|e| !matches!(e, Event::Unknown { .. })));
            releases.insert(version.to_string());
            checked += 1;
        }
    }
    assert!(checked >= 60, "only {checked} payloads checked");
    assert_eq!(releases.len(), 3, "every release's layout is checked: {releases:?}");
}

#[test]
fn replay_layout_follows_the_release() {
    assert!(!WireVersion::parse_sglang("0.5.19").unwrap().replay_has_topic());
    assert!(WireVersion::parse_sglang("0.5.22").unwrap().replay_has_topic());
    assert_eq!(WireVersion::parse_sglang("0.5.5"), None, "no reproducible ids before 0.5.6");
}
