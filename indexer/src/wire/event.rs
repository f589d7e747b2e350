//! The decoded form of a `KVEventBatch`: the shared event model of every engine family
//! (vLLM, SGLang, TensorRT-LLM), borrowed from the payload. Fields a release lacks are `None`;
//! fields this decoder does not know are kept in `other`, so `kvindex decode` shows everything
//! the engine sent.

/// One `KVEventBatch`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch<'a> {
    pub ts: f64,
    pub events: Vec<Event<'a>>,
    /// `None` for vLLM 0.9.0, whose batches have no rank element.
    pub data_parallel_rank: Option<i64>,
}

impl EventBatch<'_> {
    /// Events whose tag this decoder does not know (skipped, counted by the caller).
    pub fn unknown_events(&self) -> usize {
        self.events.iter().filter(|e| matches!(e, Event::Unknown { .. })).count()
    }
}

// Stores dominate every stream and are consumed in place: boxing them would cost an
// allocation per event on the ingest path for the sake of the rarer, smaller variants.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Event<'a> {
    BlockStored(BlockStored<'a>),
    BlockRemoved(BlockRemoved<'a>),
    AllBlocksCleared {
        other: Vec<(&'a str, Value<'a>)>,
    },
    /// An event with a tag we do not know. It is skipped; the rest of the batch applies.
    Unknown {
        tag: &'a str,
        /// Its fields, when it came as a map (named); array-form fields have no names.
        other: Vec<(&'a str, Value<'a>)>,
    },
}

/// A block hash as the engine published it. The variant is kept so the decoded form can be
/// printed exactly; `key()` gives the u64 the index uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineHash<'a> {
    /// A non-negative msgpack int (every release's default, the digest's low 64 bits).
    Uint(u64),
    /// A negative msgpack int (vLLM 0.9.x `builtin` hashes).
    Int(i64),
    /// A msgpack `bin` (raw digests with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`).
    Bytes(&'a [u8]),
}

impl EngineHash<'_> {
    /// The u64 identity of the block inside its source: the int's two's-complement bits, or
    /// the last 8 bytes of a digest read big-endian (left-padded when shorter), which equals
    /// vLLM's own int conversion of the same digest.
    pub fn key(&self) -> u64 {
        match *self {
            EngineHash::Uint(v) => v,
            EngineHash::Int(v) => v as u64,
            EngineHash::Bytes(b) => {
                let tail = &b[b.len().saturating_sub(8)..];
                tail.iter().fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte))
            }
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockStored<'a> {
    pub block_hashes: Vec<EngineHash<'a>>,
    pub parent_block_hash: Option<EngineHash<'a>>,
    /// `None` when the wire had `nil`, or when the ids are not plain u32s (see
    /// `odd_token_ids`).
    pub token_ids: Option<Vec<u32>>,
    /// Token ids that are not plain u32s: SGLang's EAGLE bigram pages, ids past u32 (SGLang
    /// 0.5.23+), TensorRT-LLM's multimodal placeholders. Never keyed as a plain prefix.
    pub odd_token_ids: Option<OddTokens<'a>>,
    pub block_size: Option<i64>,
    pub lora_id: Option<i64>,
    pub medium: Option<&'a str>,
    pub lora_name: Option<&'a str>,
    /// One entry per block: `Value::Nil` or an array of extra keys.
    pub extra_keys: Option<Vec<Value<'a>>>,
    pub group_idx: Option<i64>,
    pub kv_cache_spec_kind: Option<&'a str>,
    pub kv_cache_spec_sliding_window: Option<i64>,
    pub locality: Option<&'a str>,
    pub ownership: Option<&'a str>,
    pub session_id: Option<&'a str>,
    /// The request's cache salt as the engine publishes it beside the blocks (SGLang: a
    /// `cache_salt` key from 0.5.20, the `metadata` map's `cache_salt` in 0.5.19). vLLM
    /// carries its salt in `extra_keys` instead.
    pub cache_salt: Option<&'a str>,
    pub lookahead_token_ids: Option<Vec<Vec<u32>>>,
    /// TensorRT-LLM's multimodal segments, one entry per block: `Value::Nil` or an array of
    /// `{"type": "mm_key", "hash", "start_offset", "uuid"}` maps.
    pub mm_keys: Option<Vec<Value<'a>>>,
    /// Map keys this decoder does not know, kept for diagnostics and `kvindex decode`.
    pub other: Vec<(&'a str, Value<'a>)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockRemoved<'a> {
    pub block_hashes: Vec<EngineHash<'a>>,
    pub medium: Option<&'a str>,
    pub group_idx: Option<i64>,
    pub locality: Option<&'a str>,
    pub ownership: Option<&'a str>,
    pub other: Vec<(&'a str, Value<'a>)>,
}

/// Token ids an engine published in a shape other than a list of u32s.
#[derive(Debug, Clone, PartialEq)]
pub enum OddTokens<'a> {
    /// Ids of which at least one does not fit a u32.
    Wide(Vec<u64>),
    /// SGLang's EAGLE bigram keys: `[t_i, t_{i+1}]` per position, so a page depends on the
    /// token after it.
    Pairs(Vec<[u64; 2]>),
    /// A list mixing ids with other values (TensorRT-LLM writes multimodal items as hex
    /// strings): kept as read.
    Mixed(Vec<Value<'a>>),
}

/// Any msgpack value, borrowed: the shape of `extra_keys` entries and unknown fields.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(&'a str),
    Bin(&'a [u8]),
    Array(Vec<Value<'a>>),
    Map(Vec<(Value<'a>, Value<'a>)>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        hex::decode(s).expect("test hex")
    }

    #[test]
    fn bin_hash_key_is_last_eight_bytes_big_endian() {
        let digest = hex("c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb");
        assert_eq!(EngineHash::Bytes(&digest).key(), 0x1e0b2e028ef071cb);
        assert_eq!(EngineHash::Bytes(&[0x01, 0x02]).key(), 0x0102);
        assert_eq!(EngineHash::Int(-1).key(), u64::MAX);
    }
}
