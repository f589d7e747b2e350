//! Attacks on `kvindex serve`, each against the real binary on loopback with an
//! independent peer (raw TCP sockets speaking ZMTP by hand, pyzmq publishers, grpcio, plain
//! HTTP). Each asserts that the process survives with bounded memory, that the attack is
//! refused with a clear error and a counted metric, and that the index still answers
//! correctly afterwards: no pod is credited with a block its publisher does not hold.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use serde_json::json;

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
    assert!(server.process.try_wait().is_none(), "kvindex serve died");
    assert_eq!(server.get("/healthz").0, 200);
}

/// A replay ROUTER answering with a frame header that declares 2^36 bytes
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
    let mut server = kvindex_serve()
        .args([
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--zmq-bind",
            "tcp://127.0.0.1:0",
            "--replay",
            &replay,
        ])
        .start()
        .expect("kvindex serve");
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
    let peak = peak_rss_mib(server.process.pid());
    assert!(peak < 256, "peak RSS {peak} MiB after a frame that declared 64 GiB");

    assert_eq!(server.source("pod-a").unwrap()["state"], "DEGRADED");
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pod-a").0, 0, "blocks from before the unreplayed gap are dropped");
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), "pod-a").0, 0, "the lost batch is not invented");
    assert_eq!(peer.score_pod(MODEL, &chain(2, 4), "pod-a").0, 4, "batches after the gap are applied");
    peer.check(&["a"], MODEL);
    assert!(server.metric("kvindex_clears_total", &["reason=\"replay_unavailable\""]) >= 1.0);
}

/// A central-mode server (the binary, `extra` flags on top) with publisher `a` for pod `pod-a`
/// holding chain 0, and the peer's gRPC client on it.
fn central_with_pod(py: &std::path::PathBuf, extra: &[&str]) -> (ServeProcess, Peer) {
    let mut args = vec!["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--zmq-bind", "tcp://127.0.0.1:0"];
    args.extend_from_slice(extra);
    let server = kvindex_serve().args(&args).start().expect("kvindex serve");
    let mut peer = Peer::start(py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let zmq = server.zmq.clone().unwrap();
    peer.cmd(
        json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": zmq, "topic": format!("kv@pod-a@{MODEL}")}),
    );
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c0", "tokens": chain(0, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    (server, peer)
}

/// `pod-a` still holds exactly chain 0, EXACT, and nothing else is indexed.
fn assert_unchanged(server: &mut ServeProcess, peer: &mut Peer) {
    assert_alive(server);
    peer.check(&["a"], MODEL);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pod-a"), (4, "EXACT".to_string()));
    let pods: Vec<String> = server.sources()["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pod"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pods, ["pod-a"]);
}

/// In the default configuration: registration and unregistration are
/// refused to every client (loopback included) over HTTP and gRPC, and counted.
#[test]
fn attack_registration_is_off_by_default() {
    let Some(py) = python() else { return };
    let (mut server, mut peer) = central_with_pod(&py, &[]);
    let evil = json!({"pod": "pod-a", "model": MODEL, "endpoint": "tcp://127.0.0.1:1"}).to_string();
    for token in [None, Some(ADMIN_TOKEN)] {
        let (status, body) = http_request_as(&server.http, "POST", "/pods", Some(&evil), token);
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("registration is disabled"), "{body}");
        assert_eq!(http_request_as(&server.http, "DELETE", "/pods/pod-a", None, token).0, 403);
    }
    let r = peer.try_cmd(json!({"op": "register", "pod": "pod-a", "model": MODEL, "endpoint": "tcp://127.0.0.1:1"}));
    assert_eq!(r["code"], "PERMISSION_DENIED", "{r}");
    assert_eq!(peer.try_cmd(json!({"op": "unregister", "pod": "pod-a"}))["code"], "PERMISSION_DENIED");
    assert_eq!(server.metric("kvindex_control_denied_total", &["reason=\"disabled\""]), 6.0);
    assert_unchanged(&mut server, &mut peer);
}

