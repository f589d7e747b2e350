//! The HTTP admin listener holds its bounds against a hostile client,
//! on the real `kvindex serve` binary over loopback TCP: a client that trickles its
//! request head is cut off after `http_header_timeout_ms`, a silent one too, and an idle
//! keep-alive connection is closed after as long (not counted as a refusal); a registration
//! body that stalls gets 408 after `http_body_timeout_ms`; at `http_max_connections` (and per
//! address, per network) the oldest idle connection is closed to make room, and a newcomer is
//! closed at accept only when every connection under the cap is being answered; silent
//! connections from a few addresses do not keep `/healthz` out, and the probe listener
//! (`probe_addr`) answers while the main one is full; a body over `http_max_body_bytes` gets
//! 413 (declared or streamed), all bodies over `http_max_inflight_body_bytes` get 503, a head
//! over 32 KiB 431, each counted in `kvindex_http_refused_total{reason}`. Without the token no
//! body is read at all. A client that stops reading its answers is cut off after
//! `http_write_timeout_ms`.
//!
//! The bounds are set through their env vars, which a server without them ignores: against
//! such a server every test here fails on the behaviour, not on a flag it does not know.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::*;

const DEADLINE: Duration = Duration::from_secs(20);

/// `kvindex serve` with a metrics listener of its own (so that scraping is not subject to the
/// main listener's caps) and the test's admin token, with `env` on top.
fn serve(env: &[(&str, &str)]) -> ServeProcess {
    let token = admin_token_file();
    let server = kvindex_serve()
        .args([
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--admin-token-file",
            token.to_str().unwrap(),
        ])
        .envs(env.iter().copied())
        .start()
        .expect("kvindex serve");
    assert!(server.metrics.is_some(), "the metrics listener is announced");
    server
}

fn refused(server: &ServeProcess, reason: &str) -> f64 {
    server.metric("kvindex_http_refused_total", &[&format!("reason=\"{reason}\"")])
}

fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream
}

/// Reads until the server closes the connection (a reset counts as closed), returning what
/// came; panics if it is still open after [`DEADLINE`].
fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("the server did not close the connection within {DEADLINE:?}")
            }
            Err(_) => break, // reset
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// One request on `stream` (with `Connection: close`), answered and closed.
fn exchange(stream: &mut TcpStream, request: &str) -> String {
    // A refused connection may be closed before the request is written.
    let _ = stream.write_all(request.as_bytes());
    read_until_closed(stream)
}

/// `GET /healthz` on a connection that stays open (keep-alive), answered.
fn healthz_kept_alive(stream: &mut TcpStream) {
    stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut answered = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&answered).ends_with("ok\n") {
        let n = stream.read(&mut buf).expect("the keep-alive request is answered");
        assert!(n > 0, "closed before answering: {}", String::from_utf8_lossy(&answered));
        answered.extend_from_slice(&buf[..n]);
    }
}

const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";

fn registration_head(content_length: usize, token: bool) -> String {
    let auth = if token { format!("authorization: Bearer {ADMIN_TOKEN}\r\n") } else { String::new() };
    format!(
        "POST /pods HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{auth}content-type: application/json\r\ncontent-length: {content_length}\r\n\r\n"
    )
}

