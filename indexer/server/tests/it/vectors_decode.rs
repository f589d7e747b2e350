//! Every message vLLM's own publisher produced (testdata/vllm-vectors) decodes to its `expect`,
//! through the real `kvindex decode` binary.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::{assert_decoded_as_expected, frame_files, kvindex_json_lines};

#[test]
fn every_captured_frame_decodes_to_its_expectation() {
    let mut checked = 0;
    for path in frame_files() {
        let got = kvindex_json_lines(&["decode"], std::fs::read(&path).unwrap());
        checked += assert_decoded_as_expected(&path, &got).len();
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
