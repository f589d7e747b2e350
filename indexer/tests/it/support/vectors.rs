//! The vLLM vectors (captured frames and block hashes from vLLM's own code), read from the
//! repository's `testdata/vllm-vectors/`, and SGLang's (`testdata/sglang-vectors/`). Shared by
//! the test support of every crate that reads them (included there with `#[path]`), so the
//! tests need nothing outside the repository. `KVINDEX_VECTORS=<dir>` (`KVINDEX_SGLANG_VECTORS`)
//! runs them against another corpus with the same layout instead.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;

/// `testdata/vllm-vectors` at the repository root (found upward from the crate), or
/// `$KVINDEX_VECTORS`.
pub fn vectors_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KVINDEX_VECTORS") {
        return PathBuf::from(dir);
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .map(|dir| dir.join("testdata/vllm-vectors"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no testdata/vllm-vectors above {}", crate_dir.display()))
}

/// `testdata/sglang-vectors` at the repository root, or `$KVINDEX_SGLANG_VECTORS`.
pub fn sglang_vectors_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KVINDEX_SGLANG_VECTORS") {
        return PathBuf::from(dir);
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .map(|dir| dir.join("testdata/sglang-vectors"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no testdata/sglang-vectors above {}", crate_dir.display()))
}

/// Every `frames-*.jsonl` file of the SGLang vectors, sorted.
pub fn sglang_frame_files() -> Vec<PathBuf> {
    frames_in(&sglang_vectors_dir())
}

/// The records of a JSON Lines file.
pub fn read_records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("{} line {}: {e}", path.display(), n + 1)))
        .collect()
}

/// The records of vectors file `name` (`hashes.jsonl`, `frames-0.33.0.jsonl`, …).
pub fn read_jsonl(name: &str) -> Vec<Value> {
    read_records(&vectors_dir().join(name))
}

/// Every `frames-*.jsonl` file, sorted. Panics when there are none: the vectors must be there.
pub fn frame_files() -> Vec<PathBuf> {
    frames_in(&vectors_dir())
}

fn frames_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
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

/// Drops `null`-valued keys recursively, so that null and absent compare equal (the vectors'
/// rule).
pub fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), without_nulls(v))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// Asserts that `decoded` (one value per record of the vector file `path`, in order) equals
/// each record's `expect`, nulls and absent keys alike; returns the records.
pub fn assert_decoded_as_expected(path: &Path, decoded: &[Value]) -> Vec<Value> {
    let records = read_records(path);
    assert_eq!(decoded.len(), records.len(), "{}: one output line per record", path.display());
    for (i, (record, got)) in records.iter().zip(decoded).enumerate() {
        assert_eq!(
            without_nulls(got),
            without_nulls(&record["expect"]),
            "{} record {i} ({} {})",
            path.display(),
            record["scenario"],
            record["kind"]
        );
    }
    records
}
