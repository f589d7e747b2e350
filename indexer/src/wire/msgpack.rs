//! msgpack payloads into [`EventBatch`]es, in one pass over the bytes.
//!
//! One decoder covers every vLLM release from 0.9 on, and SGLang and TensorRT-LLM, by following
//! the format's rules rather than per-version tables: the batch is an array of 2 or more
//! elements, each event is either an array whose first element is the tag (vLLM up to 0.23,
//! SGLang up to 0.5.19) or a map with a `"type"` key, fields are read by position (in the
//! engine's order, see [`Engine`]) or by name, missing trailing positions and keys are `None`,
//! extra positions are ignored and extra keys are kept aside. Hashes may be any msgpack int
//! (including negative `builtin` and SGLang hashes) or `bin`. Token ids are u32s, or (kept
//! apart as [`OddTokens`]) wider ids, bigram pairs or mixed values. Payloads are borrowed, not
//! copied, so the ingest path allocates only for the token-id and hash lists.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::engine::Engine;
use super::error::WireError;
use super::event::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch, OddTokens, Value};
use super::limits::{MAX_DEPTH, MAX_PREALLOC};

/// Decodes a vLLM `KVEventBatch` payload.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch<'_>, WireError> {
    decode_batch_as(Engine::Vllm, payload)
}

/// Decodes a `KVEventBatch` payload of `engine`'s family.
pub fn decode_batch_as(engine: Engine, payload: &[u8]) -> Result<EventBatch<'_>, WireError> {
    if payload.is_empty() {
        return Err(WireError::EmptyPayload);
    }
    let mut de = rmp_serde::Deserializer::from_read_ref(payload);
    de.set_max_depth(MAX_DEPTH);
    Ok(de.deserialize_any(BatchVisitor(engine))?)
}

// ---- serde visitors -------------------------------------------------------------------------
// Hand-written so that one pass accepts both event encodings, any int width, and borrows
// strings and byte strings from the payload.

struct BatchVisitor(Engine);

impl<'de> Visitor<'de> for BatchVisitor {
    type Value = EventBatch<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event batch array [ts, events, data_parallel_rank]")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let ts: Number = seq.next_element()?.ok_or_else(|| de::Error::custom("batch array is empty"))?;
        let events = seq
            .next_element_seed(EventList(self.0))?
            .ok_or_else(|| de::Error::custom("batch array has no events element"))?;
        let data_parallel_rank = seq.next_element::<Option<i64>>()?.flatten();
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(EventBatch { ts: ts.0, events, data_parallel_rank })
    }
}

/// A float or int, as f64.
struct Number(f64);

impl<'de> de::Deserialize<'de> for Number {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_f64<E>(self, v: f64) -> Result<Number, E> {
                Ok(Number(v))
            }
            fn visit_f32<E>(self, v: f32) -> Result<Number, E> {
                Ok(Number(f64::from(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
        }
        d.deserialize_any(V)
    }
}

/// The events element of a batch, decoded in `engine`'s field order.
struct EventList(Engine);

impl<'de> DeserializeSeed<'de> for EventList {
    type Value = Vec<Event<'de>>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EventList {
    type Value = Vec<Event<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut events = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_PREALLOC));
        while let Some(event) = seq.next_element_seed(EventVisitor(self.0))? {
            events.push(event);
        }
        Ok(events)
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Stored,
    Removed,
    Cleared,
}

fn kind_of(tag: &str) -> Option<Kind> {
    match tag {
        "BlockStored" => Some(Kind::Stored),
        "BlockRemoved" => Some(Kind::Removed),
        "AllBlocksCleared" => Some(Kind::Cleared),
        _ => None,
    }
}

/// Fields gathered from either encoding before the event type is known (a map may, in
/// principle, carry `"type"` after other keys).
#[derive(Default)]
struct Fields<'de> {
    engine: Engine,
    stored: BlockStored<'de>,
}

