//! A scripted HTTP/1.1 pod on a raw loopback socket, for behaviours a simulator cannot be told
//! to show: a recorded response replayed byte for byte and held after its first chunk, a pod
//! that hangs, closes before answering, or dies mid-stream. It records every request (path,
//! headers, body), serves a settable vLLM `/metrics`, and reports when a client closed its
//! connection (the router cancelling upstream).

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

#[derive(Clone)]
pub enum Script {
    /// `head` (status line and headers, chunked), then each chunk as one HTTP chunk; with a
    /// gate, the rest waits after the first chunk until the gate opens.
    Replay { head: Vec<u8>, chunks: Vec<Vec<u8>>, gate: Option<Arc<Notify>> },
    /// Reads the request and never answers.
    Hang,
    /// Closes the connection once the request is read, without a byte.
    Close,
    /// Sends the head and one chunk, then closes.
    Partial { head: Vec<u8>, chunk: Vec<u8> },
    /// 200 with `{"pod": <name>}`.
    Echo(String),
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

pub struct FakePod {
    pub addr: String,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    /// The `/metrics` body served.
    pub metrics: Arc<Mutex<String>>,
    /// Notified whenever a peer closes a connection that has a POST pending or streaming.
    pub closed: Arc<Notify>,
    pub script: Arc<Mutex<Script>>,
}

pub fn vllm_metrics(waiting: f64, running: f64, kv_usage: f64) -> String {
    format!(
        "vllm:num_requests_waiting{{engine=\"0\"}} {waiting}\nvllm:num_requests_running{{engine=\"0\"}} {running}\nvllm:kv_cache_usage_perc{{engine=\"0\"}} {kv_usage}\n"
    )
}

impl FakePod {
    pub async fn start(script: Script) -> FakePod {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let pod = FakePod {
            addr: listener.local_addr().expect("addr").to_string(),
            requests: Arc::default(),
            metrics: Arc::new(Mutex::new(vllm_metrics(0.0, 0.0, 0.0))),
            closed: Arc::new(Notify::new()),
            script: Arc::new(Mutex::new(script)),
        };
        let (requests, metrics, closed, script) =
            (pod.requests.clone(), pod.metrics.clone(), pod.closed.clone(), pod.script.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (requests, metrics, closed, script) =
                    (requests.clone(), metrics.clone(), closed.clone(), script.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, requests, metrics, closed, script).await;
                });
            }
        });
        pod
    }

    /// `<addr>=http://<addr>` (the pod id is its address).
    pub fn spec(&self) -> String {
        format!("{}=http://{}", self.addr, self.addr)
    }

    pub fn posts(&self) -> Vec<Recorded> {
        self.requests.lock().iter().filter(|r| r.path != "/metrics").cloned().collect()
    }
}

/// Reads one request; `None` at a clean end of the connection.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<Option<Recorded>> {
    let head_end = loop {
        if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("").to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length =
        headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse::<usize>().ok()).unwrap_or(0);
    let start = head_end + 4;
    while buffer.len() < start + length {
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[start..start + length].to_vec();
    buffer.drain(..start + length);
    Ok(Some(Recorded { path, headers, body }))
}

/// Resolves when the peer closes the connection (reads until EOF or an error).
async fn peer_closed(stream: &mut TcpStream) {
    let mut sink = [0u8; 1024];
    loop {
        match stream.read(&mut sink).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

async fn chunk(stream: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    stream.write_all(format!("{:x}\r\n", data.len()).as_bytes()).await?;
    stream.write_all(data).await?;
    stream.write_all(b"\r\n").await?;
    stream.flush().await
}

async fn serve(
    mut stream: TcpStream,
    requests: Arc<Mutex<Vec<Recorded>>>,
    metrics: Arc<Mutex<String>>,
    closed: Arc<Notify>,
    script: Arc<Mutex<Script>>,
) -> std::io::Result<()> {
    let mut buffer = Vec::new();
    while let Some(request) = read_request(&mut stream, &mut buffer).await? {
        let is_metrics = request.path == "/metrics";
        requests.lock().push(request);
        if is_metrics {
            let body = metrics.lock().clone();
            let reply =
                format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            stream.write_all(reply.as_bytes()).await?;
            continue;
        }
        let current = script.lock().clone();
        match current {
            Script::Echo(name) => {
                let body = format!("{{\"pod\":\"{name}\"}}");
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(reply.as_bytes()).await?;
            }
            Script::Close => return Ok(()),
            Script::Hang => {
                peer_closed(&mut stream).await;
                closed.notify_one();
                return Ok(());
            }
            Script::Partial { head, chunk: first } => {
                stream.write_all(&head).await?;
                chunk(&mut stream, &first).await?;
                return Ok(());
            }
            Script::Replay { head, chunks, gate } => {
                stream.write_all(&head).await?;
                for (i, data) in chunks.iter().enumerate() {
                    chunk(&mut stream, data).await?;
                    if let (0, Some(gate)) = (i, &gate) {
                        tokio::select! {
                            _ = gate.notified() => {}
                            _ = peer_closed(&mut stream) => {
                                closed.notify_one();
                                return Ok(());
                            }
                        }
                    }
                }
                stream.write_all(b"0\r\n\r\n").await?;
            }
        }
    }
    Ok(())
}