/// With a token configured: no token or a wrong one is refused (401 / UNAUTHENTICATED), and
/// even the right one cannot replace or remove a pod the operator configured.
#[test]
fn attack_registration_with_a_wrong_token_or_on_an_operator_pod() {
    let Some(py) = python() else { return };
    let token_file = admin_token_file();
    let operator_pod = format!("pod-op,{MODEL},tcp://127.0.0.1:{}", free_port());
    let (mut server, mut peer) =
        central_with_pod(&py, &["--admin-token-file", token_file.to_str().unwrap(), "--pod", &operator_pod]);
    let evil = json!({"pod": "pod-x", "model": MODEL, "endpoint": "tcp://127.0.0.1:1"}).to_string();
    for token in [None, Some("kvindex-wrong-token-0123456789")] {
        let (status, body) = http_request_as(&server.http, "POST", "/pods", Some(&evil), token);
        assert_eq!(status, 401, "{body}");
        assert_eq!(http_request_as(&server.http, "DELETE", "/pods/pod-op", None, token).0, 401);
    }
    for token in ["", "kvindex-wrong-token-0123456789"] {
        let r = peer.try_cmd(json!({"op": "register", "pod": "pod-x", "model": MODEL, "token": token}));
        assert_eq!(r["code"], "UNAUTHENTICATED", "{r}");
        assert_eq!(
            peer.try_cmd(json!({"op": "unregister", "pod": "pod-op", "token": token}))["code"],
            "UNAUTHENTICATED"
        );
    }
    assert_eq!(server.metric("kvindex_control_denied_total", &["reason=\"missing_token\""]), 4.0);
    assert_eq!(server.metric("kvindex_control_denied_total", &["reason=\"wrong_token\""]), 4.0);
    // The operator's pod is the operator's, token or not.
    let replace = json!({"pod": "pod-op", "model": MODEL, "endpoint": "tcp://127.0.0.1:1"}).to_string();
    assert_eq!(http_request_as(&server.http, "POST", "/pods", Some(&replace), Some(ADMIN_TOKEN)).0, 409);
    assert_eq!(http_request_as(&server.http, "DELETE", "/pods/pod-op", None, Some(ADMIN_TOKEN)).0, 409);
    let r = peer.try_cmd(json!({"op": "unregister", "pod": "pod-op"}));
    assert_eq!(r["code"], "FAILED_PRECONDITION", "{r}");
    let registered = server.sources()["registered_pods"].clone();
    let op = registered.as_array().unwrap().iter().find(|p| p["pod"] == "pod-op").expect("pod-op still registered");
    assert_eq!(op["endpoint"], format!("tcp://127.0.0.1:{}", operator_pod.rsplit(':').next().unwrap()));
    // Names that would forge log lines or bloat metrics are refused, with the token too; a
    // longer one is not even read (over http_max_body_bytes, 64 KiB).
    for (id, refused) in
        [("pod\nINFO forged line".to_string(), 400), ("x".repeat(4096), 400), ("x".repeat(256 << 10), 413)]
    {
        let body = json!({"pod": id, "model": MODEL}).to_string();
        let (status, resp) = http_request_as(&server.http, "POST", "/pods", Some(&body), Some(ADMIN_TOKEN));
        assert_eq!(status, refused, "{}", &resp[..resp.len().min(200)]);
    }
    peer.check(&["a"], MODEL);
    assert_alive(&mut server);
}

/// Central mode: a PUB on another address publishing an existing pod's
/// topic used to be taken for the pod reconnecting (clearing it) and its invented blocks were
/// served as EXACT. Now the topic stays bound to the address it arrived from.
#[test]
fn attack_foreign_publisher_on_a_bound_topic() {
    let Some(py) = python() else { return };
    let (mut server, mut peer) = central_with_pod(&py, &[]);
    // 127.0.0.2 is another address on the loopback interface (libzmq's source;destination form).
    let zmq = server.zmq.clone().unwrap();
    let from_elsewhere = format!("tcp://127.0.0.2:0;{}", zmq.trim_start_matches("tcp://"));
    peer.cmd(json!({"op": "pub_start", "name": "evil", "pod": "pod-a", "connect": from_elsewhere, "topic": format!("kv@pod-a@{MODEL}")}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["evil"]}))["subscribed"], true);
    peer.cmd(json!({"op": "clear", "name": "evil"}));
    peer.cmd(json!({"op": "store", "name": "evil", "chain": "fake", "tokens": chain(9, 4)}));
    wait_until("both foreign messages dropped", 20, || {
        (server.metric("kvindex_topic_conflicts_total", &[]) >= 2.0).then_some(())
    });
    assert_eq!(peer.score_pod(MODEL, &chain(9, 4), "pod-a").0, 0, "invented blocks must not be served");
    assert_eq!(server.source("pod-a").unwrap()["restarts"], 0, "a foreign connection is not a reconnect");
    // The real publisher goes on as before.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c1", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), "pod-a").0, 4);
    assert_unchanged(&mut server, &mut peer);
}