impl<'de> Fields<'de> {
    /// Reads one named field. Unknown names are kept in `other`.
    fn read<E: de::Error>(
        &mut self,
        name: &'de str,
        next: impl FnOnce(FieldSlot<'_, 'de>) -> Result<(), E>,
    ) -> Result<(), E> {
        let engine = self.engine;
        let s = &mut self.stored;
        let slot = match name {
            "block_hashes" => FieldSlot::Hashes(&mut s.block_hashes),
            "parent_block_hash" => FieldSlot::OptHash(&mut s.parent_block_hash),
            "token_ids" => FieldSlot::Tokens(engine, &mut s.token_ids, &mut s.odd_token_ids),
            "block_size" => FieldSlot::Int(&mut s.block_size),
            "lora_id" => FieldSlot::Int(&mut s.lora_id),
            "medium" => FieldSlot::Str(&mut s.medium),
            "lora_name" => FieldSlot::Str(&mut s.lora_name),
            "extra_keys" => FieldSlot::Extra(&mut s.extra_keys),
            "group_idx" => FieldSlot::Int(&mut s.group_idx),
            "kv_cache_spec_kind" => FieldSlot::Str(&mut s.kv_cache_spec_kind),
            "kv_cache_spec_sliding_window" => FieldSlot::Int(&mut s.kv_cache_spec_sliding_window),
            "locality" => FieldSlot::Str(&mut s.locality),
            "ownership" => FieldSlot::Str(&mut s.ownership),
            "session_id" => FieldSlot::Str(&mut s.session_id),
            "cache_salt" => FieldSlot::Str(&mut s.cache_salt),
            "metadata" => FieldSlot::Metadata(&mut s.cache_salt, &mut s.other),
            "lookahead_token_ids" => FieldSlot::TokenLists(&mut s.lookahead_token_ids),
            "mm_keys" => FieldSlot::Extra(&mut s.mm_keys),
            _ => FieldSlot::Other(name, &mut s.other),
        };
        next(slot)
    }

    fn finish(self, kind: Kind) -> Event<'de> {
        let s = self.stored;
        match kind {
            Kind::Stored => Event::BlockStored(s),
            Kind::Removed => {
                // Keys only BlockStored declares would be unknown for a removal: keep them visible.
                Event::BlockRemoved(BlockRemoved {
                    block_hashes: s.block_hashes,
                    medium: s.medium,
                    group_idx: s.group_idx,
                    locality: s.locality,
                    ownership: s.ownership,
                    other: s.other,
                })
            }
            Kind::Cleared => Event::AllBlocksCleared { other: s.other },
        }
    }
}

/// Where one decoded field goes; decides the type it must have.
enum FieldSlot<'s, 'de> {
    Hashes(&'s mut Vec<EngineHash<'de>>),
    OptHash(&'s mut Option<EngineHash<'de>>),
    /// vLLM's ids are u32s (anything else is malformed); other engines' may take other shapes.
    Tokens(Engine, &'s mut Option<Vec<u32>>, &'s mut Option<OddTokens<'de>>),
    TokenLists(&'s mut Option<Vec<Vec<u32>>>),
    Int(&'s mut Option<i64>),
    Str(&'s mut Option<&'de str>),
    Extra(&'s mut Option<Vec<Value<'de>>>),
    /// SGLang 0.5.19's `metadata` map: its `cache_salt` is read, the map kept as sent.
    Metadata(&'s mut Option<&'de str>, &'s mut Vec<(&'de str, Value<'de>)>),
    Other(&'de str, &'s mut Vec<(&'de str, Value<'de>)>),
}

impl<'de> DeserializeSeed<'de> for FieldSlot<'_, 'de> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self {
            FieldSlot::Hashes(out) => *out = Option::<HashList>::deserialize(d)?.map(|h| h.0).unwrap_or_default(),
            FieldSlot::OptHash(out) => *out = Option::<EngineHashDe>::deserialize(d)?.map(|h| h.0),
            FieldSlot::Tokens(Engine::Vllm, out, _) => *out = Option::<TokenList>::deserialize(d)?.map(|t| t.0),
            FieldSlot::Tokens(_, out, odd) => match Option::<AnyTokens>::deserialize(d)? {
                None => *out = None,
                Some(AnyTokens::Plain(t)) => *out = Some(t),
                Some(AnyTokens::Odd(t)) => {
                    *out = None;
                    *odd = Some(t);
                }
            },
            FieldSlot::TokenLists(out) => {
                *out = Option::<Vec<TokenList>>::deserialize(d)?.map(|lists| lists.into_iter().map(|t| t.0).collect())
            }
            FieldSlot::Int(out) => *out = Option::<i64>::deserialize(d)?,
            FieldSlot::Str(out) => *out = Option::<&'de str>::deserialize(d)?,
            FieldSlot::Extra(out) => {
                *out = match Value::deserialize(d)? {
                    Value::Nil => None,
                    Value::Array(items) => Some(items),
                    _ => return Err(de::Error::custom("extra_keys and mm_keys must be an array or nil")),
                }
            }
            FieldSlot::Metadata(salt, out) => {
                let value = Value::deserialize(d)?;
                match &value {
                    Value::Nil => {}
                    Value::Map(entries) => {
                        for (k, v) in entries {
                            if let (Value::Str("cache_salt"), Value::Str(s)) = (k, v) {
                                *salt = Some(s);
                            }
                        }
                    }
                    _ => return Err(de::Error::custom("metadata must be a map or nil")),
                }
                out.push(("metadata", value));
            }
            FieldSlot::Other(name, out) => out.push((name, Value::deserialize(d)?)),
        }
        Ok(())
    }
}

impl<'de> de::Deserialize<'de> for Event<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EventVisitor(Engine::Vllm))
    }
}

