//! The server crate's test support: the service started in process on loopback ports 0
//! ([`Server`], through `kvindex_server::run`) or as the `kvindex` binary ([`kvindex_serve`], the
//! testkit's launcher, for the tests of the binary itself), the independent Python peers
//! (`tests/python/kvpeer.py`: pyzmq publishers, msgspec encoder, grpcio client), a small HTTP
//! client, the vLLM vectors and the reference model of what an engine holds.
//!
//! Python comes from `KVINDEX_PYTHON` (set by `source scripts/env.sh`; `bash scripts/setup.sh`
//! installs it). Without it a test is skipped with a message, except under `CI`, where it fails.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvindex_testkit::json_peer::line_reader;
use serde_json::{json, Value};

#[path = "../../../../tests/it/support/reference.rs"]
pub mod reference;
pub mod sglang;
#[path = "../../../../tests/it/support/vectors.rs"]
pub mod vectors;
#[allow(unused_imports)] // not every test uses the vectors
pub use vectors::*;

/// Runs `kvindex <args>` with `input` on its stdin to a successful end: its stdout, one JSON
/// value per line (`kvindex decode`, `vllm-hash`, `sglang-hash`).
pub fn kvindex_json_lines(args: &[&str], input: Vec<u8>) -> Vec<Value> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn kvindex");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "kvindex {args:?} failed");
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

pub fn workspace() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The Python interpreter with pyzmq, msgspec and grpcio, or `None` (skip) outside CI.
pub fn python() -> Option<PathBuf> {
    kvindex_testkit::env::python_with(&["zmq", "msgspec", "grpc", "grpc_tools"])
}

/// Polls `f` until it returns `Some`, for at most `secs` seconds.
pub fn wait_until<T>(what: &str, secs: u64, f: impl FnMut() -> Option<T>) -> T {
    kvindex_testkit::wait::until(what, Duration::from_secs(secs), f)
}

/// The Python peer process (`tests/python/kvpeer.py`), driven one JSON line a command.
pub struct Peer(kvindex_testkit::json_peer::JsonPeer);

impl Peer {
    pub fn start(python: &PathBuf) -> Peer {
        Self::start_script(python, "kvpeer.py")
    }

    /// A peer from another script of `tests/python/` (one that extends kvpeer.py's ops).
    pub fn start_script(python: &PathBuf, script: &str) -> Peer {
        Self::start_script_with(python, script, &[])
    }

    /// [`Peer::start_script`] with extra environment (e.g. `PYTHONPATH` choosing an SGLang
    /// release's install).
    pub fn start_script_with(python: &PathBuf, script: &str, env: &[(&str, &std::ffi::OsStr)]) -> Peer {
        let script = workspace().join("indexer/server/tests/python").join(script);
        let proto = workspace().join("proto/kvindex/v1/indexer.proto");
        let mut command = Command::new(python);
        command.arg(script).arg(proto).env("KVPEER_ADMIN_TOKEN", ADMIN_TOKEN);
        command.envs(env.iter().copied());
        Peer(kvindex_testkit::json_peer::JsonPeer::start(&mut command))
    }

    /// A peer whose gRPC client is connected to `server`.
    pub fn with_grpc(python: &PathBuf, server: &Server) -> Peer {
        let mut peer = Peer::start(python);
        peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
        peer
    }

    /// Sends a command; returns the reply whether or not it succeeded.
    pub fn try_cmd(&mut self, cmd: Value) -> Value {
        self.0.try_cmd(cmd)
    }

    /// Sends a command that must succeed.
    pub fn cmd(&mut self, cmd: Value) -> Value {
        self.0.cmd(cmd)
    }

    /// ScoreTokens for `tokens` and one token more: the engine computes a prompt's last token,
    /// so only then can every block of `tokens` be credited (what a test of what a pod holds
    /// asks). [`score_exactly`](Self::score_exactly) asks for `tokens` alone.
    pub fn score(&mut self, model: &str, tokens: &[u32], pods: &[&str]) -> Value {
        self.score_exactly(model, &[tokens, &[0]].concat(), pods)
    }

    /// ScoreTokens for the prompt `tokens`.
    pub fn score_exactly(&mut self, model: &str, tokens: &[u32], pods: &[&str]) -> Value {
        self.cmd(json!({"op": "score", "model": model, "tokens": tokens, "pods": pods}))
    }

    /// The matched blocks and state of `pod` for `tokens` (filtered query).
    pub fn score_pod(&mut self, model: &str, tokens: &[u32], pod: &str) -> (u64, String) {
        let r = self.score(model, tokens, &[pod]);
        let s = &r["scores"][0];
        (s["matched_blocks"].as_u64().unwrap(), s["state"].as_str().unwrap().to_string())
    }

