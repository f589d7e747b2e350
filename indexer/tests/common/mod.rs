//! Helpers shared by the integration tests: where the vLLM vectors live, and JSON comparison
//! under the vectors' rule that a `null` value and an absent key are equal.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;

/// `../shared/vectors` beside the checkout, or `$KVINDEX_VECTORS`.
pub fn vectors_dir() -> PathBuf {
    match std::env::var_os("KVINDEX_VECTORS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/vectors")),
    }
}

/// Every `frames-*.jsonl` file, sorted. Panics when there are none: the vectors must be there.
pub fn frame_files() -> Vec<PathBuf> {
    let dir = vectors_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("vectors dir {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("frames-") && name.ends_with(".jsonl")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no frames-*.jsonl in {}", dir.display());
    files
}

pub fn read_records(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

/// Drops `null`-valued keys recursively, so that null and absent compare equal.
pub fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), without_nulls(v))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

pub fn frames_of(record: &Value) -> Vec<Vec<u8>> {
    record["frames_hex"]
        .as_array()
        .expect("frames_hex")
        .iter()
        .map(|f| hex::decode(f.as_str().expect("hex string")).expect("hex"))
        .collect()
}
