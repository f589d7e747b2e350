//! Byte-exact msgpack encoding of a step's events as vLLM's `KVEventBatch`.
//!
//! vLLM encodes with msgspec; a consumer may depend on any detail of those bytes, so the
//! simulator reproduces them, header widths included (checked against vLLM's own captures in
//! `testdata/vllm-vectors`). The batch is always `[ts, events, data_parallel_rank]`. Events are maps
//! from vLLM 0.24 on (`omit_defaults`: keys whose value is their `None` default are left out,
//! and BlockStored always gets a map16 header because it declares more than 15 fields) and
//! fixed-length arrays with the tag first up to 0.23 (every declared field present).
//!
//! `--engine sglang` speaks SGLang's layout instead (checked against SGLang's own captures in
//! `testdata/sglang-vectors`): the batch is `[ts, events, attn_dp_rank]`; events are maps from
//! 0.5.20 (`omit_defaults`: `cache_salt`, `session_id`, `lora_name` left out when `None`;
//! `parent_block_hash` and `lora_id` always present) and arrays of the declared fields before
//! (`medium` from 0.5.15); hashes are signed int64 (negative ids as msgpack ints).

use kvindex::sglang::SglangRelease;
use rmp::encode as mp;

use crate::engine::KvEvent;

/// Which engine release's event layout to speak (`--engine`, `--wire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireVersion {
    /// vLLM 0.33: map-form events; replay replies carry the topic frame.
    #[default]
    V0_33,
    /// vLLM 0.23: the last array-form release; replay replies have no topic frame.
    V0_23,
    /// An SGLang release: its layout follows [`SglangRelease`]'s rules.
    Sglang(SglangRelease),
}

impl WireVersion {
    /// A vLLM release's layout.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "0.33" | "0.33.0" => Some(WireVersion::V0_33),
            "0.23" | "0.23.0" => Some(WireVersion::V0_23),
            _ => None,
        }
    }

    /// An SGLang release's layout (0.5.6 or later: earlier ones hash with Python's `hash()`).
    pub fn parse_sglang(text: &str) -> Option<Self> {
        let release: SglangRelease = text.parse().ok()?;
        release.hash_reproducible().then_some(WireVersion::Sglang(release))
    }

    /// Replay replies carry the topic frame from vLLM 0.26 and SGLang 0.5.22 on.
    pub fn replay_has_topic(self) -> bool {
        match self {
            WireVersion::V0_33 => true,
            WireVersion::V0_23 => false,
            WireVersion::Sglang(release) => release.replay_topic_frame(),
        }
    }
}

/// The storage tier of every simulated block (`MEDIUM_GPU`).
const MEDIUM: &str = "GPU";
/// KV-cache group of an ordinary (non-hybrid) model.
const GROUP_IDX: u64 = 0;

/// Writing into a `Vec<u8>` cannot fail; this keeps the encoder free of unwraps.
fn ok<T, E>(_: Result<T, E>) {}

/// msgspec writes a map16 header whenever the struct declares 16 or more fields, whatever
/// the number of entries actually present.
fn write_map16_len(buf: &mut Vec<u8>, len: u16) {
    buf.push(0xde);
    buf.extend_from_slice(&len.to_be_bytes());
}

fn write_hashes(buf: &mut Vec<u8>, hashes: &[u64]) {
    ok(mp::write_array_len(buf, hashes.len() as u32));
    for &hash in hashes {
        ok(mp::write_uint(buf, hash));
    }
}

fn write_tokens(buf: &mut Vec<u8>, tokens: &[u32]) {
    ok(mp::write_array_len(buf, tokens.len() as u32));
    for &token in tokens {
        ok(mp::write_uint(buf, u64::from(token)));
    }
}

fn write_optional_hash(buf: &mut Vec<u8>, hash: Option<u64>) {
    match hash {
        Some(hash) => ok(mp::write_uint(buf, hash)),
        None => ok(mp::write_nil(buf)),
    }
}

/// `extra_keys`: one `None` per block (vLLM sends the list, since a list of Nones is truthy).
fn write_no_extra_keys(buf: &mut Vec<u8>, blocks: usize) {
    ok(mp::write_array_len(buf, blocks as u32));
    for _ in 0..blocks {
        ok(mp::write_nil(buf));
    }
}

