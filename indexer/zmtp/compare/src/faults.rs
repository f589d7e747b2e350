//! The fault cases, each against a fresh subscriber process per candidate, configured alike
//! (16 MiB messages, heartbeat 1 s, idle/heartbeat timeout 3 s, handshake 3 s): a huge frame
//! header, an endless multi-part message, a flood of connections from one address under a
//! 1024-descriptor limit, silence before and after the handshake, a publisher restart, a slow
//! peer; and for the replay DEALER, a ROUTER answering with a 2^36-byte frame header.
//! Each prints one table row: what happened, in figures.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::child::Child;
use crate::pubs;
use crate::raw;
use crate::stats::{open_fds, peak_rss_kib, rss_kib};

const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

fn start(imp: &str, max_fds: Option<u64>) -> (Child, String) {
    let sub = Child::spawn(&["sub".into(), imp.into(), "faults".into(), "1".into(), "0".into()], max_fds);
    let ready = sub.expect("ready", Duration::from_secs(30)).expect("subscriber ready");
    (sub, ready["ready"].as_str().unwrap().to_string())
}

/// Publishes `n` messages on `topic` from a fresh libzmq PUB (from 127.0.0.1) and counts how
/// many the subscriber printed within `within`; `None` if the PUB never got subscribed.
fn legit(sub: &Child, endpoint: &str, topic: &str, n: u64, within: Duration) -> (u64, Option<Duration>) {
    let ctx = zmq::Context::new();
    let started = Instant::now();
    let socks = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let sock = ctx.socket(zmq::XPUB).unwrap();
            sock.set_xpub_verbose(true).unwrap();
            sock.set_linger(0).unwrap();
            sock.connect(endpoint).unwrap();
            sock.set_rcvtimeo(within.as_millis() as i32).unwrap();
            sock.recv_bytes(0).ok().map(|_| sock)
        });
        h.join().unwrap()
    });
    let Some(sock) = socks else { return (0, None) };
    let mut payload = vec![0u8; 64];
    for seq in 0..n {
        pubs::send(&sock, topic.as_bytes(), seq, &mut payload);
    }
    let mut got = 0;
    let mut first = None;
    sub.until(within, |v| {
        if v["msg"] == topic {
            first.get_or_insert(started.elapsed());
            got += 1;
        }
        got == n
    });
    (got, first)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn fmt_close(t: Option<Duration>) -> String {
    t.map_or("not closed within the limit".into(), |d| format!("closed after {:.1} s", d.as_secs_f64()))
}

fn huge_frame(imp: &str) -> String {
    let (mut sub, endpoint) = start(imp, None);
    let base = rss_kib(sub.pid());
    let mut s = raw::connect(&endpoint, None).unwrap();
    raw::handshake(&mut s, 1, b"PUB").unwrap();
    let mut header = vec![0x03];
    header.extend_from_slice(&(1u64 << 36).to_be_bytes());
    s.write_all(&header).unwrap();
    s.write_all(&[0u8; 4096]).unwrap();
    let closed = raw::time_to_close(&mut s, Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(200));
    let alive = sub.alive();
    let (got, _) =
        if alive.is_ok() { legit(&sub, &endpoint, "kv@after", 100, Duration::from_secs(10)) } else { (0, None) };
    format!(
        "{}; process {}; peak RSS +{:.1} MiB; a publisher afterwards: {got}/100 delivered",
        fmt_close(closed),
        alive.map_or_else(|e| e, |_| "alive".into()),
        mib(peak_rss_kib(sub.pid()).saturating_sub(base)),
    )
}

fn endless_multipart(imp: &str) -> String {
    let (mut sub, endpoint) = start(imp, None);
    let base = rss_kib(sub.pid());
    let mut s = raw::connect(&endpoint, None).unwrap();
    raw::handshake(&mut s, 1, b"PUB").unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let part = raw::frame(0x01, &vec![0u8; 1 << 20]);
    let limit: u64 = 1 << 30;
    let mut sent = 0u64;
    let outcome = loop {
        if sent >= limit {
            break "still open after 1 GiB".to_string();
        }
        match s.write_all(&part) {
            Ok(()) => sent += part.len() as u64,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                break "stalled (not reading)".to_string()
            }
            Err(_) => break "closed".to_string(),
        }
    };
    std::thread::sleep(Duration::from_millis(500));
    let rss_now = rss_kib(sub.pid()).saturating_sub(base);
    let peak = peak_rss_kib(sub.pid()).saturating_sub(base);
    let alive = sub.alive();
    drop(s);
    format!(
        "{outcome} after {:.0} MiB of one unfinished message; RSS +{:.0} MiB (peak +{:.0} MiB); process {}",
        sent as f64 / (1 << 20) as f64,
        mib(rss_now),
        mib(peak),
        alive.map_or_else(|e| e, |_| "alive".into()),
    )
}

