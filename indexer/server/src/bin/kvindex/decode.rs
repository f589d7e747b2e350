//! `kvindex decode`: captured ZeroMQ messages in, the decoder's normalized view out.
//!
//! Operators use it to see exactly what an engine publishes; the test suite uses it to hold
//! the decoder to the vectors captured from vLLM and SGLang. Input is JSON Lines with
//! `frames_hex` (and, when known, `kind`: live/replay or `socket`: SUB/DEALER, and `engine`,
//! which overrides `--engine` for its line); output is one JSON line per input line in the
//! vectors' `expect` schema. A bad line yields `{"error", "reason"}` and the run goes on.

use std::io::{BufRead, Write};

use serde_json::{json, Map, Value as Json};

use kvindex::wire::{
    self, BlockRemoved, BlockStored, Engine, EngineHash, Event, OddTokens, RawMessage, ReplayReply, Value,
};

/// `kvindex decode` options.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DecodeArgs {
    /// Engine family whose encoding the frames use: vllm, sglang or trtllm (a record's own
    /// `engine` field overrides it).
    #[arg(long, default_value = "vllm", value_parser = parse_engine)]
    pub engine: Engine,
}

fn parse_engine(s: &str) -> Result<Engine, String> {
    s.parse::<Engine>().map_err(|e| e.to_string())
}

pub fn run(args: &DecodeArgs, input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let out = match decode_record(args.engine, &line) {
            Ok(v) => v,
            Err((reason, message)) => json!({"error": message, "reason": reason}),
        };
        serde_json::to_writer(&mut output, &out)?;
        output.write_all(b"\n")?;
    }
    output.flush()
}