#[test]
fn a_client_trickling_its_head_is_cut_off_and_an_idle_keep_alive_closed_while_others_are_served() {
    let server = serve(&[("KVINDEX_HTTP_HEADER_TIMEOUT_MS", "1000")]);
    let addr = server.http.clone();

    // One byte of a request head every 50 ms, never finishing it.
    // Times are taken before the server can start its timer: "not before the timeout" holds.
    let started = Instant::now();
    let mut slow = connect(&addr);
    let trickle = std::thread::spawn(move || {
        let head =
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        slow.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        for byte in head.iter().cycle() {
            if slow.write_all(&[*byte]).is_err() {
                return started.elapsed();
            }
            match slow.read(&mut [0u8; 1]) {
                Ok(0) => return started.elapsed(),
                Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return started.elapsed(),
                _ => {}
            }
            assert!(started.elapsed() < DEADLINE, "the trickling client was never cut off");
        }
        unreachable!()
    });
    // One that stops mid-head and says nothing more.
    let mut silent = connect(&addr);
    silent.write_all(b"POST /pods HTTP/1.1\r\nhost: x\r\n").unwrap();
    // A keep-alive client that sends one request and then idles.
    let mut idle = connect(&addr);
    let idle_since = Instant::now();
    healthz_kept_alive(&mut idle);

    // Meanwhile a normal request is served.
    assert_eq!(http_request(&addr, "GET", "/healthz", None), (200, "ok\n".to_string()));

    let cut_after = trickle.join().unwrap();
    assert!(cut_after >= Duration::from_millis(1000), "not before the timeout: {cut_after:?}");
    assert_eq!(read_until_closed(&mut silent), "", "the stalled head is closed without an answer");
    assert_eq!(read_until_closed(&mut idle), "", "the idle keep-alive connection is closed");
    assert!(idle_since.elapsed() >= Duration::from_millis(1000), "not before the timeout");
    wait_until("both stalled heads counted", 10, || (refused(&server, "header_timeout") >= 2.0).then_some(()));
    assert_eq!(refused(&server, "header_timeout"), 2.0, "the idle keep-alive close is not a refusal");
    assert_eq!(http_request(&addr, "GET", "/healthz", None).0, 200, "still serving");
}

#[test]
fn a_client_that_never_reads_its_answers_is_cut_off_after_the_write_timeout() {
    let server = serve(&[("KVINDEX_HTTP_WRITE_TIMEOUT_MS", "1000")]);
    let addr = server.metrics.clone().unwrap();
    // Far more pipelined `/metrics` answers than the kernel's buffers on both sides hold
    // (each answer is several KiB), so the server's writes stop making progress.
    let mut greedy = connect(&addr);
    let request = "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n".repeat(4000);
    greedy.write_all(request.as_bytes()).unwrap();
    let started = Instant::now();
    wait_until("the stalled write counted", 20, || (refused(&server, "write_timeout") >= 1.0).then_some(()));
    assert!(started.elapsed() >= Duration::from_millis(900), "not before the timeout: {:?}", started.elapsed());
    // What the kernel holds still comes, then the end: the connection is closed.
    let answered = read_until_closed(&mut greedy);
    assert!(answered.starts_with("HTTP/1.1 200"), "answers went out before the stall");
    assert!(answered.matches("HTTP/1.1 200").count() < 4000, "not every answer was written");
    // A client that reads is served meanwhile, on the same listener.
    assert_eq!(http_request(&addr, "GET", "/metrics", None).0, 200);
}

#[test]
fn a_registration_body_that_stalls_gets_408_and_without_the_token_none_is_read() {
    let server = serve(&[("KVINDEX_HTTP_BODY_TIMEOUT_MS", "1000")]);
    let addr = server.http.clone();

    // Without the token: refused at once, the declared body never read.
    let mut stranger = connect(&addr);
    let answer = exchange(&mut stranger, &registration_head(100, false));
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");

    // With it: half a body, then silence.
    let mut stalled = connect(&addr);
    let started = Instant::now();
    let answer = exchange(&mut stalled, &format!("{}{{\"pod\": ", registration_head(100, true)));
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(1000), "not before the timeout");
    assert_eq!(refused(&server, "body_timeout"), 1.0);
    // A registration that arrives in time is still read.
    let body = r#"{"pod": "p", "model": "m", "bogus": 1}"#;
    let answer = exchange(&mut connect(&addr), &format!("{}{body}", registration_head(body.len(), true)));
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("bogus"), "{answer}");
}

/// A registration that declares a body and sends the head and one byte: with the token, it is
/// inside its handler, reading the body, for `http_body_timeout_ms`: a busy connection.
fn busy_registration(stream: &mut TcpStream) {
    stream.write_all(format!("{}{{", registration_head(100, true)).as_bytes()).unwrap();
}