/// SGLang's ids are int64: the simulator's u64 hashes are published as their two's-complement
/// value, so negative ids appear as SGLang's do.
fn write_signed_hashes(buf: &mut Vec<u8>, hashes: &[u64]) {
    ok(mp::write_array_len(buf, hashes.len() as u32));
    for &hash in hashes {
        ok(mp::write_sint(buf, hash as i64));
    }
}

fn write_sglang_event(buf: &mut Vec<u8>, release: SglangRelease, event: &KvEvent) {
    let map = release.map_events();
    let medium = release.publishes_medium();
    match event {
        KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size } => {
            if map {
                ok(mp::write_map_len(buf, 7));
                ok(mp::write_str(buf, "type"));
                ok(mp::write_str(buf, "BlockStored"));
                ok(mp::write_str(buf, "block_hashes"));
            } else {
                ok(mp::write_array_len(buf, if medium { 7 } else { 6 }));
                ok(mp::write_str(buf, "BlockStored"));
            }
            write_signed_hashes(buf, block_hashes);
            if map {
                ok(mp::write_str(buf, "parent_block_hash"));
            }
            match parent_block_hash {
                Some(hash) => ok(mp::write_sint(buf, *hash as i64)),
                None => ok(mp::write_nil(buf)),
            }
            if map {
                ok(mp::write_str(buf, "token_ids"));
            }
            write_tokens(buf, token_ids);
            if map {
                ok(mp::write_str(buf, "block_size"));
            }
            ok(mp::write_uint(buf, u64::from(*block_size)));
            if map {
                ok(mp::write_str(buf, "lora_id"));
            }
            ok(mp::write_nil(buf));
            if map {
                ok(mp::write_str(buf, "medium"));
            }
            if map || medium {
                ok(mp::write_str(buf, MEDIUM));
            }
        }
        KvEvent::BlockRemoved { block_hashes } => {
            if map {
                ok(mp::write_map_len(buf, 3));
                ok(mp::write_str(buf, "type"));
                ok(mp::write_str(buf, "BlockRemoved"));
                ok(mp::write_str(buf, "block_hashes"));
            } else {
                ok(mp::write_array_len(buf, if medium { 3 } else { 2 }));
                ok(mp::write_str(buf, "BlockRemoved"));
            }
            write_signed_hashes(buf, block_hashes);
            if map {
                ok(mp::write_str(buf, "medium"));
            }
            if map || medium {
                ok(mp::write_str(buf, MEDIUM));
            }
        }
        KvEvent::AllBlocksCleared => {
            if map {
                ok(mp::write_map_len(buf, 1));
                ok(mp::write_str(buf, "type"));
            } else {
                ok(mp::write_array_len(buf, 1));
            }
            ok(mp::write_str(buf, "AllBlocksCleared"));
        }
    }
}

