//! `kvindex vllm-hash`: recompute vLLM block-hash chains from `hashes.jsonl`-shaped records.
//!
//! Operators use it to check a (version, algo, PYTHONHASHSEED, block size) guess against what an
//! engine published; the test suite uses it to hold [`kvindex::vllm_hash`] to vectors produced by
//! vLLM's own code. Input is JSON Lines with at least `version`, `algo`, `pythonhashseed`,
//! `block_size`, `token_ids` and optionally `extra_keys_per_block` and `case`. Output is one JSON
//! line per input line, using the input's field names for everything computed. NONE_HASH is
//! always derived from (version, algo, pythonhashseed), never copied from the input. A record
//! that cannot be reproduced (e.g. `builtin`) comes back with an `error` field; a malformed line
//! gives `{"error", "line"}`; either way the run goes on.

use std::io::{BufRead, Write};

use serde_json::{json, Map, Value as Json};

use kvindex::vllm_hash::{BlockHasher, HashAlgo, InternalHash, PyValue, VllmHashConfig, VllmVersion};

pub fn run(mut input: impl BufRead, mut output: impl Write) -> Result<(), Box<dyn std::error::Error>> {
    // Lines are read as bytes so that one non-UTF-8 line is reported, not fatal.
    let mut raw_line = Vec::new();
    let mut line_number = 0usize;
    loop {
        raw_line.clear();
        if input.read_until(b'\n', &mut raw_line)? == 0 {
            break;
        }
        line_number += 1;
        let result = match std::str::from_utf8(&raw_line) {
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => process_line(line, line_number),
            Err(error) => {
                json!({"error": format!("line is not UTF-8: {error}"), "line": line_number})
            }
        };
        serde_json::to_writer(&mut output, &result)?;
        output.write_all(b"\n")?;
    }
    output.flush()?;
    Ok(())
}

fn process_line(line: &str, line_number: usize) -> Json {
    match serde_json::from_str::<Json>(line) {
        Ok(Json::Object(record)) => compute_record(&record).unwrap_or_else(|error| {
            let mut echoed = record.clone();
            echoed.insert("error".into(), Json::String(error));
            Json::Object(echoed)
        }),
        Ok(_) => json!({"error": "record is not a JSON object", "line": line_number}),
        Err(error) => json!({"error": format!("invalid JSON: {error}"), "line": line_number}),
    }
}

fn required_str<'a>(record: &'a Map<String, Json>, field: &str) -> Result<&'a str, String> {
    record.get(field).and_then(Json::as_str).ok_or_else(|| format!("`{field}` must be a string"))
}

/// One record's chain, in the vectors' field names.
fn compute_record(record: &Map<String, Json>) -> Result<Json, String> {
    let version = VllmVersion::parse(required_str(record, "version")?).map_err(|e| e.to_string())?;
    let algo = required_str(record, "algo")?.parse::<HashAlgo>().map_err(|e| e.to_string())?;
    let pythonhashseed = match record.get("pythonhashseed") {
        None | Some(Json::Null) => None,
        Some(Json::String(seed)) => Some(seed.clone()),
        Some(_) => return Err("`pythonhashseed` must be a string or null".into()),
    };
    let block_size = record
        .get("block_size")
        .and_then(Json::as_u64)
        .and_then(|size| usize::try_from(size).ok())
        .filter(|&size| size > 0)
        .ok_or("`block_size` must be a positive integer")?;
    let token_ids = record
        .get("token_ids")
        .and_then(Json::as_array)
        .ok_or("`token_ids` must be an array")?
        .iter()
        .map(|token| token.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or("`token_ids` must hold integers in 0..2^32")?;
    let extra_keys_per_block: Vec<Option<PyValue>> = match record.get("extra_keys_per_block") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(entries)) => entries
            .iter()
            .map(|entry| match entry {
                Json::Null => Ok(None),
                other => PyValue::from_json(other).map(Some),
            })
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?,
        Some(_) => return Err("`extra_keys_per_block` must be an array or null".into()),
    };

    let config = VllmHashConfig { version, algo, pythonhashseed: pythonhashseed.clone() };
    let hasher = BlockHasher::new(&config).map_err(|e| e.to_string())?;
    let chain = hasher.hash_chain(None, &token_ids, block_size, &extra_keys_per_block);

    let mut seed_input = Vec::new();
    hasher.write_none_hash_seed_input(&mut seed_input);
    let serialized_block0 = token_ids.get(..block_size).map(|block0| {
        let mut input = Vec::new();
        let extra = extra_keys_per_block.first().and_then(Option::as_ref);
        hasher.write_block_input(&mut input, None, block0, extra);
        hex::encode(input)
    });
    let is_int = !matches!(hasher.none_hash(), InternalHash::Digest(_));

    let mut out = Map::new();
    for echoed in ["version", "case"] {
        if let Some(value) = record.get(echoed) {
            out.insert(echoed.into(), value.clone());
        }
    }
    out.insert("algo".into(), json!(algo.as_str()));
    out.insert("pythonhashseed".into(), json!(pythonhashseed));
    out.insert("block_size".into(), json!(block_size));
    out.insert("internal_type".into(), json!(if is_int { "int" } else { "bytes" }));
    out.insert("none_hash_seed".into(), json!(hasher.none_hash_rule().seed()));
    out.insert("none_hash_algo".into(), json!(hasher.none_hash_algo().as_str()));
    out.insert("serialized_none_hash_seed_hex".into(), json!(hex::encode(seed_input)));
    out.insert("none_hash_hex".into(), json!(hasher.none_hash().to_hex()));
    out.insert("block_digests_hex".into(), Json::Array(chain.iter().map(|hash| json!(hash.to_hex())).collect()));
    out.insert(
        "event_u64".into(),
        Json::Array(
            chain
                .iter()
                .map(|hash| match hash.published_u64() {
                    Some(value) => json!(format!("0x{value:016x}")),
                    None => Json::Null,
                })
                .collect(),
        ),
    );
    out.insert("serialized_input_hex_block0".into(), json!(serialized_block0));
    if is_int {
        out.insert("none_hash_int".into(), json!(hasher.none_hash().to_decimal()));
        out.insert("block_hashes_int".into(), Json::Array(chain.iter().map(|hash| json!(hash.to_decimal())).collect()));
    }
    Ok(Json::Object(out))
}