    /// Runs the no-false-positive check for these publishers; panics on any violation.
    /// Call it once the indexer has caught up ([`Peer::settle`]): a loss is only visible to
    /// the indexer when a later message arrives.
    pub fn check(&mut self, names: &[&str], model: &str) -> Value {
        let r = self.cmd(json!({"op": "check", "names": names, "model": model}));
        assert_eq!(r["violations"], json!([]), "a pod was credited with a block its publisher does not hold: {r}");
        r
    }

    /// Waits until the indexer has applied (or accounted for) every publisher's last seq.
    pub fn settle(&mut self, server: &impl Admin, names: &[&str]) {
        assert!(
            self.try_settle(server, names, 30),
            "timed out after 30s waiting for the indexer to catch up with {names:?}"
        );
    }

    /// [`Peer::settle`] that reports a timeout instead of failing.
    pub fn try_settle(&mut self, server: &impl Admin, names: &[&str], secs: u64) -> bool {
        let info = self.cmd(json!({"op": "info", "names": names}));
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let caught_up = names.iter().all(|n| {
                let p = &info["pubs"][n];
                server
                    .source(p["pod"].as_str().unwrap())
                    .is_some_and(|s| s["last_seq"] == p["last_seq"] && s["state"] != "REPLAYING")
            });
            if caught_up {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every named publisher's pod is caught up, in `state` and credited exactly;
    /// checks that nothing is over-credited.
    pub fn wait_exact(&mut self, server: &impl Admin, names: &[&str], model: &str, state: &str, secs: u64) -> Value {
        self.settle(server, names);
        wait_until(&format!("{names:?} {state} and exact"), secs, || {
            let r = self.check(names, model);
            let states_ok = r["states"].as_object().is_some_and(|m| !m.is_empty() && m.values().all(|s| s == state));
            (states_ok && r["mismatches"] == json!([])).then_some(r)
        })
    }
}

/// A `kvindex serve` running in this process (`kvindex_server::run` on its own runtime and
/// thread), on loopback ports 0; shut down gracefully when dropped.
pub struct Server {
    pub grpc: String,
    pub http: String,
    pub zmq: Option<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), kvindex_server::ServerError>>>,
}

impl Server {
    /// `args` are `kvindex serve` flags, on top of loopback gRPC and HTTP addresses on port 0.
    pub fn start(args: &[&str]) -> Server {
        Self::try_start(args).unwrap_or_else(|e| panic!("kvindex serve did not start: {e}"))
    }

    /// Central mode (the SUB bound on a loopback port 0) with block size 16, then `extra`.
    pub fn central(extra: &[&str]) -> Server {
        let mut args = vec!["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"];
        args.extend_from_slice(extra);
        Server::start(&args)
    }

    pub fn try_start(args: &[&str]) -> Result<Server, String> {
        init_logs();
        let token_file = admin_token_file();
        let mut argv = vec!["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"];
        if !args.contains(&"--admin-token-file") {
            argv.extend_from_slice(&["--admin-token-file", token_file.to_str().unwrap()]);
        }
        argv.extend_from_slice(args);
        let config = kvindex_server::Config::from_args(&argv).map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
        let listeners = runtime.block_on(kvindex_server::bind(&config)).map_err(|e| e.to_string())?;
        let grpc = listeners.grpc_addr().to_string();
        let http = listeners.http_addr().to_string();
        let zmq = listeners.zmq_endpoint().map(str::to_string);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kvindex-serve".into())
            .spawn(move || {
                runtime.block_on(kvindex_server::run(config, listeners, async {
                    let _ = stopped.await;
                }))
            })
            .map_err(|e| e.to_string())?;
        Ok(Server { grpc, http, zmq, stop: Some(stop), thread: Some(thread) })
    }

    /// The central SUB endpoint, as a dialable address.
    pub fn zmq(&self) -> String {
        self.zmq.clone().expect("central mode")
    }
}

impl Admin for Server {
    fn http_addr(&self) -> &str {
        &self.http
    }
}

impl Admin for ServeProcess {
    /// The metrics listener when there is one (it serves `/metrics` and `/debug/*`).
    fn http_addr(&self) -> &str {
        self.metrics.as_deref().unwrap_or(&self.http)
    }
}

/// The HTTP admin of a running server (in process or a child), for assertions.
pub trait Admin {
    fn http_addr(&self) -> &str;

    /// A plain HTTP/1.1 request to the admin server with the test's bearer token:
    /// (status, body).
    fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        http_request_as(self.http_addr(), method, path, body, Some(ADMIN_TOKEN))
    }

    fn get(&self, path: &str) -> (u16, String) {
        self.http("GET", path, None)
    }

