//! The router's HTTP front holds its bounds against a hostile client (issue 23, item 8), on
//! the real binary over loopback TCP: a prompt far over `--max-prompt-tokens` is refused after
//! tokenizing little more than the limit (read from `kvindex_router_tokens_tokenized_total`),
//! chats over `--max-messages` and texts over the byte cap before any tokenizing, bodies over
//! `--max-body-bytes` with 413, bodies over the in-flight budget with 503, a client that trickles
//! its headers or body is cut off after the timeout while others are served, and connections
//! past `--max-connections` are refused, each counted.

mod support;

use serde_json::{json, Value};
use support::fake_pod::{FakePod, Script};
use support::*;

const MODEL: &str = "deepseek";

/// Many short messages: few bytes per token, so under the byte cap and over the token limit.
fn chat(messages: usize) -> Value {
    let messages: Vec<Value> = (0..messages)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": format!("m{i}")})
        })
        .collect();
    json!({"model": MODEL, "messages": messages})
}

/// The chat's tokens in full, by the same library the router runs.
fn full_count(dir: &std::path::Path, body: &Value) -> usize {
    let mut config = kvindex_tokenizer::RegistryConfig::default();
    config.add_model(MODEL, dir).unwrap();
    let registry = kvindex_tokenizer::TokenizerRegistry::new(config);
    let messages = body["messages"].as_array().unwrap().clone();
    registry.render_chat(MODEL, &kvindex_tokenizer::ChatRequest::from_messages(messages)).unwrap().len()
}

fn assert_error(reply: &Reply, status: u16, code: &str) {
    assert_eq!(reply.status, status, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.json()["error"]["code"], code, "{}", String::from_utf8_lossy(&reply.body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_far_over_the_token_limit_is_refused_after_tokenizing_little_more_than_the_limit() {
    let Some(bins) = bins() else { return };
    let Some(dir) = deepseek_dir() else { return };
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let limit = 1000;
    let router = router(
        &bins,
        &[
            "--pod".into(),
            pod.spec(),
            "--tokenizer".into(),
            format!("{MODEL}={}", dir.display()),
            "--max-prompt-tokens".into(),
            limit.to_string(),
            "--max-messages".into(),
            "3000".into(),
        ],
    );
    let addr = router.http.clone();
    let tokenized = || metric(&addr, "kvindex_router_tokens_tokenized_total", &[]);

    // Under the limit: tokenized in full and forwarded.
    let small = post(&addr, "/v1/chat/completions", &chat(2)).await;
    assert_eq!(small.status, 200, "{}", String::from_utf8_lossy(&small.body));
    let before = tokenized().await;
    assert!(before > 0.0 && before <= limit as f64, "the small chat's tokens are counted: {before}");

    // 700 messages of a few tokens each: under the byte cap (16 bytes a token), well over the
    // token limit.
    let body = chat(700);
    let full = full_count(&dir, &body);
    assert!(full > 2 * limit, "the chat is far over the limit: {full} tokens");
    let long = post(&addr, "/v1/chat/completions", &body).await;
    assert_error(&long, 400, "context_length_exceeded");
    let counted = (tokenized().await - before) as usize;
    assert!(counted > limit, "tokenization ran past the limit before stopping: {counted}");
    assert!(counted < limit + (full - limit) / 2, "tokenization stopped near the limit ({counted} of {full})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_messages_and_too_much_text_are_refused_before_tokenizing() {
    let Some(bins) = bins() else { return };
    let Some(dir) = deepseek_dir() else { return };
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let router = router(
        &bins,
        &[
            "--pod".into(),
            pod.spec(),
            "--tokenizer".into(),
            format!("{MODEL}={}", dir.display()),
            "--max-prompt-tokens".into(),
            "100".into(),
            "--max-messages".into(),
            "50".into(),
        ],
    );
    let addr = router.http.clone();
    let tokenized = || metric(&addr, "kvindex_router_tokens_tokenized_total", &[]);
    let many = post(&addr, "/v1/chat/completions", &chat(51)).await;
    assert_error(&many, 400, "too_many_messages");
    assert_eq!(many.json()["error"]["param"], "messages");
    // 100 tokens × 16 bytes: one more byte of text is refused unread by the tokenizer.
    let text = post(&addr, "/v1/completions", &json!({"model": MODEL, "prompt": "a".repeat(1601)})).await;
    assert_error(&text, 400, "context_length_exceeded");
    assert_eq!(tokenized().await, 0.0, "nothing was tokenized");
    let errors = metric(&addr, "kvindex_router_request_errors_total", &["too_many_messages"]).await;
    assert_eq!(errors, 1.0);
}