/// One event, its array form read in the engine's field order.
#[derive(Clone, Copy)]
struct EventVisitor(Engine);

impl<'de> DeserializeSeed<'de> for EventVisitor {
    type Value = Event<'de>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EventVisitor {
    type Value = Event<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event: [tag, fields...] or {\"type\": tag, ...}")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let tag: &'de str = seq.next_element()?.ok_or_else(|| de::Error::custom("event array is empty"))?;
        let Some(kind) = kind_of(tag) else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(Event::Unknown { tag, other: Vec::new() });
        };
        let names: &[&'static str] = match kind {
            Kind::Stored => self.0.stored_fields(),
            Kind::Removed => self.0.removed_fields(),
            Kind::Cleared => &[],
        };
        let mut fields = Fields { engine: self.0, ..Fields::default() };
        for &name in names {
            let mut present = true;
            fields.read(name, |slot| {
                present = seq.next_element_seed(slot)?.is_some();
                Ok::<(), A::Error>(())
            })?;
            if !present {
                break;
            }
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(fields.finish(kind))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Fields { engine: self.0, ..Fields::default() };
        let mut tag: Option<&'de str> = None;
        // msgspec writes the tag first; knowing it before the fields lets an unknown event be
        // read generically, so a field type we do not expect there cannot fail the batch.
        if let Some(key) = map.next_key::<&'de str>()? {
            if key == "type" {
                let t: &'de str = map.next_value()?;
                if kind_of(t).is_none() {
                    while let Some((k, v)) = map.next_entry::<&'de str, Value<'de>>()? {
                        fields.stored.other.push((k, v));
                    }
                    return Ok(Event::Unknown { tag: t, other: fields.stored.other });
                }
                tag = Some(t);
            } else {
                fields.read(key, |slot| map.next_value_seed(slot))?;
            }
        }
        while let Some(key) = map.next_key::<&'de str>()? {
            if key == "type" {
                tag = Some(map.next_value()?);
            } else {
                fields.read(key, |slot| map.next_value_seed(slot))?;
            }
        }
        let tag = tag.ok_or_else(|| de::Error::custom("event map has no \"type\" key"))?;
        Ok(match kind_of(tag) {
            Some(kind) => fields.finish(kind),
            None => Event::Unknown { tag, other: fields.stored.other },
        })
    }
}

struct HashList<'de>(Vec<EngineHash<'de>>);

impl<'de> de::Deserialize<'de> for HashList<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = HashList<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of block hashes")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_PREALLOC));
                while let Some(h) = seq.next_element::<EngineHashDe>()? {
                    out.push(h.0);
                }
                Ok(HashList(out))
            }
        }
        d.deserialize_any(V)
    }
}

struct EngineHashDe<'de>(EngineHash<'de>);

impl<'de> de::Deserialize<'de> for EngineHashDe<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EngineHashDe<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a block hash (int or bin)")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(EngineHashDe(EngineHash::Uint(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(EngineHashDe(if v >= 0 { EngineHash::Uint(v as u64) } else { EngineHash::Int(v) }))
            }
            fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Self::Value, E> {
                Ok(EngineHashDe(EngineHash::Bytes(v)))
            }
        }
        d.deserialize_any(V)
    }
}

struct TokenList(Vec<u32>);

