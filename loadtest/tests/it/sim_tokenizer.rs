//! `kvindex-sim --tokenizer <dir>`: text prompts and chats must become the token ids vLLM would
//! compute for that model, because the pod hashes and publishes exactly those ids. The reference
//! here is the tokenizer-svc library itself (`TokenizerRegistry`), which its own tests hold
//! against `transformers`; this test checks the simulator routes through it: BOS for
//! completions, the model's chat template with the generation prompt for chats.
//!
//! Needs the tokenizer fixtures (`source scripts/env.sh` sets `KVINDEX_FIXTURES`; the deepseek
//! model, 129k vocabulary). Without them the test is skipped with a message, except under `CI`,
//! where it fails.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{post_json, Process};
use kvindex_tokenizer::{ChatRequest, RegistryConfig, TokenizerRegistry};
use serde_json::{json, Value};

const MODEL: &str = "deepseek-sim";
const DEADLINE: Duration = Duration::from_secs(60);

fn deepseek_dir() -> Option<PathBuf> {
    kvindex_testkit::env::deepseek_tokenizer()
}

/// Starts one pod with the tokenizer and returns it with its HTTP address.
fn spawn_sim(tokenizer_dir: &std::path::Path) -> (Process, String) {
    let mut process = Process(
        Command::new(env!("CARGO_BIN_EXE_kvindex-sim"))
            .args(["--pods", "1", "--model", MODEL, "--kv-blocks", "256"])
            .args(["--http-base-port", "0", "--zmq-bind-base-port", "0"])
            .args(["--time-scale", "100", "--decode-ms-per-token", "1"])
            .arg("--tokenizer")
            .arg(tokenizer_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kvindex-sim"),
    );
    let stdout = process.0.stdout.take().expect("stdout");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let line = received.recv_timeout(DEADLINE).expect("kvindex-sim reported its pod in time");
    let pod: Value = serde_json::from_str(&line).expect("pod line is JSON");
    let http = pod["http"].as_str().expect("http address").to_string();
    (process, http)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_prompts_and_chats_tokenize_as_the_model_does() {
    let Some(dir) = deepseek_dir() else {
        return;
    };
    let mut config = RegistryConfig::default();
    config.add_model(MODEL, &dir).expect("fixture model");
    let registry = TokenizerRegistry::new(config);
    let (_sim, http) = spawn_sim(&dir);

    let prompt = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.";
    let expected = registry.render_completion(MODEL, prompt).expect("tokenize");
    let response = post_json(
        &http,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt, "max_tokens": 2, "return_token_ids": true}),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.body);
    let body = response.json();
    assert_eq!(body["usage"]["prompt_tokens"].as_u64(), Some(expected.len() as u64));
    let ids: Vec<u32> =
        serde_json::from_value(body["choices"][0]["prompt_token_ids"].clone()).expect("prompt_token_ids");
    assert_eq!(ids, expected);
    // Not the byte tokenizer: far fewer ids than bytes. (deepseek's config has
    // `add_bos_token: false` and a ByteLevel post-processor, so vLLM adds no BOS here; models
    // whose tokenizer.json adds one get it through the same `render_completion`.)
    assert!(expected.len() < prompt.len() / 2);

    let messages = vec![
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": "Name a prime above 100."}),
    ];
    let mut chat = ChatRequest::from_messages(messages.clone());
    chat.add_generation_prompt = true;
    let expected = registry.render_chat(MODEL, &chat).expect("render chat");
    let response = post_json(
        &http,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": messages, "max_tokens": 2, "return_token_ids": true}),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.body);
    let body = response.json();
    assert_eq!(body["usage"]["prompt_tokens"].as_u64(), Some(expected.len() as u64));
    let ids: Vec<u32> =
        serde_json::from_value(body["choices"][0]["prompt_token_ids"].clone()).expect("prompt_token_ids");
    assert_eq!(ids, expected);
    let text = registry.render_chat_text(MODEL, &chat).expect("render chat text");
    assert!(text.contains("Name a prime above 100."), "the template rendered the messages");
}

#[test]
fn a_directory_without_tokenizer_json_is_refused_at_start() {
    let empty = std::env::temp_dir().join(format!("kvindex-sim-no-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_kvindex-sim"))
        .args(["--pods", "1", "--model", MODEL])
        .args(["--http-base-port", "0", "--zmq-bind-base-port", "0"])
        .arg("--tokenizer")
        .arg(&empty)
        .output()
        .expect("run kvindex-sim");
    let _ = std::fs::remove_dir(&empty);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tokenizer.json"), "{stderr}");
}