#[test]
fn at_the_cap_the_oldest_idle_connection_makes_room_and_busy_ones_are_never_cut() {
    let server = serve(&[
        ("KVINDEX_HTTP_MAX_CONNECTIONS", "4"),
        ("KVINDEX_HTTP_MAX_CONNECTIONS_PER_ADDRESS", "4"),
        ("KVINDEX_HTTP_MAX_CONNECTIONS_PER_NETWORK", "4"),
        ("KVINDEX_HTTP_HEADER_TIMEOUT_MS", "60000"),
        ("KVINDEX_HTTP_BODY_TIMEOUT_MS", "60000"),
    ]);
    let addr = server.http.clone();
    // Four connections from four networks, each served once and kept open: idle.
    let from = |i: usize| format!("127.0.{i}.1");
    let mut open: Vec<TcpStream> = (1..=4).map(|i| connect_from(&from(i), &addr)).collect();
    open.iter_mut().for_each(healthz_kept_alive);
    // A fifth is served: the oldest idle one is closed for it.
    let fifth = exchange(&mut connect_from(&from(5), &addr), HEALTHZ);
    assert!(fifth.starts_with("HTTP/1.1 200"), "the fifth connection is served: {fifth}");
    assert_eq!(read_until_closed(&mut open[0]), "", "the oldest idle connection was closed");
    assert_eq!(server.metric("kvindex_http_evicted_total", &["reason=\"max_connections\""]), 1.0);
    assert_eq!(refused(&server, "max_connections"), 0.0);
    healthz_kept_alive(&mut open[1]);
    drop(open);
    wait_until("the idle connections closed", 10, || {
        (server.metric("kvindex_http_connections", &["listener=\"http\""]) == 0.0).then_some(())
    });

    // Four registrations being read: every connection is answering, none may go.
    let mut busy: Vec<TcpStream> = (1..=4).map(|i| connect_from(&from(i), &addr)).collect();
    busy.iter_mut().for_each(busy_registration);
    wait_until("four bodies being read", 20, || (server.metric("kvindex_http_body_bytes", &[]) == 400.0).then_some(()));
    assert_eq!(exchange(&mut connect_from(&from(5), &addr), HEALTHZ), "", "refused: no connection is idle");
    assert_eq!(refused(&server, "max_connections"), 1.0);
    // One that leaves makes room.
    drop(busy.pop());
    wait_until("room for a new connection", 10, || {
        exchange(&mut connect_from(&from(5), &addr), HEALTHZ).starts_with("HTTP/1.1 200").then_some(())
    });
}

/// A connection to `addr` from the loopback address `source` (Linux routes all of 127/8).
fn connect_from(source: &str, addr: &str) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
        socket.connect(addr.parse().unwrap()).await.unwrap()
    });
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream
}

#[test]
fn one_address_and_one_network_cannot_take_the_listener_from_the_probes() {
    let server = serve(&[
        ("KVINDEX_HTTP_MAX_CONNECTIONS", "8"),
        ("KVINDEX_HTTP_MAX_CONNECTIONS_PER_ADDRESS", "2"),
        ("KVINDEX_HTTP_MAX_CONNECTIONS_PER_NETWORK", "4"),
        ("KVINDEX_HTTP_HEADER_TIMEOUT_MS", "60000"),
        ("KVINDEX_HTTP_BODY_TIMEOUT_MS", "60000"),
    ]);
    let addr = server.http.clone();
    // Two busy connections from one address: a third from it is refused, one from another
    // address is served.
    let mut held: Vec<TcpStream> = (0..2).map(|_| connect_from("127.0.5.2", &addr)).collect();
    held.iter_mut().for_each(busy_registration);
    wait_until("two bodies being read", 20, || (server.metric("kvindex_http_body_bytes", &[]) == 200.0).then_some(()));
    assert_eq!(exchange(&mut connect_from("127.0.5.2", &addr), HEALTHZ), "", "a third from one address");
    assert_eq!(refused(&server, "max_connections_per_address"), 1.0);
    // Two more from another address of the same /24: the network's four are busy, so a fifth
    // address there is refused while the rest of the listener is free.
    let mut more: Vec<TcpStream> = (0..2).map(|_| connect_from("127.0.5.3", &addr)).collect();
    more.iter_mut().for_each(busy_registration);
    wait_until("four bodies being read", 20, || (server.metric("kvindex_http_body_bytes", &[]) == 400.0).then_some(()));
    assert_eq!(exchange(&mut connect_from("127.0.5.4", &addr), HEALTHZ), "", "a fifth from one network");
    assert_eq!(refused(&server, "max_connections_per_network"), 1.0);
    let probe = exchange(&mut connect_from("127.0.0.1", &addr), HEALTHZ);
    assert!(probe.starts_with("HTTP/1.1 200"), "the probe from another network: {probe}");
}

