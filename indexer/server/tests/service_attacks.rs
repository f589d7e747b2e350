//! Attacks on `kvindex serve` (issue 9), each against the real binary on loopback with an
//! independent peer (raw TCP sockets speaking ZMTP by hand, pyzmq publishers, grpcio, plain
//! HTTP). Each asserts that the process survives with bounded memory, that the attack is
//! refused with a clear error and a counted metric, and that the index still answers
//! correctly afterwards: no pod is credited with a block its publisher does not hold.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::*;

const MODEL: &str = "m";

/// Our ZMTP 3.1 greeting (NULL mechanism, not as-server), written by hand: the hostile peers
/// here are raw sockets, independent of any ZeroMQ implementation.
fn greeting() -> Vec<u8> {
    let mut g = vec![0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[11] = 1;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// A READY command announcing `socket_type`.
fn ready(socket_type: &str) -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    let mut cmd = vec![0x04, body.len() as u8];
    cmd.extend_from_slice(&body);
    cmd
}

/// The header of a frame that declares `len` bytes (long form, MORE set) and sends none.
fn huge_frame_header(len: u64) -> Vec<u8> {
    let mut h = vec![0x03];
    h.extend_from_slice(&len.to_be_bytes());
    h
}

/// A hostile replay ROUTER: every connection gets a greeting, a READY and then `reply` (raw
/// bytes); it is then read until the other side closes it.
struct HostileRouter {
    endpoint: String,
    connections: Arc<AtomicUsize>,
    closed_by_peer: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl HostileRouter {
    fn start(reply: Vec<u8>) -> HostileRouter {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let closed_by_peer = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, closed, s) = (connections.clone(), closed_by_peer.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                c.fetch_add(1, Ordering::Relaxed);
                stream.set_nonblocking(false).unwrap();
                let mut out = greeting();
                out.extend(ready("ROUTER"));
                out.extend(&reply);
                let _ = stream.write_all(&out);
                if drain_until_closed(&mut stream, Duration::from_secs(20)) {
                    closed.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        HostileRouter { endpoint, connections, closed_by_peer, stop }
    }
}

impl Drop for HostileRouter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads and discards until the peer closes (true) or `limit` passes (false).
fn drain_until_closed(stream: &mut TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// Peak resident memory of a process, in MiB (VmHWM).
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
}

fn assert_alive(server: &mut ServeProcess) {
    assert!(server.child.try_wait().unwrap().is_none(), "kvindex serve died");
    assert_eq!(server.get("/healthz").0, 200);
}

/// Issue 9, item 1: a replay ROUTER answering with a frame header that declares 2^36 bytes
/// aborted the process (the `zeromq` crate allocated what the header declared). Now the
/// header is refused, the replay fails with a counted reason, the pod is degraded (its
/// pre-gap blocks dropped, not guessed) and everything else goes on.
#[test]
fn attack_replay_router_declaring_a_huge_frame() {
    let Some(py) = python() else { return };
    let mut reply = vec![0x01, 0x00]; // the empty delimiter frame, MORE set
    reply.extend(huge_frame_header(1 << 36));
    let router = HostileRouter::start(reply);
    let replay = format!("pod-a={}", router.endpoint);
    let mut server = ServeProcess::start(
        &[
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--zmq-bind",
            "tcp://127.0.0.1:0",
            "--replay",
            &replay,
        ],
        &[],
    );
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let zmq = server.zmq.clone().unwrap();
    peer.cmd(
        json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": zmq, "topic": format!("kv@pod-a@{MODEL}")}),
    );
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c0", "tokens": chain(0, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);

    // Seq 1 is lost: seq 2 reveals the gap and the replay goes to the hostile ROUTER.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "lost", "tokens": chain(1, 4), "drop": true}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c2", "tokens": chain(2, 4)}));
    peer.settle(&server, &["a"]);
    wait_until("the refused replay is counted", 20, || {
        (server.metric("kvindex_zmq_errors_total", &["operation=\"replay\"", "reason=\"frame_too_large\""]) >= 1.0)
            .then_some(())
    });
    assert!(router.connections.load(Ordering::Relaxed) >= 1);
    wait_until("the hostile ROUTER's connection is closed by the server", 20, || {
        (router.closed_by_peer.load(Ordering::Relaxed) >= 1).then_some(())
    });
    assert_alive(&mut server);
    let peak = peak_rss_mib(server.child.id());
    assert!(peak < 256, "peak RSS {peak} MiB after a frame that declared 64 GiB");

    assert_eq!(server.source("pod-a").unwrap()["state"], "DEGRADED");
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pod-a").0, 0, "blocks from before the unreplayed gap are dropped");
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), "pod-a").0, 0, "the lost batch is not invented");
    assert_eq!(peer.score_pod(MODEL, &chain(2, 4), "pod-a").0, 4, "batches after the gap are applied");
    peer.check(&["a"], MODEL);
    assert!(server.metric("kvindex_clears_total", &["reason=\"replay_unavailable\""]) >= 1.0);
}
