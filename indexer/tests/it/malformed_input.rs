//! Malformed input never panics and never corrupts what is indexed: truncated msgpack, wrong
//! types, huge declared lengths, unknown tags, empty batches, deep nesting and random damage to
//! real vLLM payloads give an error (nothing applied) or a skip (only the valid events apply).

use crate::support;

use kvindex::wire::{self, Event, WireError};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use proptest::prelude::*;

use crate::support::{frame_files, frames_of, read_records};

/// Every live payload of the public vectors.
fn real_payloads() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for path in frame_files() {
        for r in read_records(&path).iter().filter(|r| r["kind"] == "live") {
            out.push(frames_of(r).remove(2));
        }
    }
    out
}

/// An index holding the 0.33.0 main scenario's first stores, and a probe of its state.
fn seeded() -> (KvIndex, Vec<Vec<u32>>) {
    let index = KvIndex::new(KvIndexConfig { block_size: 16, ..Default::default() });
    let mut prompts = Vec::new();
    let path = support::vectors_dir().join("frames-0.33.0.jsonl");
    for r in read_records(&path).iter().filter(|r| r["kind"] == "live" && r["scenario"] == "main").take(2) {
        let payload = frames_of(r).remove(2);
        let batch = wire::decode_batch(&payload).unwrap();
        for e in &batch.events {
            if let Event::BlockStored(s) = e {
                prompts.push(s.token_ids.clone().unwrap());
            }
        }
        index.apply(POD, MODEL, &batch);
    }
    prompts.push(prompts.concat());
    (index, prompts)
}

const POD: &str = "10.0.0.7:8000";
const MODEL: &str = "Qwen/Qwen3-0.6B";

fn fingerprint(index: &KvIndex, prompts: &[Vec<u32>]) -> (u64, u64, Vec<u32>) {
    let scores = prompts
        .iter()
        .map(|p| {
            let q = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: p, pods: None };
            index.score(&q).matches.first().map_or(0, |m| m.matched_blocks)
        })
        .collect();
    (index.table().entries(), index.table().keys(), scores)
}

/// Decodes and, if the batch is valid, applies it; returns whether it decoded.
fn feed(index: &KvIndex, payload: &[u8]) -> Result<usize, WireError> {
    let batch = wire::decode_batch(payload)?;
    index.apply(POD, MODEL, &batch);
    Ok(batch.events.len())
}

#[test]
fn every_truncation_of_every_real_payload_is_an_error_and_changes_nothing() {
    let (index, prompts) = seeded();
    let before = fingerprint(&index, &prompts);
    for payload in real_payloads() {
        for cut in 0..payload.len() {
            let err = feed(&index, &payload[..cut]).expect_err("a truncated batch never decodes");
            assert!(matches!(err, WireError::Truncated | WireError::EmptyPayload | WireError::Invalid(_)), "{err:?}");
        }
    }
    assert_eq!(fingerprint(&index, &prompts), before);
}