/// The operator's allowlist (`zmq_allow`): a publisher outside it is refused before the
/// handshake and counted; the allowed one is untouched.
#[test]
fn attack_publisher_outside_the_allowlist() {
    let Some(py) = python() else { return };
    let (mut server, mut peer) = central_with_pod(&py, &["--zmq-allow", "127.0.0.1/32"]);
    let zmq = server.zmq.clone().unwrap();
    let from_elsewhere = format!("tcp://127.0.0.2:0;{}", zmq.trim_start_matches("tcp://"));
    peer.cmd(json!({"op": "pub_start", "name": "evil", "pod": "pod-b", "connect": from_elsewhere, "topic": format!("kv@pod-b@{MODEL}")}));
    wait_until("the foreign address refused", 20, || {
        (server.metric("kvindex_zmq_rejected_total", &["reason=\"not_allowed\""]) >= 1.0).then_some(())
    });
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["evil"], "timeout": 1}))["subscribed"], false);
    assert_unchanged(&mut server, &mut peer);
}

/// Handshaken connections from one address are capped (the rest are
/// refused at accept), so a flood can neither lock other publishers out nor starve gRPC and
/// HTTP; topics too long or with control characters never become sources.
#[test]
fn attack_connection_flood_and_junk_topics() {
    let Some(py) = python() else { return };
    let (mut server, mut peer) = central_with_pod(&py, &["--zmq-max-connections-per-source", "8"]);
    let zmq = server.zmq.clone().unwrap();
    let addr = zmq.trim_start_matches("tcp://").to_string();
    let mut flood = Vec::new();
    for _ in 0..40 {
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(5)) else {
            continue;
        };
        let mut hello = greeting();
        hello.extend(ready("PUB"));
        let _ = s.write_all(&hello);
        flood.push(s);
    }
    wait_until("the flood beyond the per-source cap refused", 20, || {
        (server.metric("kvindex_zmq_rejected_total", &["reason=\"source_full\""]) >= 30.0).then_some(())
    });
    // Another address still gets in, and gRPC and HTTP still answer.
    let from_elsewhere = format!("tcp://127.0.0.2:0;{addr}");
    peer.cmd(json!({"op": "pub_start", "name": "b", "pod": "pod-b", "connect": from_elsewhere, "topic": format!("kv@pod-b@{MODEL}")}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["b"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "b", "chain": "b0", "tokens": chain(5, 4)}));
    peer.wait_exact(&server, &["b"], MODEL, "EXACT", 20);
    drop(flood);

    // Junk topics: a newline and an ANSI escape in the id, a 100 KB id.
    let seq = hex(&0u64.to_be_bytes());
    for topic in [format!("kv@evil\n\x1b[31m@{MODEL}"), format!("kv@{}@{MODEL}", "x".repeat(100_000))] {
        peer.cmd(json!({"op": "raw", "name": "a", "frames_hex": [hex(topic.as_bytes()), seq, "90"]}));
    }
    wait_until("junk topics refused", 20, || {
        (server.metric("kvindex_sources_refused_total", &["reason=\"name\""]) >= 2.0).then_some(())
    });
    // The end-of-replay seq on a live message (it overflowed the sequencer's cursor).
    let own_topic = hex(format!("kv@pod-a@{MODEL}").as_bytes());
    peer.cmd(json!({"op": "raw", "name": "a", "frames_hex": [own_topic, hex(&u64::MAX.to_be_bytes()), "90"]}));
    wait_until("the end marker refused", 20, || {
        (server.metric("kvindex_decode_errors_total", &["reason=\"seq_end_marker\""]) >= 1.0).then_some(())
    });
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pod-a"), (4, "EXACT".to_string()));
    let (_, metrics) = server.get("/metrics");
    assert!(metrics.len() < 1 << 20, "/metrics is {} bytes", metrics.len());
    assert!(!metrics.contains("evil"), "a refused topic reached a metric label");
    peer.check(&["a", "b"], MODEL);
    assert_alive(&mut server);
}

