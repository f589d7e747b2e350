//! A real `kvindex serve` child process for the policy driver: started on loopback with
//! OS-assigned ports, its addresses read from the `KVINDEX_LISTENING` line, killed on drop.
//!
//! It exists so the precise policy can be measured through the product itself (central ZeroMQ
//! SUB, sequencer, apply queue, gRPC `ScoreTokens`) rather than only through the in-process
//! `KvIndex`. The small HTTP/1.1 client is here because the driver needs one GET
//! (`/debug/sources`) and one POST (`/pods`) on 127.0.0.1, not a general HTTP stack.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long the service may take to report its addresses (a debug build on a loaded box).
const START_DEADLINE: Duration = Duration::from_secs(60);

/// A running `kvindex serve`; the process is killed and reaped on drop.
pub struct KvindexService {
    child: Child,
    /// `host:port` of the gRPC server.
    pub grpc_addr: String,
    /// `host:port` of the HTTP admin server.
    pub http_addr: String,
    /// The central SUB's bound endpoint (`tcp://127.0.0.1:<port>`) that publishers dial.
    pub zmq_endpoint: String,
}

impl Drop for KvindexService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl KvindexService {
    /// Starts `binary serve` with a bound central SUB and waits for its addresses.
    pub fn start(binary: &Path, block_size: usize) -> Result<KvindexService, String> {
        let mut child = Command::new(binary)
            .args(["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--zmq-bind", "tcp://127.0.0.1:0", "--block-size"])
            .arg(block_size.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("kvindex serve: no stdout pipe".into());
        };
        let (lines, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Keeps draining after the first line so a chatty child never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let mut service =
            KvindexService { child, grpc_addr: String::new(), http_addr: String::new(), zmq_endpoint: String::new() };
        loop {
            let line = received.recv_timeout(START_DEADLINE).map_err(|_| {
                format!("{} did not print KVINDEX_LISTENING within {START_DEADLINE:?}", binary.display())
            })?;
            let Some(rest) = line.strip_prefix("KVINDEX_LISTENING ") else {
                continue;
            };
            for pair in rest.split_whitespace() {
                match pair.split_once('=') {
                    Some(("grpc", value)) => service.grpc_addr = value.to_string(),
                    Some(("http", value)) => service.http_addr = value.to_string(),
                    Some(("zmq", value)) => service.zmq_endpoint = value.to_string(),
                    _ => {}
                }
            }
            if service.grpc_addr.is_empty() || service.http_addr.is_empty() || service.zmq_endpoint.is_empty() {
                return Err(format!("unexpected KVINDEX_LISTENING line: {line}"));
            }
            return Ok(service);
        }
    }

    /// Registers a pod with its replay endpoint, so a batch lost before the SUB's subscription
    /// took effect is replayed instead of losing the pod's state.
    pub async fn register_pod(&self, pod: &str, model: &str, replay_endpoint: Option<&str>) -> Result<(), String> {
        let body = serde_json::json!({"pod": pod, "model": model, "replay_endpoint": replay_endpoint});
        let (status, text) = http(&self.http_addr, "POST", "/pods", Some(&body.to_string())).await?;
        if status != 200 {
            return Err(format!("POST /pods for {pod}: {status} {text}"));
        }
        Ok(())
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

/// One HTTP/1.1 request with `Connection: close`; returns the status and the (de-chunked)
/// body. Also the loadtest tests' client.
pub async fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
