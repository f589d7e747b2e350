//! `kvindex sglang-hash`: the page ids an SGLang release publishes for a radix path, from
//! `hashes-sglang.jsonl`-shaped records.
//!
//! Operators use it to check a (release, page size, format, salt, adapter) guess against what
//! an engine published; the test suite holds [`kvindex::sglang`] to vectors made by SGLang's
//! own hash code with it. Input is JSON Lines with `version`, `page_size`, `token_ids` and
//! optionally `kv_events_format`, `is_bigram`, `segments` (node lengths; one node by default),
//! `extra_key`, `lora_name`, `cache_salt` and `case`. Output is one JSON line per input line in
//! the input's field names (`page_digests_hex`, `event_i64`, …); a path the release would
//! refuse comes back with `error` (the release's own message) and null ids; a malformed line
//! gives `{"error", "line"}`. Either way the run goes on.

use std::io::{BufRead, Write};

use serde_json::{json, Map, Value as Json};

use kvindex::sglang::{path_ids, ChainTokens, EventFormat, PathError, RadixPath, SglangRelease};

pub fn run(input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    for (n, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let out = match serde_json::from_str::<Json>(&line) {
            Ok(Json::Object(record)) => compute(&record).unwrap_or_else(|e| json!({"error": e, "line": n + 1})),
            Ok(_) => json!({"error": "record is not a JSON object", "line": n + 1}),
            Err(e) => json!({"error": format!("invalid JSON: {e}"), "line": n + 1}),
        };
        serde_json::to_writer(&mut output, &out)?;
        output.write_all(b"\n")?;
    }
    output.flush()
}

fn opt_str<'a>(record: &'a Map<String, Json>, field: &str) -> Result<Option<&'a str>, String> {
    match record.get(field) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("`{field}` must be a string or null")),
    }
}

/// `0x%016x` for non-negative ids, decimal for negative ones: how `kvindex decode` prints them.
fn id_text(id: i64) -> String {
    if id >= 0 {
        format!("0x{id:016x}")
    } else {
        id.to_string()
    }
}

fn compute(record: &Map<String, Json>) -> Result<Json, String> {
    let version = opt_str(record, "version")?.ok_or("`version` must be a string")?;
    let release: SglangRelease = version.parse().map_err(|e| format!("{e}"))?;
    let format: EventFormat = opt_str(record, "kv_events_format")?.unwrap_or("default").parse()?;
    let page_size = record
        .get("page_size")
        .and_then(Json::as_u64)
        .and_then(|p| usize::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or("`page_size` must be a positive integer")?;
    let tokens: Vec<u64> = record
        .get("token_ids")
        .and_then(Json::as_array)
        .ok_or("`token_ids` must be an array")?
        .iter()
        .map(Json::as_u64)
        .collect::<Option<_>>()
        .ok_or("`token_ids` must hold non-negative integers")?;
    let bigram = record.get("is_bigram").and_then(Json::as_bool).unwrap_or(false);
    let chain = if bigram { ChainTokens::Bigram(&tokens) } else { ChainTokens::Plain(&tokens) };
    let segments: Vec<usize> = match record.get("segments") {
        None | Some(Json::Null) => vec![chain.logical_len()],
        Some(Json::Array(s)) => s
            .iter()
            .map(|v| v.as_u64().and_then(|v| usize::try_from(v).ok()))
            .collect::<Option<_>>()
            .ok_or("`segments` must hold non-negative integers")?,
        Some(_) => return Err("`segments` must be an array".into()),
    };
    let path = RadixPath {
        release,
        format,
        page_size,
        tokens: chain,
        segments: &segments,
        extra_key: opt_str(record, "extra_key")?,
        lora_name: opt_str(record, "lora_name")?,
        cache_salt: opt_str(record, "cache_salt")?,
    };
    let mut out = Map::new();
    for echoed in ["engine", "version", "case", "kv_events_format", "page_size"] {
        if let Some(v) = record.get(echoed) {
            out.insert(echoed.into(), v.clone());
        }
    }
    let hexes = |d: &[[u8; 32]]| Json::Array(d.iter().map(|d| json!(hex::encode(d))).collect());
    let fields = ["chain_seed_hex", "page_digests_hex", "namespace_seed_hex", "event_i64_unnamespaced", "event_i64"];
    match path_ids(&path) {
        Ok(ids) => {
            out.insert("chain_seed_hex".into(), json!(ids.chain_seed.map(hex::encode)));
            out.insert("page_digests_hex".into(), hexes(&ids.page_digests));
            out.insert("namespace_seed_hex".into(), json!(ids.namespace_seed.map(hex::encode)));
            let decimal = |v: &[i64]| Json::Array(v.iter().map(|i| json!(i.to_string())).collect());
            out.insert("event_i64_unnamespaced".into(), decimal(&ids.ids_unnamespaced));
            out.insert("event_i64".into(), decimal(&ids.ids));
            out.insert("event_hex".into(), Json::Array(ids.ids.iter().map(|&i| json!(id_text(i))).collect()));
            out.insert("event_lora_name".into(), json!(ids.lora_name));
            out.insert("storage_digests_hex".into(), ids.storage_digests.as_deref().map_or(Json::Null, hexes));
            out.insert("error".into(), Json::Null);
        }
        Err(e @ (PathError::Refused(_) | PathError::NotReproducible)) => {
            for field in fields.iter().chain(&["event_hex", "event_lora_name", "storage_digests_hex"]) {
                out.insert((*field).into(), Json::Null);
            }
            out.insert("error".into(), json!(e.to_string()));
        }
        Err(e) => return Err(e.to_string()),
    }
    Ok(Json::Object(out))
}
