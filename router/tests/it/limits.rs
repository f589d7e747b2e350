//! The router's HTTP front holds its bounds against a hostile client, on
//! the real binary over loopback TCP: a prompt far over `--max-prompt-tokens` is refused after
//! tokenizing little more than the limit (read from `kvindex_router_tokens_tokenized_total`),
//! in process and through a `kvindex-tokenizer` that is sent the limit,
//! chats over `--max-messages` and texts over the byte cap before any tokenizing, bodies over
//! `--max-body-bytes` with 413, bodies over the in-flight budget with 503, a client that trickles
//! its headers or body is cut off after the timeout while others are served, one that stops
//! reading its answers after the write timeout, each counted. The connection caps
//! (`--max-connections` and its per-address and per-network shares) are tests/it/connection_caps.rs's.

use std::time::{Duration, Instant};

use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
    let bins = bins();
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

/// The same through a `kvindex-tokenizer` over gRPC (served here in process, real gRPC on
/// loopback): the router sends its limit with the request, and the service stops tokenizing
/// soon past it instead of tokenizing the whole chat (the remote path had no bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_far_over_the_token_limit_is_refused_by_the_remote_tokenizer_after_little_more_than_the_limit() {
    let bins = bins();
    let Some(dir) = deepseek_dir() else { return };
    let mut config = kvindex_tokenizer::RegistryConfig::default();
    config.add_model(MODEL, &dir).unwrap();
    let registry = std::sync::Arc::new(kvindex_tokenizer::TokenizerRegistry::new(config));
    // Loaded before the first request, which the router gives a second.
    let loading = registry.clone();
    tokio::task::spawn_blocking(move || loading.initialize(MODEL)).await.unwrap().unwrap();
    let listeners =
        kvindex_tokenizer::server::BoundListeners::bind("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
    let endpoint = listeners.tcp_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(kvindex_tokenizer::server::serve(registry, listeners, async {
        let _ = stopped.await;
    }));
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let limit = 1000;
    let router = router(
        &bins,
        &[
            "--pod".into(),
            pod.spec(),
            "--tokenizer-endpoint".into(),
            endpoint,
            "--max-prompt-tokens".into(),
            limit.to_string(),
            "--max-messages".into(),
            "3000".into(),
        ],
    );
    let addr = router.http.clone();
    let tokenized = || metric(&addr, "kvindex_router_tokens_tokenized_total", &["where=\"remote\""]);

    let body = chat(700);
    let full = full_count(&dir, &body);
    assert!(full > 2 * limit, "the chat is far over the limit: {full} tokens");
    let long = post(&addr, "/v1/chat/completions", &body).await;
    assert_error(&long, 400, "context_length_exceeded");
    let counted = tokenized().await as usize;
    assert!(counted > limit, "tokenization ran past the limit before stopping: {counted}");
    assert!(counted < limit + (full - limit) / 2, "the service stopped near the limit ({counted} of {full})");
    // Under the limit: tokenized remotely and forwarded.
    let small = post(&addr, "/v1/chat/completions", &chat(2)).await;
    assert_eq!(small.status, 200, "{}", String::from_utf8_lossy(&small.body));
    let _ = stop.send(());
    let _ = service.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_messages_and_too_much_text_are_refused_before_tokenizing() {
    let bins = bins();
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

/// Reads until the peer closes (or `DEADLINE`), returning what came.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the router did not close the connection within {DEADLINE:?}");
    answer
}

fn fake_router(bins: &Bins, pod: &FakePod, extra: &[&str]) -> RouterProcess {
    let mut args = vec!["--pod".to_string(), pod.spec(), "--model".into(), "m".into(), "--metrics-addr".into()];
    args.push("127.0.0.1:0".into());
    args.extend(extra.iter().map(|s| s.to_string()));
    router(bins, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_headers_is_cut_off_while_others_are_served() {
    let bins = bins();
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let router = fake_router(&bins, &pod, &["--http-header-timeout-ms", "1000", "--http-body-timeout-ms", "1000"]);
    let (addr, metrics) = (router.http.clone(), router.metrics.clone().unwrap());

    // One byte of the request head every 50 ms, never finishing in time. Timed from before the
    // connection: the router's header timer starts when it accepts, before the client's next
    // step.
    let started = Instant::now();
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    let trickle = tokio::spawn(async move {
        let head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        for byte in head.iter().cycle() {
            if slow.write_all(&[*byte]).await.is_err() {
                return started.elapsed();
            }
            let mut probe = [0u8; 1];
            if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(50), slow.read(&mut probe)).await {
                return started.elapsed();
            }
            assert!(started.elapsed() < DEADLINE, "the trickling client was never cut off");
        }
        unreachable!()
    });
    // A silent connection too (stops mid-headers).
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    silent.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    // Meanwhile a normal request is served.
    let ok = post(&addr, "/v1/completions", &json!({"model": "m", "prompt": [1, 2, 3]})).await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    let cut_after = trickle.await.unwrap();
    assert!(cut_after >= Duration::from_millis(1000), "not before the timeout: {cut_after:?}");
    read_until_closed(&mut silent).await;
    wait_for("both header timeouts counted", DEADLINE, || async {
        let n = metric(&metrics, "kvindex_router_http_timeouts_total", &["phase=\"header\""]).await;
        (n >= 2.0).then_some(())
    })
    .await;

    // A body that stops half way gets a 408 after the body timeout.
    let mut stalled = TcpStream::connect(&addr).await.unwrap();
    stalled
        .write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"model\": ")
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&read_until_closed(&mut stalled).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert_eq!(metric(&metrics, "kvindex_router_http_timeouts_total", &["phase=\"body\""]).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answers_is_cut_off_after_the_write_timeout() {
    let bins = bins();
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let router = fake_router(&bins, &pod, &["--http-write-timeout-ms", "1000"]);
    let metrics = router.metrics.clone().unwrap();
    // Far more pipelined `/metrics` answers than the kernel's buffers on both sides hold, so the
    // router's writes stop making progress.
    let mut greedy = TcpStream::connect(&metrics).await.unwrap();
    greedy.write_all("GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n".repeat(4000).as_bytes()).await.unwrap();
    let started = Instant::now();
    wait_for("the stalled write counted", DEADLINE, || async {
        let n = metric(&metrics, "kvindex_router_http_timeouts_total", &["phase=\"write\""]).await;
        (n >= 1.0).then_some(())
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(900), "not before the timeout: {:?}", started.elapsed());
    // What the kernel holds still comes, then the end: the connection is closed.
    let answered = String::from_utf8_lossy(&read_until_closed(&mut greedy).await).into_owned();
    assert!(answered.starts_with("HTTP/1.1 200"), "answers went out before the stall");
    assert!(answered.matches("HTTP/1.1 200").count() < 4000, "not every answer was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_size_or_the_shared_budget_are_refused_before_buffering_more() {
    let bins = bins();
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let router = fake_router(&bins, &pod, &["--max-body-bytes", "4096", "--max-inflight-body-bytes", "8192"]);
    let (addr, metrics) = (router.http.clone(), router.metrics.clone().unwrap());

    let big = json!({"model": "m", "prompt": "x".repeat(5000)});
    let reply = post(&addr, "/v1/completions", &big).await;
    assert_eq!(reply.status, 413, "{}", String::from_utf8_lossy(&reply.body));

    // Two clients declare 4096-byte bodies and stall: the budget is spent.
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        stream.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 4096\r\n\r\n{").await.unwrap();
        holders.push(stream);
    }
    wait_for("both bodies reserved", DEADLINE, || async {
        (metric(&metrics, "kvindex_router_http_body_bytes", &[]).await == 8192.0).then_some(())
    })
    .await;
    let busy = post(&addr, "/v1/completions", &json!({"model": "m", "prompt": [1]})).await;
    assert_eq!(busy.status, 503, "{}", String::from_utf8_lossy(&busy.body));
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(busy.json()["error"]["code"], "overloaded");
    assert_eq!(metric(&metrics, "kvindex_router_request_errors_total", &["overloaded"]).await, 1.0);
    // Given back when a holder leaves.
    drop(holders.pop());
    wait_for("the budget given back", DEADLINE, || async {
        let ok = post(&addr, "/v1/completions", &json!({"model": "m", "prompt": [1]})).await;
        (ok.status == 200).then_some(())
    })
    .await;
}