impl<'de> de::Deserialize<'de> for TokenList {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TokenList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of token ids (u32)")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_PREALLOC * 4));
                while let Some(t) = seq.next_element::<u32>()? {
                    out.push(t);
                }
                Ok(TokenList(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A `token_ids` list: u32s (the fast path every vLLM release takes), or, from the first
/// element that is not one, the odd shape the whole list then has.
enum AnyTokens<'de> {
    Plain(Vec<u32>),
    Odd(OddTokens<'de>),
}

/// One element of a token list before its list's shape is known.
enum TokenItem<'de> {
    Id(u64),
    Pair([u64; 2]),
    Other(Value<'de>),
}

impl<'de> de::Deserialize<'de> for TokenItem<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Ids are read without building a `Value`: this is the per-token hot path.
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TokenItem<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a token id")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(TokenItem::Id(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(u64::try_from(v).map_or(TokenItem::Other(Value::Int(i128::from(v))), TokenItem::Id))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
                Ok(TokenItem::Other(Value::Float(v)))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
                Ok(TokenItem::Other(Value::Bool(v)))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(TokenItem::Other(Value::Nil))
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(TokenItem::Other(Value::Nil))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(TokenItem::Other(Value::Str(v)))
            }
            fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Self::Value, E> {
                Ok(TokenItem::Other(Value::Bin(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_PREALLOC));
                while let Some(v) = seq.next_element::<Value<'de>>()? {
                    items.push(v);
                }
                let id = |v: &Value<'_>| match *v {
                    Value::Int(i) => u64::try_from(i).ok(),
                    _ => None,
                };
                Ok(match items.as_slice() {
                    [a, b] if id(a).is_some() && id(b).is_some() => {
                        TokenItem::Pair([id(a).unwrap_or(0), id(b).unwrap_or(0)])
                    }
                    _ => TokenItem::Other(Value::Array(items)),
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(MAX_PREALLOC));
                while let Some(entry) = map.next_entry()? {
                    out.push(entry);
                }
                Ok(TokenItem::Other(Value::Map(out)))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> de::Deserialize<'de> for AnyTokens<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AnyTokens<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of token ids")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut plain = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_PREALLOC * 4));
                let first_odd = loop {
                    match seq.next_element::<TokenItem<'de>>()? {
                        None => return Ok(AnyTokens::Plain(plain)),
                        Some(TokenItem::Id(t)) if t <= u64::from(u32::MAX) => plain.push(t as u32),
                        Some(item) => break item,
                    }
                };
                // The rest of the list decides the shape: all ids, all pairs, or mixed.
                let mut items: Vec<TokenItem<'de>> = plain.drain(..).map(|t| TokenItem::Id(u64::from(t))).collect();
                items.push(first_odd);
                while let Some(item) = seq.next_element::<TokenItem<'de>>()? {
                    items.push(item);
                }
                Ok(AnyTokens::Odd(odd_tokens(items)))
            }
        }
        d.deserialize_any(V)
    }
}

