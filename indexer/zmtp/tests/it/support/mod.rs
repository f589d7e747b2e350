//! Shared harness of kvindex-zmtp's tests: the Python peer process (`tests/python/zmtppeer.py`:
//! pyzmq sockets and raw-socket ZMTP peers), a runtime for our sockets, and waits on events
//! with deadlines.
//!
//! Python comes from `KVINDEX_PYTHON` (set by `source scripts/env.sh`; `bash scripts/setup.sh`
//! installs it). Without it a test is skipped with a message, except under `CI`, where it fails.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use kvindex_zmtp::{Event, Limits, SubDialer, SubListener};
use serde_json::{json, Value};
use tokio::runtime::Runtime;

/// The Python interpreter with pyzmq, or `None` (skip) outside CI.
pub fn python() -> Option<PathBuf> {
    kvindex_testkit::env::python_with(&["zmq"])
}

/// The Python peer process (`tests/python/zmtppeer.py`), driven one JSON line a command;
/// killed when dropped.
pub struct Peer(kvindex_testkit::json_peer::JsonPeer);

impl Peer {
    /// Starts the peer, or `None` when the test is skipped (see [`python`]).
    pub fn start() -> Option<Peer> {
        let mut command = Command::new(python()?);
        command.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/zmtppeer.py"));
        Some(Peer(kvindex_testkit::json_peer::JsonPeer::start(&mut command)))
    }

    /// Sends a command; returns the reply whether or not it succeeded.
    pub fn try_cmd(&mut self, cmd: Value) -> Value {
        self.0.try_cmd(cmd)
    }

    /// Sends a command that must succeed.
    pub fn cmd(&mut self, cmd: Value) -> Value {
        self.0.cmd(cmd)
    }

    /// Publishes `n` messages `[topic, seq, payload]` from pyzmq publisher `name`.
    pub fn publish(&mut self, name: &str, topic: &str, n: u64) -> u64 {
        self.cmd(json!({"op": "publish", "name": name, "topic": topic, "n": n}))["last_seq"].as_u64().unwrap()
    }

    /// Waits until publisher `name` has seen `n` subscriptions; returns them (hex).
    pub fn wait_subs(&mut self, name: &str, n: usize) -> Vec<String> {
        let r = self.cmd(json!({"op": "wait_subs", "name": name, "n": n}));
        let subs: Vec<String> = r["subs"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
        assert_eq!(subs.len(), n, "publisher {name} saw {subs:?}");
        subs
    }
}

/// A runtime for our sockets; the test thread blocks on the Python peer meanwhile.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Small bounds so the fault tests finish fast.
pub fn quick_limits() -> Limits {
    Limits {
        handshake_timeout: Duration::from_millis(1500),
        heartbeat_interval: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(1000),
        ..Limits::default()
    }
}

/// Either kind of SUB socket.
pub enum Sub {
    Listener(SubListener),
    Dialer(SubDialer),
}

impl Sub {
    async fn recv(&mut self) -> Option<Event> {
        match self {
            Sub::Listener(l) => l.recv().await,
            Sub::Dialer(d) => d.recv().await,
        }
    }

    pub fn bytes_in_flight(&self) -> usize {
        match self {
            Sub::Listener(l) => l.bytes_in_flight(),
            Sub::Dialer(d) => d.bytes_in_flight(),
        }
    }

    /// The next event, panicking after `secs`.
    pub fn next(&mut self, rt: &Runtime, secs: u64) -> Event {
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(secs), self.recv()).await })
            .unwrap_or_else(|_| panic!("no event within {secs}s"))
            .expect("socket tasks ended")
    }

    /// Skips events until `pick` returns `Some`, panicking after `secs`; returns what it picked
    /// and the events skipped on the way.
    pub fn wait_for<T>(
        &mut self,
        rt: &Runtime,
        secs: u64,
        what: &str,
        mut pick: impl FnMut(&Event) -> Option<T>,
    ) -> (T, Vec<Event>) {
        let mut skipped = Vec::new();
        let found = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(secs), async {
                loop {
                    let event = self.recv().await.expect("socket tasks ended");
                    if let Some(t) = pick(&event) {
                        return t;
                    }
                    skipped.push(event);
                }
            })
            .await
        });
        match found {
            Ok(t) => (t, skipped),
            Err(_) => panic!("timed out after {secs}s waiting for {what}; got {skipped:#?}"),
        }
    }

    /// Collects events for `window`, for asserting that something does not happen.
    pub fn drain_for(&mut self, rt: &Runtime, window: Duration) -> Vec<Event> {
        let mut out = Vec::new();
        rt.block_on(async {
            let _ = tokio::time::timeout(window, async {
                while let Some(e) = self.recv().await {
                    out.push(e);
                }
            })
            .await;
        });
        out
    }
}

/// This process's peak resident set, in KiB (VmHWM).
pub fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A fresh path for an `ipc://` socket.
pub fn ipc_path(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("kvindex-zmtp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    format!("ipc://{}/{name}.sock", dir.display())
}