type RecordError = (&'static str, String);

fn decode_record(default_engine: Engine, line: &str) -> Result<Json, RecordError> {
    let record: Json = serde_json::from_str(line).map_err(|e| ("json", e.to_string()))?;
    let engine = match record.get("engine").and_then(Json::as_str) {
        Some(name) => name.parse::<Engine>().map_err(|e| ("engine", e.to_string()))?,
        None => default_engine,
    };
    let frames: Vec<Vec<u8>> = record
        .get("frames_hex")
        .and_then(Json::as_array)
        .ok_or(("json", "record has no frames_hex array".to_string()))?
        .iter()
        .map(|f| {
            f.as_str().and_then(|s| hex::decode(s).ok()).ok_or(("json", "frames_hex entry is not hex".to_string()))
        })
        .collect::<Result<_, _>>()?;
    let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    if is_replay(&record, &frames) {
        match wire::parse_replay(&frames).map_err(wire_error)? {
            ReplayReply::End { topic } => Ok(json!({"end_of_replay": true, "topic": topic.map(topic_str)})),
            ReplayReply::Message(msg) => {
                let mut out = message_json(engine, &msg)?;
                out.insert("end_of_replay".into(), Json::Bool(false));
                Ok(Json::Object(out))
            }
        }
    } else {
        Ok(Json::Object(message_json(engine, &wire::parse_live(&frames).map_err(wire_error)?)?))
    }
}

fn wire_error(e: wire::WireError) -> RecordError {
    (e.reason(), e.to_string())
}

/// Replay replies come from a DEALER; without that hint, only the unambiguous layouts
/// (4 frames behind an empty delimiter, or the ≤0.25 end marker) are taken as replay.
fn is_replay(record: &Json, frames: &[&[u8]]) -> bool {
    match (record.get("kind").and_then(Json::as_str), record.get("socket").and_then(Json::as_str)) {
        (Some("replay"), _) | (_, Some("DEALER")) => true,
        (Some("live"), _) | (_, Some("SUB")) => false,
        _ => match frames {
            [d, _, _, _] => d.is_empty(),
            [d, seq, p] => d.is_empty() && *seq == wire::END_OF_REPLAY_SEQ.to_be_bytes() && p.is_empty(),
            _ => false,
        },
    }
}

fn topic_str(t: &[u8]) -> String {
    String::from_utf8_lossy(t).into_owned()
}

fn message_json(engine: Engine, msg: &RawMessage<'_>) -> Result<Map<String, Json>, RecordError> {
    let batch = wire::decode_batch_as(engine, msg.payload).map_err(wire_error)?;
    let mut out = Map::new();
    out.insert("seq".into(), json!(msg.seq));
    if let Some(epoch) = msg.epoch {
        out.insert("epoch".into(), json!(hex::encode(epoch)));
    }
    out.insert("topic".into(), json!(msg.topic.map(topic_str)));
    out.insert("ts".into(), json!(batch.ts));
    out.insert("dp_rank".into(), json!(batch.data_parallel_rank));
    let events: Vec<Json> = batch.events.iter().map(event_json).collect();
    out.insert("events".into(), Json::Array(events));
    Ok(out)
}

fn event_json(event: &Event<'_>) -> Json {
    let mut m = Map::new();
    match event {
        Event::BlockStored(s) => stored_json(s, &mut m),
        Event::BlockRemoved(r) => removed_json(r, &mut m),
        Event::AllBlocksCleared { other } => {
            m.insert("type".into(), json!("AllBlocksCleared"));
            extend_other(&mut m, other);
        }
        Event::Unknown { tag, other } => {
            // A release newer than this decoder: show what it sent, under its own tag.
            m.insert("type".into(), json!(tag));
            extend_other(&mut m, other);
        }
    }
    Json::Object(m)
}

fn stored_json(s: &BlockStored<'_>, m: &mut Map<String, Json>) {
    m.insert("type".into(), json!("BlockStored"));
    m.insert("block_hashes".into(), hashes_json(&s.block_hashes));
    m.insert("parent_block_hash".into(), s.parent_block_hash.as_ref().map_or(Json::Null, hash_json));
    let tokens = match &s.odd_token_ids {
        None => json!(s.token_ids),
        Some(OddTokens::Wide(t)) => json!(t),
        Some(OddTokens::Pairs(p)) => json!(p),
        Some(OddTokens::Mixed(v)) => Json::Array(v.iter().map(value_json).collect()),
    };
    m.insert("token_ids".into(), tokens);
    m.insert("block_size".into(), json!(s.block_size));
    m.insert("lora_id".into(), json!(s.lora_id));
    m.insert("medium".into(), json!(s.medium));
    m.insert("lora_name".into(), json!(s.lora_name));
    m.insert(
        "extra_keys".into(),
        s.extra_keys.as_ref().map_or(Json::Null, |e| Json::Array(e.iter().map(value_json).collect())),
    );
    m.insert("group_idx".into(), json!(s.group_idx));
    m.insert("kv_cache_spec_kind".into(), json!(s.kv_cache_spec_kind));
    m.insert("kv_cache_spec_sliding_window".into(), json!(s.kv_cache_spec_sliding_window));
    m.insert("locality".into(), json!(s.locality));
    m.insert("ownership".into(), json!(s.ownership));
    m.insert("session_id".into(), json!(s.session_id));
    // SGLang 0.5.19 sends its salt inside `metadata` (shown as sent, from `other`).
    if !s.other.iter().any(|(k, _)| *k == "metadata") {
        m.insert("cache_salt".into(), json!(s.cache_salt));
    }
    m.insert("lookahead_token_ids".into(), json!(s.lookahead_token_ids));
    m.insert(
        "mm_keys".into(),
        s.mm_keys.as_ref().map_or(Json::Null, |e| Json::Array(e.iter().map(value_json).collect())),
    );
    extend_other(m, &s.other);
}

fn removed_json(r: &BlockRemoved<'_>, m: &mut Map<String, Json>) {
    m.insert("type".into(), json!("BlockRemoved"));
    m.insert("block_hashes".into(), hashes_json(&r.block_hashes));
    m.insert("medium".into(), json!(r.medium));
    m.insert("group_idx".into(), json!(r.group_idx));
    m.insert("locality".into(), json!(r.locality));
    m.insert("ownership".into(), json!(r.ownership));
    extend_other(m, &r.other);
}

/// Fields a newer release added: shown as-is, so the output stays complete.
fn extend_other(m: &mut Map<String, Json>, other: &[(&str, Value<'_>)]) {
    for (k, v) in other {
        m.entry(k.to_string()).or_insert_with(|| value_json(v));
    }
}

fn hashes_json(hashes: &[EngineHash<'_>]) -> Json {
    Json::Array(hashes.iter().map(hash_json).collect())
}

fn hash_json(h: &EngineHash<'_>) -> Json {
    match h {
        EngineHash::Uint(v) => json!(format!("0x{v:016x}")),
        EngineHash::Int(v) => json!(v.to_string()),
        EngineHash::Bytes(b) => json!(format!("bytes:{}", hex::encode(b))),
    }
}

fn value_json(v: &Value<'_>) -> Json {
    match v {
        Value::Nil => Json::Null,
        Value::Bool(b) => json!(b),
        Value::Int(i) => {
            if let Ok(v) = i64::try_from(*i) {
                json!(v)
            } else if let Ok(v) = u64::try_from(*i) {
                json!(v)
            } else {
                json!(i.to_string())
            }
        }
        Value::Float(f) => json!(f),
        Value::Str(s) => json!(s),
        Value::Bin(b) => json!(format!("bytes:{}", hex::encode(b))),
        Value::Array(items) => Json::Array(items.iter().map(value_json).collect()),
        Value::Map(entries) => Json::Object(
            entries
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        Value::Str(s) => s.to_string(),
                        other => value_json(other).to_string(),
                    };
                    (key, value_json(v))
                })
                .collect(),
        ),
    }
}
