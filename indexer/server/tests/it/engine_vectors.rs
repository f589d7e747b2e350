//! Every message SGLang's own publisher produced and every page-id chain its own hash code
//! computed (testdata/sglang-vectors, three releases, both event encodings) comes out of the
//! real `kvindex decode --engine sglang` and `kvindex sglang-hash` binaries exactly; so does
//! every TensorRT-LLM batch built from its published format (testdata/trtllm-vectors).

use std::process::Command;

use crate::support::{
    assert_decoded_as_expected, kvindex_json_lines, read_records, sglang_frame_files, sglang_vectors_dir, without_nulls,
};
use serde_json::Value;

#[test]
fn every_sglang_frame_decodes_to_its_expectation() {
    let mut checked = 0;
    let mut encodings = std::collections::BTreeSet::new();
    for path in sglang_frame_files() {
        let got = kvindex_json_lines(&["decode", "--engine", "sglang"], std::fs::read(&path).unwrap());
        for record in assert_decoded_as_expected(&path, &got) {
            encodings.insert(record["event_encoding"].as_str().unwrap_or("").to_string());
            checked += 1;
        }
    }
    assert!(checked >= 150, "only {checked} records checked");
    assert!(encodings.contains("array") && encodings.contains("map"), "both encodings covered: {encodings:?}");
}

#[test]
fn the_vllm_field_order_misreads_sglang_salted_stores() {
    // SGLang 0.5.19's 8th array slot is a metadata map where vLLM has lora_name: the engine
    // must be named, or a salted store fails (or worse, decodes as something else).
    let path = sglang_vectors_dir().join("frames-sglang-0.5.19.jsonl");
    let salted: Vec<u8> = read_records(&path)
        .into_iter()
        .filter(|r| r["scenario"] == "cache-salt")
        .flat_map(|mut r| {
            r.as_object_mut().unwrap().remove("engine");
            format!("{r}\n").into_bytes()
        })
        .collect();
    let as_vllm = kvindex_json_lines(&["decode", "--engine", "vllm"], salted.clone());
    assert!(as_vllm.iter().any(|l| l.get("reason").is_some()), "vLLM's order cannot read a metadata map");
    let as_sglang = kvindex_json_lines(&["decode", "--engine", "sglang"], salted);
    assert!(as_sglang.iter().all(|l| l.get("reason").is_none()));
    assert_eq!(as_sglang[0]["events"][0]["metadata"]["cache_salt"], "tenant-a-salt");
}

#[test]
fn every_sglang_hash_case_reproduces() {
    let path = sglang_vectors_dir().join("hashes-sglang.jsonl");
    let input = std::fs::read(&path).unwrap();
    let records = read_records(&path);
    let got = kvindex_json_lines(&["sglang-hash"], input);
    assert_eq!(got.len(), records.len());
    let fields = [
        "chain_seed_hex",
        "page_digests_hex",
        "namespace_seed_hex",
        "event_i64_unnamespaced",
        "event_i64",
        "event_hex",
        "event_lora_name",
        "storage_digests_hex",
        "error",
    ];
    let mut negative = 0;
    for (record, got) in records.iter().zip(&got) {
        for field in fields {
            assert_eq!(got[field], record[field], "{} {}: {field}", record["version"], record["case"]);
        }
        negative += record["event_i64"]
            .as_array()
            .map_or(0, |ids| ids.iter().filter(|i| i.as_str().is_some_and(|s| s.starts_with('-'))).count());
    }
    assert!(records.len() >= 30 && negative > 0, "{} cases, {negative} negative ids", records.len());
}

#[test]
fn every_trtllm_frame_decodes_to_its_expectation() {
    let dir = sglang_vectors_dir().parent().unwrap().join("trtllm-vectors");
    let path = dir.join("frames-trtllm-format.jsonl");
    let records = read_records(&path);
    let got = kvindex_json_lines(&["decode", "--engine", "trtllm"], std::fs::read(&path).unwrap());
    assert_eq!(got.len(), records.len());
    for (record, got) in records.iter().zip(&got) {
        assert_eq!(without_nulls(got), without_nulls(&record["expect"]), "{}", record["scenario"]);
    }
    assert!(records.len() >= 4);
}

#[test]
fn a_dump_of_an_sglang_pod_replays_by_sglang_rules_when_its_engine_is_named() {
    // A dump records frames, not the fleet's configuration: `kvindex replay --engine` names the
    // pod's engine again. SGLang 0.5.19's salted stores, recorded as the central SUB took them.
    let path = sglang_vectors_dir().join("frames-sglang-0.5.19.jsonl");
    let salted: Vec<Value> = read_records(&path).into_iter().filter(|r| r["scenario"] == "cache-salt").collect();
    assert!(salted.len() >= 2);
    let pod = salted[0]["expect"]["topic"].as_str().unwrap().split('@').nth(1).unwrap().to_string();
    let dump = std::env::temp_dir().join(format!("kvindex-sglang-dump-{}.jsonl", std::process::id()));
    let lines: String = salted
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let record = serde_json::json!({
                "t": 1_765_000_000.0 + i as f64, "kind": "live", "source": "central", "conn": 1,
                "frames_hex": r["frames_hex"],
            });
            format!("{record}\n")
        })
        .collect();
    std::fs::write(&dump, lines).unwrap();
    let replay = |extra: &[&str]| -> Value {
        let mut args = vec!["replay", dump.to_str().unwrap(), "--quiet"];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_kvindex")).args(&args).output().unwrap();
        assert!(out.status.success(), "kvindex {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("the report is JSON")
    };
    let engine = format!("{pod}=sglang:16");
    let as_sglang = replay(&["--engine", &engine]);
    let as_vllm = replay(&[]);
    let _ = std::fs::remove_file(&dump);
    let source = |report: &Value| report["sources"][0].clone();
    assert_eq!(as_sglang["totals"]["undecodable"], 0, "{as_sglang:#}");
    assert_eq!(source(&as_sglang)["state"], "EXACT", "{as_sglang:#}");
    assert!(source(&as_sglang)["stored_blocks"].as_u64().unwrap() > 0, "{as_sglang:#}");
    // Read by vLLM's rules (the default engine) the metadata slot is malformed: the pod is
    // degraded, never credited with a misread store.
    assert!(as_vllm["totals"]["undecodable"].as_u64().unwrap() > 0, "{as_vllm:#}");
    assert_eq!(source(&as_vllm)["state"], "DEGRADED", "{as_vllm:#}");
    // A bad engine spec is refused with the flag named.
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["replay", "/nonexistent", "--engine", "pod=mystery"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown engine"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