/// Keeps `per_address` silent connections from each of `addresses` open to `addr`, opening
/// a new one whenever the server closes one, until dropped.
struct SilentClients {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl SilentClients {
    fn hold(addr: &str, addresses: &[&str], per_address: usize) -> SilentClients {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut threads = Vec::new();
        for source in addresses {
            for _ in 0..per_address {
                let (stop, addr, source) = (stop.clone(), addr.to_string(), source.to_string());
                threads.push(std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let mut silent = connect_from(&source, &addr);
                        silent.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                        // Wait until the server closes it (or we are told to stop).
                        let mut buf = [0u8; 64];
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            match silent.read(&mut buf) {
                                Ok(0) => break,
                                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                                _ => break,
                            }
                        }
                    }
                }));
            }
        }
        SilentClients { stop, threads }
    }
}

impl Drop for SilentClients {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Four addresses holding 16 silent connections each (re-opened as the header timeout
/// closes them) kept `/healthz` from answering 42 of 42 times over 25 s on the default config:
/// a kubelet liveness probe would have restarted the indexer. Silent connections are idle:
/// the probe's connection takes the place of the oldest.
#[test]
fn silent_connections_from_a_few_addresses_do_not_keep_the_probes_out() {
    let server = serve(&[]);
    let addr = server.http.clone();
    wait_until("ready", 10, || (http_request(&addr, "GET", "/readyz", None).0 == 200).then_some(()));
    let _silent = SilentClients::hold(&addr, &["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"], 16);
    // All 64 held (the listener full), or the caps making room among them.
    wait_until("the silent connections held", 20, || {
        let held = server.metric("kvindex_http_connections", &["listener=\"http\""]);
        let evicted = server.metric("kvindex_http_evicted_total", &[]);
        (held >= 64.0 || (held >= 32.0 && evicted >= 1.0)).then_some(())
    });
    for _ in 0..10 {
        assert_eq!(http_request(&addr, "GET", "/healthz", None), (200, "ok\n".to_string()));
        assert_eq!(http_request(&addr, "GET", "/readyz", None).0, 200);
    }
    assert!(server.metric("kvindex_http_evicted_total", &[]) >= 1.0);
}

/// With `probe_addr`, health and readiness have a listener of their own: they answer while
/// `http_addr` is full of connections that are all being answered (which nothing may cut).
#[test]
fn the_probe_listener_answers_while_the_main_one_is_full() {
    let server = serve(&[
        ("KVINDEX_PROBE_ADDR", "127.0.0.1:0"),
        ("KVINDEX_HTTP_MAX_CONNECTIONS", "4"),
        ("KVINDEX_HTTP_MAX_CONNECTIONS_PER_ADDRESS", "4"),
        ("KVINDEX_HTTP_MAX_CONNECTIONS_PER_NETWORK", "4"),
        ("KVINDEX_HTTP_BODY_TIMEOUT_MS", "60000"),
    ]);
    let (addr, probe) =
        (server.http.clone(), server.probe.clone().expect("KVINDEX_LISTENING names the probe listener"));
    let mut busy: Vec<TcpStream> = (0..4).map(|_| connect(&addr)).collect();
    busy.iter_mut().for_each(busy_registration);
    wait_until("four bodies being read", 20, || (server.metric("kvindex_http_body_bytes", &[]) == 400.0).then_some(()));
    assert_eq!(exchange(&mut connect(&addr), HEALTHZ), "", "the main listener is full");
    // Ready once every listener is up (the server says so a moment after it starts serving).
    wait_until("ready", 10, || (http_request(&probe, "GET", "/readyz", None).0 == 200).then_some(()));
    for _ in 0..5 {
        assert_eq!(http_request(&probe, "GET", "/healthz", None), (200, "ok\n".to_string()));
        assert_eq!(http_request(&probe, "GET", "/readyz", None), (200, "ready\n".to_string()));
    }
    assert_eq!(http_request(&probe, "GET", "/metrics", None).0, 404, "probes only");
    assert_eq!(http_request(&probe, "POST", "/pods", Some("{}")).0, 404, "no control plane");
}

#[test]
fn oversized_heads_and_registration_bodies_are_refused_and_counted() {
    // Default bounds: 64 KiB bodies, 32 KiB heads.
    let server = serve(&[]);
    let addr = server.http.clone();
    let over = (64 << 10) + 1;

    // Declared over the limit: 413 before a byte of it is read.
    let answer = exchange(&mut connect(&addr), &registration_head(over, true));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(refused(&server, "body_too_large"), 1.0);
    // Without the token the same request is refused for the token, unread.
    let answer = exchange(&mut connect(&addr), &registration_head(over, false));
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");

    // Streamed (chunked, no length declared) past the limit: 413 once the bytes pass it.
    let mut streamed = connect(&addr);
    let head = format!(
        "POST /pods HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer {ADMIN_TOKEN}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    // The chunk's end is not sent: every byte sent is read before the answer, so closing
    // the connection cannot reset it under the answer.
    let chunk = format!("{over:x}\r\n{}", "x".repeat(over));
    let answer = exchange(&mut streamed, &format!("{head}{chunk}"));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(refused(&server, "body_too_large"), 2.0);

    // A head over 32 KiB: 431.
    let big_head = format!("GET /healthz HTTP/1.1\r\nhost: x\r\nx-padding: {}\r\n\r\n", "a".repeat(40 << 10));
    let answer = exchange(&mut connect(&addr), &big_head);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    wait_until("the head counted", 10, || (refused(&server, "head_too_large") == 1.0).then_some(()));
}

#[test]
fn bodies_past_the_shared_budget_get_503_until_one_is_given_back() {
    let server = serve(&[
        ("KVINDEX_HTTP_MAX_BODY_BYTES", "4096"),
        ("KVINDEX_HTTP_MAX_INFLIGHT_BODY_BYTES", "8192"),
        ("KVINDEX_HTTP_BODY_TIMEOUT_MS", "60000"),
    ]);
    let addr = server.http.clone();
    // Two registrations declare 4096-byte bodies and stall: the budget is spent.
    let mut holders: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut stream = connect(&addr);
            stream.write_all(format!("{}{{", registration_head(4096, true)).as_bytes()).unwrap();
            stream
        })
        .collect();
    // Once the server has read their heads and reserved their declared lengths (seen on the
    // metrics listener, which has no body budget), a third registration finds no room. It is
    // sent only then: sent earlier, it could hold its 2 bytes while the second holder's head is
    // read, and that holder would be the one refused (as happened on a loaded CI box).
    wait_until("both holders' bodies reserved", 30, || {
        (server.metric("kvindex_http_body_bytes", &[]) == 8192.0).then_some(())
    });
    let body = "{}";
    let busy = exchange(&mut connect(&addr), &format!("{}{body}", registration_head(body.len(), true)));
    assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
    assert_eq!(server.metric("kvindex_http_body_bytes", &[]), 8192.0);
    assert!(busy.to_ascii_lowercase().contains("retry-after: 1"), "{busy}");
    assert_eq!(refused(&server, "body_budget"), 1.0);
    // Given back when a holder leaves.
    drop(holders.pop());
    wait_until("the budget given back", 30, || {
        let answer = exchange(&mut connect(&addr), &format!("{}{body}", registration_head(body.len(), true)));
        answer.starts_with("HTTP/1.1 400").then_some(())
    });
}