    fn sources(&self) -> Value {
        let (status, body) = self.get("/debug/sources");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The debug entry of the stream whose (DP-resolved) pod id is `pod`.
    fn source(&self, pod: &str) -> Option<Value> {
        self.sources()["sources"].as_array()?.iter().find(|s| s["pod"] == pod).cloned()
    }

    /// Sum of every sample of `name` whose label set contains all of `labels` (`k="v"`).
    fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        kvindex_testkit::prometheus::sum(&self.get("/metrics").1, name, labels)
    }
}

/// The bearer token of the servers the tests start (`--admin-token-file`, see
/// [`admin_token_file`]); the Python peer presents it too (`KVPEER_ADMIN_TOKEN`).
pub const ADMIN_TOKEN: &str = "kvindex-test-admin-token-0123456789";

/// A file holding [`ADMIN_TOKEN`], written once per test process.
pub fn admin_token_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("kvindex-test-admin-token-{}", std::process::id()));
        std::fs::write(&path, ADMIN_TOKEN).unwrap();
        path
    })
    .clone()
}

/// A plain HTTP/1.1 request without credentials (no client crate needed): (status, body).
pub fn http_request(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    http_request_as(addr, method, path, body, None)
}

/// A plain HTTP/1.1 request presenting `token` as a bearer token, if any: (status, body).
pub fn http_request_as(addr: &str, method: &str, path: &str, body: Option<&str>, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect http");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = body.unwrap_or("");
    let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        addr,
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read http");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        kvindex_testkit::http::dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) if !std::thread::panicking() => panic!("kvindex serve failed: {e}"),
                Ok(Err(e)) => eprintln!("kvindex serve failed: {e}"),
                Err(_) => eprintln!("kvindex serve panicked"),
            }
        }
    }
}

/// Logs of in-process servers go to the test's output (`RUST_LOG`, default info).
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().with_ansi(false).try_init();
}

/// A `kvindex serve` child process, for the tests of the binary itself: the testkit's launcher
/// (its addresses read back from its `KVINDEX_LISTENING` line, killed when dropped).
pub use kvindex_testkit::serve::Serving as ServeProcess;

/// This crate's `kvindex serve`, logging at `$RUST_LOG` (default info) to the test's output;
/// the caller adds the flags and starts it.
pub fn kvindex_serve() -> kvindex_testkit::serve::Serve {
    kvindex_testkit::serve::Serve::new(env!("CARGO_BIN_EXE_kvindex"))
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .logging()
}

/// Runs `kvindex serve` with `args`, expecting it to refuse to start: waits at most `secs`
/// for it to exit and returns its exit status and its stderr. Panics if it announces that it
/// listens (it started after all) or is still running at the deadline.
pub fn serve_refused(args: &[&str], secs: u64) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .arg("serve")
        .args(args)
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvindex");
    let stdout = line_reader(child.stdout.take().unwrap());
    let stderr = line_reader(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut err = String::new();
    let drain = |err: &mut String| {
        while let Ok(line) = stderr.try_recv() {
            eprintln!("{line}");
            err.push_str(&line);
            err.push('\n');
        }
    };
    let status = loop {
        drain(&mut err);
        if let Some(line) = stdout.try_iter().find(|l| l.starts_with("KVINDEX_LISTENING ")) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvindex serve started ({line}) where it should have refused to; stderr:\n{err}");
        }
        if let Some(status) = child.try_wait().expect("wait for kvindex") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvindex serve still running after {secs}s; stderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The pipe's last lines: the reader thread ends at EOF, after the process exits.
    let until = Instant::now() + Duration::from_secs(5);
    while let Ok(line) = stderr.recv_timeout(until.saturating_duration_since(Instant::now())) {
        eprintln!("{line}");
        err.push_str(&line);
        err.push('\n');
    }
    (status, err)
}

/// `pod`'s entry in the `/debug/sources` of the server whose HTTP address is `http`.
pub fn debug_source(http: &str, pod: &str) -> Option<Value> {
    let (status, body) = http_request(http, "GET", "/debug/sources", None);
    if status != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&body).ok()?;
    v["sources"].as_array()?.iter().find(|s| s["pod"] == pod).cloned()
}

/// Sum of the samples of `name` with all of `labels` in the `/metrics` of the server at `http`.
pub fn http_metric(http: &str, name: &str, labels: &[&str]) -> f64 {
    kvindex_testkit::prometheus::sum(&http_request(http, "GET", "/metrics", None).1, name, labels)
}

/// Distinct token ids for test chain `k` (of `blocks` blocks of 16).
pub fn chain(k: u32, blocks: usize) -> Vec<u32> {
    (0..blocks as u32 * 16).map(|j| 1 + k * 10_000 + j).collect()
}

#[allow(unused_imports)] // not every test binary that includes this module starts a server on a chosen port
pub use kvindex_testkit::ports::free_port;
