//! Every message vLLM's own publisher produced (testdata/vllm-vectors) decodes to its `expect`,
//! through the real `kvindex decode` binary.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use support::{frame_files, read_records, without_nulls};

#[test]
fn every_captured_frame_decodes_to_its_expectation() {
    let mut checked = 0;
    for path in frame_files() {
        let input = std::fs::read(&path).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvindex"))
            .arg("decode")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn kvindex decode");
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(out.status.success(), "{}: kvindex decode failed", path.display());
        let got: Vec<serde_json::Value> =
            String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let records = read_records(&path);
        assert_eq!(got.len(), records.len(), "{}: one output line per record", path.display());
        for (i, (record, got)) in records.iter().zip(&got).enumerate() {
            assert_eq!(
                without_nulls(got),
                without_nulls(&record["expect"]),
                "{} record {i} ({} {})",
                path.display(),
                record["scenario"],
                record["kind"]
            );
            checked += 1;
        }
    }
    assert!(checked >= 200, "only {checked} records checked");
}

#[test]
fn decode_reports_bad_lines_and_continues() {
    let input = concat!(
        "{\"frames_hex\": [\"6b76\", \"00\", \"90\"]}\n",
        "not json\n",
        "{\"kind\": \"live\", \"frames_hex\": [\"6b76\", \"0000000000000001\", \"93cb41d954fc4020000090 00\"]}\n",
        "{\"kind\": \"live\", \"frames_hex\": [\"6b76\", \"0000000000000002\", \"93cb41d954fc402000009000\"]}\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .arg("decode")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(input.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["reason"], "seq_length");
    assert_eq!(lines[1]["reason"], "json");
    assert_eq!(lines[2]["reason"], "json", "a frame that is not hex");
    assert_eq!(lines[3]["seq"], 2);
    assert_eq!(lines[3]["events"], serde_json::json!([]));
}