/// 700 connections from 127.0.0.2 that handshake and then only send a PING every 500 ms
/// (traffic, so no heartbeat or idle timeout closes them), re-opened whenever the subscriber
/// closes one, against a subscriber limited to 512 descriptors. Once 700 connects went
/// through or the subscriber is at its limit (or after 30 s), a publisher on 127.0.0.1 tries to get 100 messages through.
fn connection_flood(imp: &str) -> String {
    let (mut sub, endpoint) = start(imp, Some(512));
    let stop = Arc::new(AtomicBool::new(false));
    let connects = Arc::new(AtomicUsize::new(0));
    let flood = {
        let (stop, endpoint, connects) = (stop.clone(), endpoint.clone(), connects.clone());
        std::thread::spawn(move || {
            let ping = raw::frame(0x04, b"\x04PING\x00\x00");
            let mut conns: Vec<TcpStream> = Vec::new();
            let mut opened = 0usize;
            let mut last_ping = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                conns.retain_mut(|c| !raw::closed(c));
                if last_ping.elapsed() > Duration::from_millis(500) {
                    conns.retain_mut(|c| c.write_all(&ping).is_ok());
                    last_ping = Instant::now();
                }
                let deadline = Instant::now() + Duration::from_millis(200);
                while conns.len() < 700 && Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    let Ok(mut c) = raw::connect(&endpoint, Some(ATTACKER)) else { break };
                    let mut hello = raw::greeting(1).to_vec();
                    hello.extend(raw::ready(b"PUB"));
                    let _ = c.write_all(&hello);
                    let _ = c.set_write_timeout(Some(Duration::from_millis(100)));
                    conns.push(c);
                    opened += 1;
                    connects.store(opened, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (opened, conns.len())
        })
    };
    let started = Instant::now();
    while connects.load(Ordering::Relaxed) < 700
        && open_fds(sub.pid()) < 500
        && started.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    let fds = open_fds(sub.pid());
    let warmup = started.elapsed().as_secs_f64();
    let (got, first) = legit(&sub, &endpoint, "kv@legit", 100, Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    let (opened, _) = flood.join().unwrap();
    format!(
        "subscriber held {fds} descriptors after {warmup:.0} s of flood ({opened} connects in all); \
         publisher from another address: {got}/100 delivered{}; process {}",
        first.map_or(String::new(), |d| format!(" (first after {:.2} s)", d.as_secs_f64())),
        sub.alive().map_or_else(|e| e, |_| "alive".into())
    )
}

fn silent_after_handshake(imp: &str) -> String {
    let (_sub, endpoint) = start(imp, None);
    let mut s = raw::connect(&endpoint, None).unwrap();
    raw::handshake(&mut s, 1, b"PUB").unwrap();
    fmt_close(raw::time_to_close(&mut s, Duration::from_secs(10)))
}

fn silent_before_handshake(imp: &str) -> String {
    let (_sub, endpoint) = start(imp, None);
    let mut s = raw::connect(&endpoint, None).unwrap();
    fmt_close(raw::time_to_close(&mut s, Duration::from_secs(10)))
}

fn publisher_restart(imp: &str) -> String {
    let (sub, endpoint) = start(imp, None);
    let (got, _) = legit(&sub, &endpoint, "kv@pod", 20, Duration::from_secs(10));
    // `legit` closed its publisher; the "restarted" engine publishes seq 0.. again.
    let (got2, first) = legit(&sub, &endpoint, "kv@pod", 20, Duration::from_secs(10));
    format!(
        "{got}/20 before, {got2}/20 after; first message of the new connection after {}",
        first.map_or("-".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
    )
}

/// What the subscriber reports around a restart: connection events, and whether each message
/// names its connection.
fn restart_visibility(imp: &str) -> String {
    let (sub, endpoint) = start(imp, None);
    let ctx = zmq::Context::new();
    let mut events = Vec::new();
    let mut conns = std::collections::BTreeSet::new();
    for round in 0..2 {
        let sock = pubs::connect(&ctx, &endpoint, 1, false).pop().unwrap();
        let mut payload = vec![0u8; 16];
        for seq in 0..5 {
            pubs::send(&sock, b"kv@pod", seq, &mut payload);
        }
        let mut n = 0;
        let (lines, _) = sub.until(Duration::from_secs(10), |v| {
            n += (v["msg"] == "kv@pod") as u32;
            n == 5
        });
        for v in lines {
            if let Some(ev) = v["ev"].as_str() {
                events.push(format!("{round}:{ev}"));
            }
            if v["msg"] == "kv@pod" {
                conns.insert(v["conn"].to_string());
            }
        }
        sock.set_linger(0).unwrap();
        drop(sock);
        for v in sub.drain(Duration::from_millis(500)) {
            if let Some(ev) = v["ev"].as_str() {
                events.push(format!("{round}:{ev}"));
            }
        }
    }
    format!("events: [{}]; connection ids on messages: {:?}", events.join(", "), conns)
}

fn slow_peer(imp: &str) -> String {
    let (sub, endpoint) = start(imp, None);
    let mut s = raw::connect(&endpoint, None).unwrap();
    raw::handshake(&mut s, 1, b"PUB").unwrap();
    let mut msg = raw::frame(0x01, b"kv@slow");
    msg.extend(raw::frame(0x01, &0u64.to_be_bytes()));
    msg.extend(raw::frame(0x00, &[1u8; 100]));
    let trickle = std::thread::spawn(move || {
        for b in msg {
            if s.write_all(&[b]).is_err() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_secs(2));
        true
    });
    let (got, first) = legit(&sub, &endpoint, "kv@fast", 200, Duration::from_secs(10));
    let done = trickle.join().unwrap();
    let slow = sub.until(Duration::from_secs(3), |v| v["msg"] == "kv@slow").1;
    format!(
        "fast publisher {got}/200 (first after {}) while a 126-byte message trickled for 1.3 s; trickled message {}",
        first.map_or("-".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1000.0)),
        if slow && done { "delivered" } else { "not delivered" }
    )
}

/// A ROUTER (raw) that answers the DEALER's request with a 2^36-byte frame header.
fn replay_huge_frame(imp: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    let mut dealer = Child::spawn(&["dealer".into(), imp.into(), endpoint], None);
    let (mut s, _) = listener.accept().unwrap();
    raw::handshake(&mut s, 1, b"ROUTER").unwrap();
    let mut reply = raw::frame(0x01, b"");
    reply.push(0x03);
    reply.extend_from_slice(&(1u64 << 36).to_be_bytes());
    let _ = s.write_all(&reply);
    let result = dealer.expect("result", Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(300));
    let status = dealer.alive();
    format!(
        "{}; process {}",
        result.map_or("no answer".into(), |v| v["result"].as_str().unwrap_or_default().to_string()),
        status.map_or_else(|e| e, |_| "alive".into())
    )
}

/// One case: runs against candidate `imp`, returns its table cell.
type Scenario = fn(&str) -> String;

/// Runs every case whose name contains `only` (all of them without it).
pub fn run(impls: &[String], only: Option<&str>) {
    raise_fd_limit();
    let scenarios: [(&str, Scenario); 9] = [
        ("huge frame header (2^36)", huge_frame),
        ("endless multi-part message (1 MiB parts)", endless_multipart),
        ("connection flood from one address (fd limit 512)", connection_flood),
        ("silent after the handshake", silent_after_handshake),
        ("silent before the handshake", silent_before_handshake),
        ("publisher restart", publisher_restart),
        ("restart: what the subscriber sees", restart_visibility),
        ("slow peer", slow_peer),
        ("replay DEALER: ROUTER declares a 2^36 frame", replay_huge_frame),
    ];
    println!("| case | subscriber | outcome |");
    println!("|---|---|---|");
    for (name, scenario) in scenarios {
        if only.is_some_and(|o| !name.contains(o)) {
            continue;
        }
        for imp in impls {
            let row = scenario(imp);
            println!("| {name} | {imp} | {row} |");
            std::io::stdout().flush().unwrap();
        }
    }
}

fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscalls on a struct we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(65536);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}