/// Junk `medium` names. The tier table has eight slots; a publisher spraying
/// names is stopped at its own allowance (`max_tiers_per_source`), publishers together at the
/// learned share, names that are no tier name are refused, all counted, and the real engine's
/// predefined (STORAGE) and configured (DISK) tiers keep their slots.
#[test]
fn attack_junk_tier_names() {
    let Some(py) = python() else { return };
    let (mut server, mut peer) = central_with_pod(&py, &["--tier-weight", "DISK=0.5"]);
    let zmq = server.zmq.clone().unwrap();
    let skipped = |server: &ServeProcess, reason: &str| {
        server.metric("kvindex_skipped_blocks_total", &[&format!("reason=\"{reason}\"")])
    };
    for (name, first) in [("evil1", 0u32), ("evil2", 100)] {
        let topic = format!("kv@pod-{name}@{MODEL}");
        peer.cmd(
            json!({"op": "pub_start", "name": name, "pod": format!("pod-{name}"), "connect": zmq, "topic": topic}),
        );
        assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": [name]}))["subscribed"], true);
        for i in first..first + 10 {
            let (chain_name, medium) = (format!("j{i}"), format!("junk{i}"));
            peer.cmd(
                json!({"op": "store", "name": name, "chain": chain_name, "tokens": chain(20 + i, 2), "medium": medium}),
            );
        }
        // evil1 learns four names (its allowance) and is refused the other six stores (12
        // blocks). That fills the table (GPU, CPU, STORAGE, DISK and four learned names), so
        // evil2 is refused all ten (20 blocks).
        let want = if first == 0 { 12.0 } else { 12.0 + 20.0 };
        wait_until("a sprayer stopped at its allowance", 20, || {
            (skipped(&server, "source_tier_limit") + skipped(&server, "too_many_tiers") >= want).then_some(())
        });
    }
    assert_eq!(skipped(&server, "source_tier_limit"), 12.0);
    assert_eq!(skipped(&server, "too_many_tiers"), 20.0);
    peer.cmd(
        json!({"op": "store", "name": "evil2", "chain": "bad", "tokens": chain(90, 2), "medium": "x\n\u{1b}[31m"}),
    );
    wait_until("a name that is no tier name refused", 20, || (skipped(&server, "bad_tier_name") >= 2.0).then_some(()));
    // The real engine's tiers all have their slots.
    for (i, medium) in ["STORAGE", "DISK", "CPU"].iter().enumerate() {
        let name = format!("t{i}");
        peer.cmd(
            json!({"op": "store", "name": "a", "chain": name, "tokens": chain(50 + i as u32, 4), "medium": medium}),
        );
    }
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    for (i, medium) in ["STORAGE", "DISK", "CPU"].iter().enumerate() {
        let r = peer.score(MODEL, &chain(50 + i as u32, 4), &["pod-a"]);
        assert_eq!(r["scores"][0]["matched_by_tier"], json!({ *medium: 4 }), "{r}");
    }
    let r = peer.score(MODEL, &chain(51, 4), &["pod-a"]);
    assert_eq!(r["scores"][0]["weighted_score"], json!(2.0), "DISK's configured weight 0.5: {r}");
    let (_, metrics) = server.get("/metrics");
    assert!(!metrics.contains("junk9"), "a refused tier name reached the metrics");
    assert_unchanged_but_for(&mut server, &mut peer, &["pod-a", "pod-evil1", "pod-evil2"]);
}

/// Like [`assert_unchanged`], with more pods allowed in `/debug/sources`.
fn assert_unchanged_but_for(server: &mut ServeProcess, peer: &mut Peer, pods: &[&str]) {
    assert_alive(server);
    peer.check(&["a"], MODEL);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pod-a"), (4, "EXACT".to_string()));
    let mut seen: Vec<String> = server.sources()["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pod"].as_str().unwrap().to_string())
        .collect();
    seen.sort();
    assert_eq!(seen, pods);
}

/// Separate planes: with `--metrics-addr`, `/metrics` and `/debug/*` answer only on
/// the metrics listener; the main HTTP port keeps health, readiness and (token-gated)
/// registration, and answers 404 for the observability routes.
#[test]
fn metrics_and_debug_on_their_own_listener() {
    let server = kvindex_serve()
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
        .start()
        .expect("kvindex serve");
    let metrics = server.metrics.clone().expect("KVINDEX_LISTENING names the metrics listener");
    assert_ne!(metrics, server.http);
    for path in ["/metrics", "/debug/sources"] {
        let (status, body) = http_request(&metrics, "GET", path, None);
        assert_eq!(status, 200, "{path} on the metrics listener: {body}");
        assert_eq!(http_request(&server.http, "GET", path, None).0, 404, "{path} on http_addr");
    }
    assert!(http_request(&metrics, "GET", "/metrics", None)
        .1
        .contains("kvindex_http_invalid_requests_total{reason=\"not_found\"}"));
    assert_eq!(http_request(&server.http, "GET", "/healthz", None).0, 200);
    // Ready once the start-up work is done (nothing to sync here, but the first tick may come
    // after a busy box lets it run).
    wait_until("/readyz on the metrics listener", 30, || {
        (http_request(&metrics, "GET", "/readyz", None).0 == 200).then_some(())
    });
    let body = json!({"pod": "p", "model": MODEL}).to_string();
    assert_eq!(http_request(&server.http, "POST", "/pods", Some(&body)).0, 403, "registration stays off");
    assert_eq!(http_request(&metrics, "POST", "/pods", Some(&body)).0, 404, "no control plane on the metrics port");
    assert_eq!(server.metric("kvindex_control_denied_total", &["reason=\"disabled\""]), 1.0);
}

