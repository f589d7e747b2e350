//! A real `kvindex serve` child process for the policy driver, tests and benchmarks: started on
//! loopback with OS-assigned ports, its addresses read from the `KVINDEX_LISTENING` line,
//! killed on drop.
//!
//! It exists so the precise policy can be measured through the product itself (central ZeroMQ
//! SUB, sequencer, apply queue, gRPC `ScoreTokens`) rather than only through the in-process
//! `KvIndex`. The small HTTP/1.1 client is here because the driver needs one GET
//! (`/debug/sources`) and one POST (`/pods`, with the service's bearer token) on 127.0.0.1,
//! not a general HTTP stack.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::ChildProcess;
use kvindex_testkit::serve::{Serve, Serving};

/// A running `kvindex serve`; the process is killed and reaped on drop.
pub struct KvindexService {
    /// The child (for signals: a test stops it to hang the service).
    pub process: ChildProcess,
    /// `host:port` of the gRPC server.
    pub grpc_addr: String,
    /// `host:port` of the HTTP admin server.
    pub http_addr: String,
    /// The central SUB's bound endpoint (`tcp://127.0.0.1:<port>`) that publishers dial.
    pub zmq_endpoint: String,
    /// The control plane's bearer token (registration is off without one).
    admin_token: String,
    admin_token_file: std::path::PathBuf,
}

impl Drop for KvindexService {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.admin_token_file);
    }
}

impl KvindexService {
    /// Starts `binary serve` with a bound central SUB and waits for its addresses.
    /// Pod registration is enabled with a bearer token of its own, in a file only this
    /// process's user can read.
    pub fn start(binary: &Path, block_size: usize) -> Result<KvindexService, String> {
        static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let admin_token = format!("kvindex-loadtest-{}-{n}-{nanos:x}", std::process::id());
        let admin_token_file = std::env::temp_dir().join(format!("kvindex-loadtest-token-{}-{n}", std::process::id()));
        write_private(&admin_token_file, &admin_token)?;
        let Serving { process, grpc, http, zmq, .. } = Serve::new(binary)
            .loopback()
            .args(["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", &block_size.to_string()])
            .arg("--admin-token-file")
            .arg(&admin_token_file)
            .start()?;
        Ok(KvindexService {
            grpc_addr: grpc,
            http_addr: http,
            zmq_endpoint: zmq.ok_or("KVINDEX_LISTENING without zmq=")?,
            process,
            admin_token,
            admin_token_file,
        })
    }

    /// Registers a pod with its replay endpoint, so a batch lost before the SUB's subscription
    /// took effect is replayed instead of losing the pod's state.
    pub async fn register_pod(&self, pod: &str, model: &str, replay_endpoint: Option<&str>) -> Result<(), String> {
        let body = serde_json::json!({"pod": pod, "model": model, "replay_endpoint": replay_endpoint});
        let bearer = format!("Bearer {}", self.admin_token);
        let (status, text) =
            http_with(&self.http_addr, "POST", "/pods", Some(&body.to_string()), &[("Authorization", &bearer)]).await?;
        if status != 200 {
            return Err(format!("POST /pods for {pod}: {status} {text}"));
        }
        Ok(())
    }

    /// The file holding the control plane's bearer token: a router in front of this service
    /// needs it for RecordRoute (`kvindex-router --indexer-admin-token-file`).
    pub fn admin_token_file(&self) -> &Path {
        &self.admin_token_file
    }

    /// Every source stream, as `/debug/sources` lists them.
    pub async fn sources(&self) -> Result<Vec<Value>, String> {
        let (status, text) = http(&self.http_addr, "GET", "/debug/sources", None).await?;
        if status != 200 {
            return Err(format!("GET /debug/sources: {status}"));
        }
        let body: Value = serde_json::from_str(&text).map_err(|e| format!("/debug/sources is not JSON: {e}"))?;
        Ok(body["sources"].as_array().cloned().unwrap_or_default())
    }
}

/// Whether the service applied every seq below `next_seq` from `pod`, exactly, according to
/// `sources` (a `/debug/sources` listing). `Err` when the pod is DEGRADED: its scores then
/// under-report, and comparing placements would measure the loss, not routing.
pub fn applied(sources: &[Value], pod: &str, next_seq: u64) -> Result<bool, String> {
    if next_seq == 0 {
        return Ok(true);
    }
    let Some(source) = sources.iter().find(|s| s["pod"] == pod) else {
        return Ok(false);
    };
    let state = source["state"].as_str().unwrap_or("");
    if state == "DEGRADED" {
        return Err(format!("kvindex serve marked {pod} DEGRADED: {source}"));
    }
    // STALE only means silent for a while (an idle pod on the wall clock); its data is still
    // exact.
    Ok(source["last_seq"].as_u64() == Some(next_seq - 1) && matches!(state, "EXACT" | "STALE"))
}

impl KvindexService {
    /// Waits until the service applied every batch below `next_seq` that `pod` published.
    pub async fn wait_applied(&self, pod: &str, next_seq: u64, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if applied(&self.sources().await?, pod, next_seq)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "kvindex serve did not apply {pod}'s batches below seq {next_seq} within {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// The next seq a `kvindex-sim` pod will publish (rank 0), from its `/admin/stats`.
pub async fn sim_next_seq(sim_http: &str) -> Result<u64, String> {
    let (status, text) = http(sim_http, "GET", "/admin/stats", None).await?;
    let stats: Value = serde_json::from_str(&text).map_err(|e| format!("{sim_http}/admin/stats ({status}): {e}"))?;
    stats["ranks"][0]["publisher"]["next_seq"].as_u64().ok_or_else(|| format!("{sim_http}/admin/stats: no next_seq"))
}

/// Writes `text` to a new file at `path` that only this user can read (a token).
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all(text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
}

/// One request with `Connection: close`; returns the status and the (de-chunked) body.
pub async fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String), String> {
    http_with(addr, method, path, body, &[]).await
}

/// [`http`] with extra request headers (e.g. `Authorization`).
pub async fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    let body = body.unwrap_or("");
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.map_err(|e| format!("write to {addr}: {e}"))?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.map_err(|e| format!("read from {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").ok_or_else(|| format!("{addr}: no HTTP response head"))?;
    let status =
        head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("{addr}: no HTTP status"))?;
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    Ok((status, if chunked { dechunk(rest) } else { rest.to_string() }))
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size_line, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size_line.trim(), 16).unwrap_or(0);
        // A size past the end or inside a character ends the body rather than panicking.
        let (Some(chunk), Some(next)) = (after.get(..size), after.get(size..)) else {
            break;
        };
        if size == 0 {
            break;
        }
        out.push_str(chunk);
        rest = next.trim_start_matches("\r\n");
    }
    out
}
