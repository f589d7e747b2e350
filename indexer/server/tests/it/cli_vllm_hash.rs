//! The `kvindex vllm-hash` command against vLLM's own hash vectors (`hashes.jsonl`): in
//! process, through the real binary, and on bad input.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::{read_jsonl, vectors_dir};
use serde_json::Value as Json;

#[path = "../../src/bin/kvindex/vllm_hash.rs"]
mod vllm_hash_command;

fn label(record: &Json) -> String {
    format!("{} {} {} {}", record["version"], record["algo"], record["case"], record["pythonhashseed"])
}

/// Every computed field of a command output line equals the input record's field.
fn compare_command_output(output: &str) {
    let records = read_jsonl("hashes.jsonl");
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.len(), records.len(), "one output line per record");
    let mut failures = Vec::new();
    for (record, line) in records.iter().zip(&lines) {
        let out: Json = serde_json::from_str(line).expect("output is JSON");
        let Some(fields) = out.as_object() else { panic!("output line is not an object: {line}") };
        if record["algo"] == "builtin" {
            assert!(fields.contains_key("error"), "builtin must report an error: {line}");
            continue;
        }
        if let Some(error) = fields.get("error") {
            failures.push(format!("{}: error {error}", label(record)));
            continue;
        }
        for required in ["none_hash_hex", "block_digests_hex", "event_u64", "serialized_input_hex_block0"] {
            assert!(fields.contains_key(required), "{required} missing: {line}");
        }
        for (field, value) in fields {
            if record.get(field) != Some(value) {
                failures.push(format!("{}: {field}: expected {:?}, got {value}", label(record), record.get(field)));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn command_reproduces_every_record_in_process() {
    let input = std::fs::read(vectors_dir().join("hashes.jsonl")).expect("hashes.jsonl");
    let mut output = Vec::new();
    vllm_hash_command::run(input.as_slice(), &mut output).expect("command runs");
    compare_command_output(&String::from_utf8(output).expect("utf-8 output"));
}

#[test]
fn command_reports_bad_lines_and_goes_on() {
    let input = concat!(
        "not json\n",
        "[1, 2]\n",
        "\n",
        r#"{"version": "0.9.0", "case": "x", "algo": "builtin", "pythonhashseed": "0", "block_size": 1, "token_ids": [1]}"#,
        "\n",
        r#"{"version": "0.33.0", "algo": "sha256_cbor", "pythonhashseed": null, "block_size": 0, "token_ids": []}"#,
        "\n",
        r#"{"version": "0.20.0", "algo": "xxhash", "pythonhashseed": null, "block_size": 16, "token_ids": []}"#,
        "\n",
        r#"{"version": "0.33.0", "algo": "sha256_cbor", "pythonhashseed": null, "block_size": 4, "token_ids": [1, 2, 3, 4, 5]}"#,
        "\n",
    );
    let mut input = input.as_bytes().to_vec();
    input.extend_from_slice(b"\xff\xfe not utf-8\n");
    let mut output = Vec::new();
    vllm_hash_command::run(input.as_slice(), &mut output).expect("command runs");
    let lines: Vec<Json> = String::from_utf8(output)
        .expect("utf-8")
        .lines()
        .map(|line| serde_json::from_str(line).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 7);
    for errored in lines[..5].iter().chain(&lines[6..]) {
        assert!(errored.get("error").is_some(), "{errored}");
    }
    assert_eq!(lines[2]["case"], "x", "a builtin record is echoed with its error");
    // Unset seed on 0.33 sha256_cbor uses the default seed; the partial second block gets no hash.
    assert_eq!(lines[5]["none_hash_seed"], "vllm-none-hash");
    assert_eq!(lines[5]["block_digests_hex"].as_array().map(Vec::len), Some(1));
}

#[test]
fn binary_subcommand_reproduces_every_record() {
    let input = std::fs::read(vectors_dir().join("hashes.jsonl")).expect("hashes.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .arg("vllm-hash")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvindex binary starts");
    let mut stdin = child.stdin.take().expect("stdin piped");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let result = child.wait_with_output().expect("kvindex finishes");
    writer.join().expect("writer thread").expect("stdin written");
    assert!(result.status.success(), "kvindex vllm-hash failed: {}", String::from_utf8_lossy(&result.stderr));
    compare_command_output(&String::from_utf8(result.stdout).expect("utf-8 output"));
}
