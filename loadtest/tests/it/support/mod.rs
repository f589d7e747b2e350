//! Helpers shared by the integration tests: the vLLM vectors in the repository (the core's
//! `tests/it/support/vectors.rs`), a minimal HTTP/1.1 client over a real 127.0.0.1 socket, and
//! waiting on conditions with deadlines.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;

#[path = "../../../../indexer/tests/it/support/vectors.rs"]
pub mod vectors;
#[allow(unused_imports)] // not every test uses the vectors
pub use vectors::*;

/// A child process killed (and reaped) when the test ends, however it ends.
pub struct Process(pub std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
}

/// `"0x…"` → u64.
pub fn hash_u64(text: &str) -> u64 {
    u64::from_str_radix(text.trim_start_matches("0x"), 16).expect("hash")
}

pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One request with `Connection: close` (the loadtest's own client); de-chunks a chunked body.
pub async fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> HttpResponse {
    let (status, body) = kvindex_loadtest::kvindex_service::http(addr, method, path, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    HttpResponse { status, body }
}

/// The `kvindex` binary (`$KVINDEX_BIN`, the target directory's, or built on demand).
pub fn kvindex_binary() -> Option<PathBuf> {
    Some(kvindex_testkit::binaries::required_binary("kvindex", "KVINDEX_BIN"))
}

pub async fn post_json(addr: &str, path: &str, body: &Value) -> HttpResponse {
    http(addr, "POST", path, Some(&body.to_string())).await
}

/// [`post_json`] presenting `token` as a bearer token (kvindex's control plane).
pub async fn post_json_as(addr: &str, path: &str, body: &Value, token: &str) -> HttpResponse {
    let bearer = format!("Bearer {token}");
    let (status, body) = kvindex_loadtest::kvindex_service::http_with(
        addr,
        "POST",
        path,
        Some(&body.to_string()),
        &[("Authorization", &bearer)],
    )
    .await
    .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    HttpResponse { status, body }
}

/// Polls a condition until it returns `Some`, failing the test at the deadline.
#[allow(unused_imports)] // not every test binary that includes this module waits
pub use kvindex_testkit::wait::until_async as wait_for;