fn write_event(buf: &mut Vec<u8>, version: WireVersion, event: &KvEvent) {
    match (version, event) {
        (WireVersion::Sglang(release), event) => write_sglang_event(buf, release, event),
        (WireVersion::V0_33, KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size }) => {
            write_map16_len(buf, 10);
            ok(mp::write_str(buf, "type"));
            ok(mp::write_str(buf, "BlockStored"));
            ok(mp::write_str(buf, "block_hashes"));
            write_hashes(buf, block_hashes);
            ok(mp::write_str(buf, "parent_block_hash"));
            write_optional_hash(buf, *parent_block_hash);
            ok(mp::write_str(buf, "token_ids"));
            write_tokens(buf, token_ids);
            ok(mp::write_str(buf, "block_size"));
            ok(mp::write_uint(buf, u64::from(*block_size)));
            ok(mp::write_str(buf, "lora_id"));
            ok(mp::write_nil(buf));
            ok(mp::write_str(buf, "medium"));
            ok(mp::write_str(buf, MEDIUM));
            ok(mp::write_str(buf, "lora_name"));
            ok(mp::write_nil(buf));
            ok(mp::write_str(buf, "extra_keys"));
            write_no_extra_keys(buf, block_hashes.len());
            ok(mp::write_str(buf, "group_idx"));
            ok(mp::write_uint(buf, GROUP_IDX));
        }
        (WireVersion::V0_33, KvEvent::BlockRemoved { block_hashes }) => {
            ok(mp::write_map_len(buf, 4));
            ok(mp::write_str(buf, "type"));
            ok(mp::write_str(buf, "BlockRemoved"));
            ok(mp::write_str(buf, "block_hashes"));
            write_hashes(buf, block_hashes);
            ok(mp::write_str(buf, "medium"));
            ok(mp::write_str(buf, MEDIUM));
            ok(mp::write_str(buf, "group_idx"));
            ok(mp::write_uint(buf, GROUP_IDX));
        }
        (WireVersion::V0_33, KvEvent::AllBlocksCleared) => {
            ok(mp::write_map_len(buf, 1));
            ok(mp::write_str(buf, "type"));
            ok(mp::write_str(buf, "AllBlocksCleared"));
        }
        (WireVersion::V0_23, KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size }) => {
            // tag + hashes, parent, token_ids, block_size, lora_id, medium, lora_name,
            // extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window
            ok(mp::write_array_len(buf, 12));
            ok(mp::write_str(buf, "BlockStored"));
            write_hashes(buf, block_hashes);
            write_optional_hash(buf, *parent_block_hash);
            write_tokens(buf, token_ids);
            ok(mp::write_uint(buf, u64::from(*block_size)));
            ok(mp::write_nil(buf));
            ok(mp::write_str(buf, MEDIUM));
            ok(mp::write_nil(buf));
            write_no_extra_keys(buf, block_hashes.len());
            ok(mp::write_uint(buf, GROUP_IDX));
            ok(mp::write_nil(buf));
            ok(mp::write_nil(buf));
        }
        (WireVersion::V0_23, KvEvent::BlockRemoved { block_hashes }) => {
            ok(mp::write_array_len(buf, 4));
            ok(mp::write_str(buf, "BlockRemoved"));
            write_hashes(buf, block_hashes);
            ok(mp::write_str(buf, MEDIUM));
            ok(mp::write_uint(buf, GROUP_IDX));
        }
        (WireVersion::V0_23, KvEvent::AllBlocksCleared) => {
            ok(mp::write_array_len(buf, 1));
            ok(mp::write_str(buf, "AllBlocksCleared"));
        }
    }
}

/// The payload frame of one published batch.
pub fn encode_batch(version: WireVersion, ts: f64, events: &[KvEvent], data_parallel_rank: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64 + events.len() * 96);
    ok(mp::write_array_len(&mut buf, 3));
    ok(mp::write_f64(&mut buf, ts));
    ok(mp::write_array_len(&mut buf, events.len() as u32));
    for event in events {
        write_event(&mut buf, version, event);
    }
    ok(mp::write_uint(&mut buf, u64::from(data_parallel_rank)));
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![0x1e0b2e028ef071cb, 0xefad121d154ab2d6],
            parent_block_hash: None,
            token_ids: (1..=8).collect(),
            block_size: 4,
        }
    }

    // Captures documented in docs/reference/vllm-kv-events.md §5 (B0 and B3).
    #[test]
    fn matches_vllm_0_33_capture() {
        let b0 = "93cb41d954fc4020000091de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf1e0b2e028ef071cbcfefad121d154ab2d6b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f6964780000";
        assert_eq!(hex(&encode_batch(WireVersion::V0_33, 1700000000.5, &[stored()], 0)), b0);
        let b3 = "93cb41d954fc40e000009181a474797065b0416c6c426c6f636b73436c656172656400";
        assert_eq!(hex(&encode_batch(WireVersion::V0_33, 1700000003.5, &[KvEvent::AllBlocksCleared], 0)), b3);
    }

    #[test]
    fn matches_vllm_0_23_capture() {
        let b0 = "93cb41d954fc40200000919cab426c6f636b53746f72656492cf1e0b2e028ef071cbcfefad121d154ab2d6c098010203040506070804c0a3475055c092c0c000c0c000";
        assert_eq!(hex(&encode_batch(WireVersion::V0_23, 1700000000.5, &[stored()], 0)), b0);
        let b2 = "93cb41d954fc40a000009294ac426c6f636b52656d6f76656491cfdaed446d95c926b2a34750550094ac426c6f636b52656d6f76656492cf1e0b2e028ef071cbcfefad121d154ab2d6a34750550000";
        let removed = [
            KvEvent::BlockRemoved { block_hashes: vec![0xdaed446d95c926b2] },
            KvEvent::BlockRemoved { block_hashes: vec![0x1e0b2e028ef071cb, 0xefad121d154ab2d6] },
        ];
        assert_eq!(hex(&encode_batch(WireVersion::V0_23, 1700000002.5, &removed, 0)), b2);
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
