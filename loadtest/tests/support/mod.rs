//! Helpers shared by the integration tests: the vLLM vectors in the repository (the core's
//! `tests/support/vectors.rs`), a minimal HTTP/1.1 client over a real 127.0.0.1 socket, and
//! waiting on conditions with deadlines.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../../../indexer/tests/support/vectors.rs"]
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

/// The `kvindex` binary (built by any workspace build, or `cargo build -p kvindex-server --bin
/// kvindex`): `$KVINDEX_BIN`, else `$CARGO_TARGET_DIR/debug/kvindex`, else the one beside this
/// test's target directory. `None` (the test is skipped with a message) when there is none,
/// except under `CI`, where that fails the test.
pub fn kvindex_binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("KVINDEX_BIN").map(PathBuf::from),
        std::env::var_os("CARGO_TARGET_DIR").map(|dir| PathBuf::from(dir).join("debug/kvindex")),
        // target/<profile>/deps/<this test> → target/<profile>/kvindex
        std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.parent()?.join("kvindex"))),
    ];
    if let Some(found) = candidates.iter().flatten().find(|path| path.is_file()) {
        return Some(found.clone());
    }
    let message = format!(
        "no kvindex binary among {:?} (build it with `cargo build -p kvindex-server --bin kvindex` or set KVINDEX_BIN)",
        candidates.iter().flatten().collect::<Vec<_>>()
    );
    assert!(std::env::var_os("CI").is_none(), "{message}");
    eprintln!("SKIPPED: {message}");
    None
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

/// Polls `check` until it returns `Some`, failing the test at the deadline.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
