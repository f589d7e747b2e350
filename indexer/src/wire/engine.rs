//! Which engine family published a stream, and the few rules of its encoding that differ from
//! vLLM's: the order of the positional (array-form) event fields. Everything else (the
//! three-frame ZeroMQ stream, the `[ts, events, rank]` batch, map-form events read by name,
//! hashes of any msgpack int width) is shared, so one decoder serves every family.

use std::fmt;
use std::str::FromStr;

/// An engine family whose KV events kvindex reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Engine {
    /// vLLM 0.9+: array-form events up to 0.23, map-form from 0.24; token ids are u32s (any
    /// other shape is malformed).
    #[default]
    Vllm,
    /// SGLang: array-form events of 6, 7 or 8 slots up to 0.5.19 (the 8th a `metadata` map),
    /// map-form from 0.5.20; signed int64 hashes; token ids may be bigram pairs or (0.5.23+)
    /// past u32.
    Sglang,
    /// TensorRT-LLM 1.3+: map-form events (its array form, if any, is read like vLLM's);
    /// token ids may be hex strings (multimodal items).
    Trtllm,
}

/// Every engine, in the order `--engine` documents them.
pub const ENGINES: [Engine; 3] = [Engine::Vllm, Engine::Sglang, Engine::Trtllm];

impl Engine {
    /// The name used in configuration, pods files and `kvindex decode --engine`.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Trtllm => "trtllm",
        }
    }

    /// Field names of an array-form `BlockStored`, by position after the tag. Later releases
    /// append, so every field any release declared is named and a missing tail is `None`.
    pub(crate) fn stored_fields(self) -> &'static [&'static str] {
        match self {
            Engine::Vllm | Engine::Trtllm => &VLLM_STORED_FIELDS,
            Engine::Sglang => &SGLANG_STORED_FIELDS,
        }
    }

    /// Field names of an array-form `BlockRemoved`, by position after the tag.
    pub(crate) fn removed_fields(self) -> &'static [&'static str] {
        match self {
            Engine::Vllm | Engine::Trtllm => &VLLM_REMOVED_FIELDS,
            Engine::Sglang => &SGLANG_REMOVED_FIELDS,
        }
    }
}

const VLLM_STORED_FIELDS: [&str; 15] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
];
const VLLM_REMOVED_FIELDS: [&str; 5] = ["block_hashes", "medium", "group_idx", "locality", "ownership"];

/// SGLang's `BlockStored` (array_like msgspec struct): 0.5.6 ends at `lora_id`, 0.5.15 adds
/// `medium`, 0.5.19's `BlockStoredWithMetadata` appends a `metadata` map (`{"cache_salt"}`).
const SGLANG_STORED_FIELDS: [&str; 7] =
    ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "metadata"];
const SGLANG_REMOVED_FIELDS: [&str; 2] = ["block_hashes", "medium"];

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An engine name that is not one of [`ENGINES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine {0:?} (expected vllm, sglang or trtllm)")]
pub struct UnknownEngine(pub String);

impl FromStr for Engine {
    type Err = UnknownEngine;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ENGINES.into_iter().find(|e| e.as_str() == s).ok_or_else(|| UnknownEngine(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for engine in ENGINES {
            assert_eq!(engine.as_str().parse::<Engine>(), Ok(engine));
        }
        assert!("SGLang".parse::<Engine>().is_err());
    }
}