fn odd_tokens(items: Vec<TokenItem<'_>>) -> OddTokens<'_> {
    if items.iter().all(|i| matches!(i, TokenItem::Id(_))) {
        return OddTokens::Wide(items.into_iter().map(|i| if let TokenItem::Id(t) = i { t } else { 0 }).collect());
    }
    if items.iter().all(|i| matches!(i, TokenItem::Pair(_))) {
        return OddTokens::Pairs(
            items.into_iter().map(|i| if let TokenItem::Pair(p) = i { p } else { [0; 2] }).collect(),
        );
    }
    OddTokens::Mixed(
        items
            .into_iter()
            .map(|i| match i {
                TokenItem::Id(t) => Value::Int(i128::from(t)),
                TokenItem::Pair([a, b]) => Value::Array(vec![Value::Int(i128::from(a)), Value::Int(i128::from(b))]),
                TokenItem::Other(v) => v,
            })
            .collect(),
    )
}

impl<'de> de::Deserialize<'de> for Value<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Value<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any msgpack value")
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Value::Nil)
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Value::Nil)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
                Ok(Value::Bool(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Value::Int(i128::from(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Value::Int(i128::from(v)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Value::Float(v))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Value::Str(v))
            }
            fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Self::Value, E> {
                Ok(Value::Bin(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_PREALLOC));
                while let Some(v) = seq.next_element()? {
                    out.push(v);
                }
                Ok(Value::Array(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(MAX_PREALLOC));
                while let Some(entry) = map.next_entry()? {
                    out.push(entry);
                }
                Ok(Value::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl From<rmp_serde::decode::Error> for WireError {
    fn from(err: rmp_serde::decode::Error) -> Self {
        use rmp_serde::decode::Error as E;
        match err {
            E::InvalidMarkerRead(e) | E::InvalidDataRead(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                WireError::Truncated
            }
            E::DepthLimitExceeded => WireError::TooDeep,
            E::TypeMismatch(marker) => WireError::Invalid(format!("unexpected msgpack {marker:?}")),
            other => WireError::Invalid(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        hex::decode(s).expect("test hex")
    }

    // The worked examples of the wire-format notes (vllm-kv-events.md, "Captured frames").
    const B0_023: &str = "93cb41d954fc40200000919cab426c6f636b53746f72656492cf1e0b2e028ef071cbcfefad121d154ab2d6c098010203040506070804c0a3475055c092c0c000c0c000";
    const B2_033: &str = "93cb41d954fc40a000009284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfdaed446d95c926b2a66d656469756da3475055a967726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657392cf1e0b2e028ef071cbcfefad121d154ab2d6a66d656469756da3475055a967726f75705f6964780000";
    const B0_090: &str = "92cb41d954fc402000009196ab426c6f636b53746f72656492cf1111111111111111cf2222222222222222c098010203040506070804c0";

    #[test]
    fn array_form_store_decodes_every_field() {
        let payload = hex(B0_023);
        let batch = decode_batch(&payload).unwrap();
        assert_eq!(batch.ts, 1700000000.5);
        assert_eq!(batch.data_parallel_rank, Some(0));
        let [Event::BlockStored(s)] = batch.events.as_slice() else { panic!("{batch:?}") };
        assert_eq!(s.block_hashes, [EngineHash::Uint(0x1e0b2e028ef071cb), EngineHash::Uint(0xefad121d154ab2d6)]);
        assert_eq!(s.token_ids.as_deref(), Some(&[1, 2, 3, 4, 5, 6, 7, 8][..]));
        assert_eq!(s.block_size, Some(4));
        assert_eq!(s.medium, Some("GPU"));
        assert_eq!(s.extra_keys, Some(vec![Value::Nil, Value::Nil]));
        assert_eq!(s.group_idx, Some(0));
    }

    #[test]
    fn map_form_removals_decode_by_name() {
        let payload = hex(B2_033);
        let batch = decode_batch(&payload).unwrap();
        assert_eq!(batch.events.len(), 2);
        let Event::BlockRemoved(r) = &batch.events[1] else { panic!() };
        assert_eq!(r.block_hashes.len(), 2);
        assert_eq!(r.medium, Some("GPU"));
        assert_eq!(r.group_idx, Some(0));
    }

    #[test]
    fn two_element_batch_has_no_rank() {
        let payload = hex(B0_090);
        let batch = decode_batch(&payload).unwrap();
        assert_eq!(batch.data_parallel_rank, None);
        let Event::BlockStored(s) = &batch.events[0] else { panic!() };
        assert_eq!(s.lora_id, None);
        assert_eq!(s.medium, None);
    }

    #[test]
    fn unknown_tag_is_skipped_and_the_rest_applies() {
        // [ts, [["BlockMoved", 1, 2], ["AllBlocksCleared"]], 0]
        let payload = hex("93cb41d954fc4020000092 93aa426c6f636b4d6f7665640102 91b0416c6c426c6f636b73436c656172656400"
            .replace(' ', "")
            .as_str());
        let batch = decode_batch(&payload).unwrap();
        assert_eq!(batch.unknown_events(), 1);
        assert!(matches!(batch.events[1], Event::AllBlocksCleared { .. }));
    }

    #[test]
    fn token_shapes_follow_the_engine() {
        // [ts, [["BlockStored", [1], nil, <tokens>]], 0]
        let store = |tokens: &str| {
            hex(&format!("93cb41d954fc4020000091 94ab426c6f636b53746f726564 9101 c0 {tokens} 00").replace(' ', ""))
        };
        let wide = store("92 01 cf0000000100000000");
        let pairs = store("92 920102 920203");
        let mixed = store("92 a461623132 05");
        for payload in [&wide, &pairs, &mixed] {
            assert!(decode_batch(payload).is_err(), "vLLM's ids are u32s: anything else is malformed");
        }
        let odd = |engine, payload| match decode_batch_as(engine, payload).unwrap().events.remove(0) {
            Event::BlockStored(s) => (s.token_ids, s.odd_token_ids),
            other => panic!("{other:?}"),
        };
        assert_eq!(odd(Engine::Sglang, &wide), (None, Some(OddTokens::Wide(vec![1, 1 << 32]))));
        assert_eq!(odd(Engine::Sglang, &pairs), (None, Some(OddTokens::Pairs(vec![[1, 2], [2, 3]]))));
        assert_eq!(
            odd(Engine::Trtllm, &mixed),
            (None, Some(OddTokens::Mixed(vec![Value::Str("ab12"), Value::Int(5)])))
        );
        assert_eq!(odd(Engine::Sglang, &store("92 01 02")), (Some(vec![1, 2]), None), "plain ids stay plain");
    }

    #[test]
    fn truncated_payload_is_a_typed_error() {
        let payload = hex(B0_023);
        for cut in 0..payload.len() {
            let err = decode_batch(&payload[..cut]).unwrap_err();
            assert!(matches!(err, WireError::Truncated | WireError::EmptyPayload), "cut {cut}: {err:?}");
        }
    }
}