/// A gRPC request over `max_message_bytes` is refused before it is read with
/// `RESOURCE_EXHAUSTED` (what gRPC specifies; tonic's own answer is `OUT_OF_RANGE`), counted,
/// and the server goes on answering. The client is grpcio.
#[test]
fn attack_oversized_grpc_request() {
    let Some(py) = python() else { return };
    let (mut server, mut peer) = central_with_pod(&py, &["--max-message-bytes", "1024"]);
    for _ in 0..2 {
        let r = peer.try_cmd(json!({"op": "score_raw", "model": MODEL, "n_tokens": 4000}));
        assert_eq!(r["code"], "RESOURCE_EXHAUSTED", "{r}");
        assert!(r["details"].as_str().unwrap().contains("too large"), "{r}");
    }
    assert_eq!(server.metric("kvindex_grpc_rejected_total", &["reason=\"too_large\""]), 2.0);
    // Other errors keep their codes: over max_tokens is INVALID_ARGUMENT.
    let r = peer.try_cmd(json!({"op": "score", "model": MODEL, "tokens": [1], "pods": [""]}));
    assert_eq!(r["code"], "INVALID_ARGUMENT", "{r}");
    assert_unchanged(&mut server, &mut peer);
}

/// Registration's host policy (`--register-allow`). Endpoints outside the
/// allowed ranges, names resolving outside them, and `ipc://` paths are refused (403 /
/// PERMISSION_DENIED, counted) before anything is dialled; an allowed name is pinned to the
/// address that was checked.
#[test]
fn attack_registration_naming_a_host_outside_the_policy() {
    let Some(py) = python() else { return };
    let token_file = admin_token_file();
    let (mut server, mut peer) = central_with_pod(
        &py,
        &["--admin-token-file", token_file.to_str().unwrap(), "--register-allow", "127.0.0.2/32"],
    );
    let port = free_port();
    for (endpoint, replay) in [
        (format!("tcp://127.0.0.1:{port}"), None),
        (format!("tcp://localhost:{port}"), None),
        (format!("tcp://127.0.0.2:{port}"), Some("tcp://10.1.2.3:5558".to_string())),
        ("ipc:///tmp/kvindex-evil.sock".to_string(), None),
    ] {
        let body = json!({"pod": "pod-x", "model": MODEL, "endpoint": endpoint, "replay_endpoint": replay}).to_string();
        let (status, resp) = http_request_as(&server.http, "POST", "/pods", Some(&body), Some(ADMIN_TOKEN));
        assert_eq!(status, 403, "{endpoint}: {resp}");
        assert!(resp.contains("register_allow"), "{resp}");
    }
    let r = peer.try_cmd(
        json!({"op": "register", "pod": "pod-y", "model": MODEL, "endpoint": format!("tcp://127.0.0.1:{port}")}),
    );
    assert_eq!(r["code"], "PERMISSION_DENIED", "{r}");
    assert_eq!(server.metric("kvindex_control_denied_total", &["reason=\"host_not_allowed\""]), 5.0);
    let registered = server.sources()["registered_pods"].clone();
    assert!(registered.as_array().unwrap().iter().all(|p| p["pod"] != "pod-x" && p["pod"] != "pod-y"), "{registered}");
    // Inside the policy: registered, at the checked address.
    let body = json!({"pod": "pod-z", "model": MODEL, "endpoint": format!("tcp://127.0.0.2:{port}")}).to_string();
    let (status, resp) = http_request_as(&server.http, "POST", "/pods", Some(&body), Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{resp}");
    let registered = server.sources()["registered_pods"].clone();
    let z = registered.as_array().unwrap().iter().find(|p| p["pod"] == "pod-z").expect("pod-z registered").clone();
    assert_eq!(z["endpoint"], format!("tcp://127.0.0.2:{port}"));
    peer.check(&["a"], MODEL);
    assert_alive(&mut server);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
