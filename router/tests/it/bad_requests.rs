//! Every request the router cannot place gets an OpenAI-shaped error with the right status,
//! counted, and never takes the router down: malformed and oversized bodies, unknown models,
//! prompts over the limit, wrong methods and paths, and a few hundred mangled bodies. A bad
//! command line exits with status 2 and names the flag.

use std::process::Command;

use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn assert_openai_error(reply: &Reply, status: u16, code: &str) {
    assert_eq!(reply.status, status, "{}", String::from_utf8_lossy(&reply.body));
    let body = reply.json();
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert_eq!(error["code"], code, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_requests_get_clear_errors_and_nothing_crashes() {
    let bins = bins();
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let mut router = router(
        &bins,
        &["--pod", &pod.spec(), "--model", "m", "--max-body-bytes", "4096", "--max-prompt-tokens", "100"]
            .map(String::from),
    );
    let addr = router.http.clone();
    let raw = |body: &'static [u8]| request(&addr, "POST", "/v1/completions", Some(Bytes::from_static(body)), &[]);

    assert_openai_error(&raw(b"{bad").await, 400, "invalid_json");
    assert_openai_error(&raw(b"[1, 2]").await, 400, "invalid_json");
    assert_openai_error(&raw(b"\xff\xfe\x00garbage").await, 400, "invalid_json");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_openai_error(
        &request(&addr, "POST", "/v1/completions", Some(Bytes::from(deep)), &[]).await,
        413,
        "request_too_large",
    );
    let nested = format!("{{\"model\": \"m\", \"prompt\": {}{}}}", "[".repeat(1000), "]".repeat(1000));
    assert_openai_error(
        &request(&addr, "POST", "/v1/completions", Some(Bytes::from(nested)), &[]).await,
        400,
        "invalid_json",
    );
    let missing = post(&addr, "/v1/completions", &json!({"prompt": [1, 2]})).await;
    assert_openai_error(&missing, 400, "invalid_request");
    assert_eq!(missing.json()["error"]["param"], "model");
    let unknown = post(&addr, "/v1/completions", &json!({"model": "nope", "prompt": [1, 2]})).await;
    assert_openai_error(&unknown, 404, "model_not_found");
    assert!(unknown.json()["error"]["message"].as_str().unwrap().contains("nope"));
    let long = post(&addr, "/v1/completions", &json!({"model": "m", "prompt": vec![7; 101]})).await;
    assert_openai_error(&long, 400, "context_length_exceeded");
    assert!(long.json()["error"]["message"].as_str().unwrap().contains("101"));
    let big = json!({"model": "m", "prompt": "x".repeat(5000)});
    assert_openai_error(&post(&addr, "/v1/completions", &big).await, 413, "request_too_large");
    let chat = post(&addr, "/v1/chat/completions", &json!({"model": "m", "messages": "hi"})).await;
    assert_openai_error(&chat, 400, "invalid_request");
    assert_eq!(chat.json()["error"]["param"], "messages");
    assert_openai_error(&get(&addr, "/v1/completions").await, 405, "method_not_allowed");
    assert_openai_error(&get(&addr, "/v2/anything").await, 404, "not_found");

    // A chunked body with no Content-Length, over the limit.
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut raw_request =
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_vec();
    for _ in 0..5 {
        raw_request.extend_from_slice(format!("400\r\n{}\r\n", "y".repeat(1024)).as_bytes());
    }
    raw_request.extend_from_slice(b"0\r\n\r\n");
    stream.write_all(&raw_request).await.unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 413"), "{}", String::from_utf8_lossy(&answer));

    // Mangled versions of a valid body: each answered (placed or refused), never a crash.
    let valid =
        json!({"model": "m", "prompt": [1, 2, 3], "stream": false, "messages": [{"role": "user", "content": "x"}]})
            .to_string();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..300 {
        let mut bytes = valid.clone().into_bytes();
        for _ in 0..(1 + round % 4) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = (seed % bytes.len() as u64) as usize;
            match seed % 3 {
                0 => bytes[at] = (seed >> 8) as u8,
                1 => bytes.truncate(at.max(1)),
                _ => bytes.insert(at, b"{[\"0-:,}]"[(seed >> 16) as usize % 9]),
            }
        }
        let path = if round % 2 == 0 { "/v1/completions" } else { "/v1/chat/completions" };
        let reply = request(&addr, "POST", path, Some(Bytes::from(bytes)), &[]).await;
        assert!(matches!(reply.status, 200 | 400 | 404 | 413), "round {round}: {}", reply.status);
        if reply.status != 200 {
            let body: Value = reply.json();
            assert!(body["error"]["message"].is_string(), "round {round}: {body}");
        }
    }
    assert_eq!(get(&addr, "/healthz").await.status, 200);
    assert!(router.process.try_wait().is_none(), "the router is still running");
    assert!(metric(&addr, "kvindex_router_request_errors_total", &["reason=\"invalid_json\""]).await >= 4.0);
    assert!(metric(&addr, "kvindex_router_request_errors_total", &["reason=\"request_too_large\""]).await >= 3.0);
}

#[test]
fn a_bad_command_line_exits_2_and_names_the_flag() {
    let router = env!("CARGO_BIN_EXE_kvindex-router");
    let cases: &[(&[&str], &str)] = &[
        (&["serve", "--http-addr", "127.0.0.1:0", "--pod", "nourl"], "--pod"),
        (&["serve", "--http-addr", "127.0.0.1:0", "--pod", "a=http://a:1", "--indexer", "x"], "--indexer"),
        (
            &["serve", "--http-addr", "127.0.0.1:0", "--pod", "a=http://a:1", "--tokenizer", "m=/nonexistent"],
            "--tokenizer",
        ),
        (&["serve", "--http-addr", "127.0.0.1:0", "--pods-file", "/nonexistent/pods.json"], "--pods-file"),
        (&["serve", "--http-addr", "256.0.0.1:1", "--pod", "a=http://a:1"], "--http-addr"),
    ];
    for (args, flag) in cases {
        let output = Command::new(router).args(*args).output().expect("run kvindex-router");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}