#[test]
fn hand_made_corpus() {
    let (index, prompts) = seeded();
    let before = fingerprint(&index, &prompts);
    let ts = "cb41d954fc40200000";
    let cases: &[(&str, &str)] = &[
        ("not an array", "a3616263"),
        ("empty array", "90"),
        ("ts only", &format!("91{ts}")),
        ("ts is a string", "93a174900000"),
        ("events is a map", &format!("93{ts}8000")),
        ("event is an int", &format!("93{ts}910100")),
        ("empty event array", &format!("93{ts}919000")),
        ("tag is an int", &format!("93{ts}91920102 00")),
        ("map event without type", &format!("93{ts}9181a16101 00")),
        ("token_ids is a string", &format!("93{ts}9193ab426c6f636b53746f7265649101a178 00")),
        ("token id negative", &format!("93{ts}9194ab426c6f636b53746f7265649101c091ff 00")),
        ("token id above u32", &format!("93{ts}9194ab426c6f636b53746f7265649101c091cf0000000100000000 00")),
        ("hash is a string", &format!("93{ts}9192ac426c6f636b52656d6f76656491a178 00")),
        ("huge array32 of events", &format!("93{ts}ddffffffff")),
        ("huge array32 of tokens", &format!("93{ts}9194ab426c6f636b53746f7265649101c0ddffffffff")),
        ("huge str32 tag", &format!("93{ts}9191dbffffffff41")),
        ("huge bin32 hash", &format!("93{ts}9192ac426c6f636b52656d6f76656491c6ffffffff00")),
        ("huge map32 event", &format!("93{ts}91dfffffffff")),
        ("deep nesting", &format!("93{ts}91{}", "91".repeat(5000))),
        ("invalid utf-8 tag", &format!("93{ts}9191a2ffff 00")),
        ("ext type", &format!("93{ts}91d40100 00")),
        ("reserved marker", &format!("93{ts}91c1 00")),
    ];
    for (name, hex) in cases {
        let bytes = hex::decode(hex.replace(' ', "")).unwrap();
        let result = feed(&index, &bytes);
        assert!(result.is_err(), "{name}: expected an error, got {result:?}");
    }
    assert_eq!(fingerprint(&index, &prompts), before, "errors apply nothing");

    // Skips: an empty batch and unknown tags decode; only the valid events apply.
    assert_eq!(feed(&index, &hex::decode(format!("93{ts}9000")).unwrap()), Ok(0));
    let unknown_then_clear =
        format!("93{ts}92 93aa426c6f636b4d6f7665640102 81a474797065a54f74686572 00").replace(' ', "");
    let batch_bytes = hex::decode(&unknown_then_clear).unwrap();
    let batch = wire::decode_batch(&batch_bytes).unwrap();
    assert_eq!(batch.unknown_events(), 2);
    let report = index.apply(POD, MODEL, &batch);
    assert_eq!(report.unknown_events, 2);
    assert_eq!(fingerprint(&index, &prompts), before, "unknown events change nothing");

    // An unknown map-form event whose fields have types our known events would reject is still
    // only skipped: the tag comes first, so its fields are read generically.
    let odd = hex::decode("93cb3ff80000000000009282a474797065aa426c6f636b4d6f766564a66d656469756d0581a474797065b0416c6c426c6f636b73436c656172656400").unwrap();
    let batch = wire::decode_batch(&odd).expect("decodes");
    assert_eq!(batch.unknown_events(), 1);
    assert!(matches!(batch.events[1], Event::AllBlocksCleared { .. }));
}

#[test]
fn frame_level_damage_is_typed() {
    assert_eq!(wire::parse_live(&[b"t", b"12345678"]).unwrap_err().reason(), "frame_count");
    assert_eq!(wire::parse_live(&[b"t", b"1234567", b"x"]).unwrap_err().reason(), "seq_length");
    assert_eq!(wire::parse_replay(&[b"x", b"12345678", b"p"]).unwrap_err().reason(), "replay_delimiter");
    assert_eq!(wire::parse_replay(&[b""]).unwrap_err().reason(), "frame_count");
    assert_eq!(wire::decode_batch(b"").unwrap_err().reason(), "empty_payload");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Random byte damage to real payloads: decode never panics; a failed decode applies nothing.
    #[test]
    fn random_damage_never_panics_or_corrupts(
        which in 0usize..1000,
        flips in prop::collection::vec((0usize..4096, any::<u8>()), 1..6),
    ) {
        let payloads = real_payloads_cached();
        let mut payload = payloads[which % payloads.len()].clone();
        for (pos, byte) in flips {
            let len = payload.len();
            payload[pos % len] = byte;
        }
        let (index, prompts) = seeded();
        let before = fingerprint(&index, &prompts);
        if feed(&index, &payload).is_err() {
            prop_assert_eq!(fingerprint(&index, &prompts), before);
        }
    }
}

fn real_payloads_cached() -> &'static [Vec<u8>] {
    static CACHE: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    CACHE.get_or_init(real_payloads)
}
