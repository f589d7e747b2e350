//! Interop with libzmq (through pyzmq, as vLLM runs it): publishers that dial our bound SUB and
//! publishers our SUB dials, over tcp:// and ipc://, their restarts, both sides' heartbeats, and
//! vLLM's replay ROUTER answering our DEALER in both reply layouts.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{hex, ipc_path, quick_limits, runtime, Peer, Sub};
use bytes::Bytes;
use kvindex_zmtp::{Backoff, Budget, ConnId, Dealer, Event, Limits, Peer as PeerAddr, SubDialer, SubListener};
use serde_json::json;

/// Receives `n` messages; returns them as (conn, topic, seq) in arrival order.
fn messages(sub: &mut Sub, rt: &tokio::runtime::Runtime, n: usize) -> Vec<(ConnId, String, u64)> {
    let mut out = Vec::new();
    while out.len() < n {
        if let Event::Message(m) = sub.next(rt, 20) {
            assert_eq!(m.frames.len(), 3, "vLLM shape [topic, seq, payload]");
            let seq = u64::from_be_bytes(m.frames[1][..].try_into().unwrap());
            assert_eq!(m.charged_bytes(), m.frames.iter().map(Bytes::len).sum::<usize>());
            out.push((m.conn, String::from_utf8(m.frames[0].to_vec()).unwrap(), seq));
        }
    }
    out
}

fn connected(sub: &mut Sub, rt: &tokio::runtime::Runtime) -> (ConnId, std::sync::Arc<PeerAddr>, (u8, u8), String) {
    sub.wait_for(rt, 20, "Connected", |e| match e {
        Event::Connected { conn, peer, info } => Some((*conn, peer.clone(), info.version, info.socket_type.clone())),
        _ => None,
    })
    .0
}

#[test]
fn publishers_dialling_a_bound_sub_are_told_apart_by_connection_and_address() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let listener = rt.block_on(SubListener::bind("tcp://127.0.0.1:0", &[b"kv@"], Limits::default())).unwrap();
    let endpoint = listener.endpoint().to_string();
    let mut sub = Sub::Listener(listener);
    for name in ["a", "b", "c"] {
        py.cmd(json!({"op": "pub", "name": name, "connect": endpoint}));
        // The subscription arrives as libzmq's 3.1 peers expect (SUBSCRIBE command), which
        // XPUB reports as 0x01 + prefix.
        assert_eq!(py.wait_subs(name, 1), vec![hex(b"\x01kv@")]);
    }
    let mut conns = BTreeMap::new();
    for _ in 0..3 {
        let (conn, peer, version, socket_type) = connected(&mut sub, &rt);
        assert_eq!(version, (3, 1), "pyzmq's libzmq speaks ZMTP 3.1");
        assert_eq!(socket_type, "XPUB");
        let PeerAddr::Tcp(addr) = &*peer else { panic!("tcp peer") };
        assert!(addr.ip().is_loopback());
        conns.insert(conn, addr.port());
    }
    for name in ["a", "b", "c"] {
        py.cmd(json!({"op": "send", "name": name, "frames": [hex(b"other@x"), "00", "00"]}));
        py.publish(name, &format!("kv@{name}@m"), 5);
    }
    let got = messages(&mut sub, &rt, 15);
    let mut per_topic: BTreeMap<String, (ConnId, Vec<u64>)> = BTreeMap::new();
    for (conn, topic, seq) in got {
        let entry = per_topic.entry(topic).or_insert((conn, vec![]));
        assert_eq!(entry.0, conn, "one publisher, one connection");
        entry.1.push(seq);
    }
    assert_eq!(per_topic.len(), 3, "unsubscribed topics never arrive: {per_topic:?}");
    for (conn, seqs) in per_topic.values() {
        assert!(conns.contains_key(conn));
        assert_eq!(seqs, &[0, 1, 2, 3, 4]);
    }
}

#[test]
fn a_dialled_publisher_over_ipc_and_a_publisher_dialling_over_ipc() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    // We dial a PUB bound on ipc:// (vLLM binds ipc:// endpoints).
    let bound = ipc_path("pub");
    py.cmd(json!({"op": "pub", "name": "p", "bind": bound}));
    let _guard = rt.enter();
    let mut sub = Sub::Dialer(SubDialer::connect(&bound, &[b""], Limits::default(), Backoff::default()).unwrap());
    let (_, peer, _, _) = connected(&mut sub, &rt);
    assert!(
        matches!(&*peer, PeerAddr::Ipc { uid: Some(_), pid: Some(_), .. }),
        "ipc peers carry credentials: {peer:?}"
    );
    assert_eq!(py.wait_subs("p", 1), vec!["01"]);
    py.publish("p", "kv@p@m", 3);
    assert_eq!(messages(&mut sub, &rt, 3).iter().map(|m| m.2).collect::<Vec<_>>(), [0, 1, 2]);

    // A PUB dials our SUB bound on ipc://.
    let ours = ipc_path("sub");
    let listener = rt.block_on(SubListener::bind(&ours, &[b""], Limits::default())).unwrap();
    assert_eq!(listener.endpoint(), ours);
    let mut sub = Sub::Listener(listener);
    py.cmd(json!({"op": "pub", "name": "q", "connect": ours}));
    connected(&mut sub, &rt);
    py.wait_subs("q", 1);
    py.publish("q", "kv@q@m", 3);
    assert_eq!(messages(&mut sub, &rt, 3).iter().map(|m| m.2).collect::<Vec<_>>(), [0, 1, 2]);
    drop(sub);
    assert!(!std::path::Path::new(&ours["ipc://".len()..]).exists(), "the listener removes its socket file");
}

#[test]
fn a_restarted_publisher_reconnects_with_a_new_connection_id_both_ways() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    // Bound SUB: the publisher process restarts and dials again.
    let listener = rt.block_on(SubListener::bind("tcp://127.0.0.1:0", &[b""], Limits::default())).unwrap();
    let endpoint = listener.endpoint().to_string();
    let mut sub = Sub::Listener(listener);
    py.cmd(json!({"op": "pub", "name": "a", "connect": endpoint}));
    let (first, ..) = connected(&mut sub, &rt);
    py.wait_subs("a", 1);
    py.publish("a", "kv@a", 2);
    assert!(messages(&mut sub, &rt, 2).iter().all(|m| m.0 == first));
    py.cmd(json!({"op": "close_pub", "name": "a"}));
    let (reason, _) = sub.wait_for(&rt, 20, "Disconnected", |e| match e {
        Event::Disconnected { conn, reason, .. } if *conn == first => Some(reason.clone()),
        _ => None,
    });
    assert_eq!(reason.label(), "closed");
    py.cmd(json!({"op": "pub", "name": "a", "connect": endpoint}));
    let (second, ..) = connected(&mut sub, &rt);
    assert_ne!(first, second);
    py.wait_subs("a", 1);
    py.publish("a", "kv@a", 1);
    assert_eq!(messages(&mut sub, &rt, 1), vec![(second, "kv@a".to_string(), 0)]);

    // Dialled PUB: the engine restarts on the same port; we re-dial with backoff.
    let bound = py.cmd(json!({"op": "pub", "name": "b", "bind": "tcp://127.0.0.1:0"}))["endpoint"]
        .as_str()
        .unwrap()
        .to_string();
    let _guard = rt.enter();
    let backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) };
    let mut sub = Sub::Dialer(SubDialer::connect(&bound, &[b""], Limits::default(), backoff).unwrap());
    let (first, ..) = connected(&mut sub, &rt);
    py.wait_subs("b", 1);
    py.cmd(json!({"op": "close_pub", "name": "b"}));
    sub.wait_for(&rt, 20, "Disconnected", |e| {
        matches!(e, Event::Disconnected { conn, .. } if *conn == first).then_some(())
    });
    py.cmd(json!({"op": "pub", "name": "b", "bind": bound}));
    let (second, ..) = connected(&mut sub, &rt);
    assert_ne!(first, second);
    py.wait_subs("b", 1);
    py.publish("b", "kv@b", 2);
    assert!(messages(&mut sub, &rt, 2).iter().all(|m| m.0 == second));
}

#[test]
fn a_dialer_keeps_trying_until_the_engine_is_up() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    // A port nobody listens on yet: bind, read the port, close, then dial it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let _guard = rt.enter();
    let backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(100) };
    let mut sub = Sub::Dialer(SubDialer::connect(&endpoint, &[b""], Limits::default(), backoff).unwrap());
    let (retry_in, _) = sub.wait_for(&rt, 20, "ConnectFailed", |e| match e {
        Event::ConnectFailed { reason, retry_in, .. } => {
            assert_eq!(reason.label(), "connect");
            Some(*retry_in)
        }
        _ => None,
    });
    assert!(retry_in <= Duration::from_millis(100));
    py.cmd(json!({"op": "pub", "name": "late", "bind": endpoint}));
    connected(&mut sub, &rt);
    py.wait_subs("late", 1);
    py.publish("late", "kv@late", 1);
    assert_eq!(messages(&mut sub, &rt, 1)[0].2, 0);
}

#[test]
fn heartbeats_keep_quiet_libzmq_publishers_connected() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    // PING after 250 ms of silence, close after 2 s without a byte: eight intervals, so a
    // busy box that delays a PING or its PONG by a second does not close a live connection.
    let limits = Limits {
        heartbeat_interval: Duration::from_millis(250),
        idle_timeout: Duration::from_secs(2),
        ..quick_limits()
    };
    let listener = rt.block_on(SubListener::bind("tcp://127.0.0.1:0", &[b""], limits)).unwrap();
    let endpoint = listener.endpoint().to_string();
    let mut sub = Sub::Listener(listener);
    // "pinging" PINGs us every 250 ms and drops us after 2 s without a PONG; "silent" sends
    // nothing at all unless we PING it.
    py.cmd(
        json!({"op": "pub", "name": "pinging", "connect": endpoint, "heartbeat_ms": 250, "heartbeat_timeout_ms": 2000}),
    );
    py.cmd(json!({"op": "pub", "name": "silent", "connect": endpoint}));
    let mut conns = vec![connected(&mut sub, &rt).0, connected(&mut sub, &rt).0];
    py.wait_subs("pinging", 1);
    py.wait_subs("silent", 1);
    // Three of our idle timeouts and three of its heartbeat timeouts (24 heartbeats each way)
    // without a message.
    let events = sub.drain_for(&rt, Duration::from_secs(6));
    assert!(events.is_empty(), "quiet 3.1 publishers that answer and send PINGs stay connected: {events:?}");
    py.publish("pinging", "kv@p", 1);
    py.publish("silent", "kv@s", 1);
    let mut got: Vec<ConnId> = messages(&mut sub, &rt, 2).into_iter().map(|m| m.0).collect();
    got.sort();
    conns.sort();
    assert_eq!(got, conns, "both messages came on the original connections");
}

fn replay(py: &mut Peer, layout: &str, bind: &str) {
    let rt = runtime();
    let items: Vec<(u64, String)> = (0..5u64).map(|s| (s, hex(format!("batch-{s}").as_bytes()))).collect();
    let endpoint = py.cmd(json!({"op": "router", "name": layout, "bind": bind, "layout": layout,
        "topic": "kv@10.0.0.7:8000@m", "items": items}))["endpoint"]
        .as_str()
        .unwrap()
        .to_string();
    let request = [Bytes::new(), Bytes::copy_from_slice(&2u64.to_be_bytes())];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut dealer = rt.block_on(Dealer::request(&endpoint, &request, &Limits::default(), deadline)).unwrap();
    assert_eq!(dealer.peer_info().socket_type, "ROUTER");
    let mut replies = Vec::new();
    loop {
        let m = rt.block_on(dealer.recv()).unwrap();
        assert_eq!(m.frames[0], Bytes::new(), "the delimiter frame comes first");
        let seq = &m.frames[m.frames.len() - 2];
        if seq[..] == [0xff; 8] {
            assert_eq!(m.frames.last().unwrap().len(), 0);
            break;
        }
        replies.push(m.frames.iter().skip(1).map(|f| String::from_utf8_lossy(f).into_owned()).collect::<Vec<_>>());
    }
    let seq = |s: u64| String::from_utf8_lossy(&s.to_be_bytes()).into_owned();
    let expected: Vec<Vec<String>> = (2..5u64)
        .map(|s| {
            let mut f = vec![seq(s), format!("batch-{s}")];
            if layout == "v026" {
                f.insert(0, "kv@10.0.0.7:8000@m".to_string());
            }
            f
        })
        .collect();
    assert_eq!(replies, expected);
    // The ROUTER saw exactly vLLM's request: [identity] + [b"", seq_be8].
    let requests = py.cmd(json!({"op": "router_requests", "name": layout}))["requests"].clone();
    assert_eq!(requests, json!([["", hex(&2u64.to_be_bytes())]]));
    py.cmd(json!({"op": "close_router", "name": layout}));
}

#[test]
fn a_dealer_replays_from_vllms_router_in_both_layouts_over_tcp_and_ipc() {
    let Some(mut py) = Peer::start() else { return };
    replay(&mut py, "v025", "tcp://127.0.0.1:0");
    replay(&mut py, "v026", "tcp://127.0.0.1:0");
    replay(&mut py, "v026", &ipc_path("replay"));
}

#[test]
fn a_dealer_gives_up_at_its_deadline_and_on_a_refused_connect() {
    let rt = runtime();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let err = rt
        .block_on(Dealer::request(&format!("tcp://127.0.0.1:{port}"), &[Bytes::new()], &Limits::default(), deadline))
        .err()
        .unwrap();
    assert!(matches!(err, kvindex_zmtp::Error::Connection { reason: kvindex_zmtp::Reason::Connect(_), .. }), "{err}");
    let Some(mut py) = Peer::start() else { return };
    // A ROUTER that never answers a request it does not understand (2 frames instead of 3).
    let endpoint = py.cmd(json!({"op": "router", "name": "mute", "bind": "tcp://127.0.0.1:0", "layout": "v026"}))
        ["endpoint"]
        .as_str()
        .unwrap()
        .to_string();
    // The connection and handshake must finish before the deadline, even on a loaded box; the
    // reply never comes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let request = [Bytes::new(), Bytes::new(), Bytes::new()];
    let mut dealer = rt.block_on(Dealer::request(&endpoint, &request, &Limits::default(), deadline)).unwrap();
    let err = rt.block_on(dealer.recv()).unwrap_err();
    assert!(matches!(err, kvindex_zmtp::Error::Deadline { .. }), "{err}");
}

/// Dialled publishers can share one byte budget (`SubDialer::connect_sharing`; the server's
/// per-pod diallers do): every byte either dialler holds is charged to it, and given back when
/// the messages are dropped.
#[test]
fn dialled_publishers_share_one_byte_budget() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let _guard = rt.enter();
    let shared = Budget::new(1 << 20);
    let mut subs = Vec::new();
    for name in ["a", "b"] {
        let bound = py.cmd(json!({"op": "pub", "name": name, "bind": "tcp://127.0.0.1:0"}))["endpoint"]
            .as_str()
            .unwrap()
            .to_string();
        let dialer =
            SubDialer::connect_sharing(&bound, &[b""], Limits::default(), Backoff::default(), Some(shared.clone()));
        let mut sub = Sub::Dialer(dialer.unwrap());
        connected(&mut sub, &rt);
        py.wait_subs(name, 1);
        subs.push(sub);
    }
    let mut held = Vec::new();
    for (name, sub) in ["a", "b"].iter().zip(subs.iter_mut()) {
        py.publish(name, &format!("kv@{name}@m"), 3);
        while held
            .iter()
            .filter(|m: &&kvindex_zmtp::Message| m.frames[0][..] == *format!("kv@{name}@m").as_bytes())
            .count()
            < 3
        {
            if let Event::Message(m) = sub.next(&rt, 20) {
                held.push(m);
            }
        }
    }
    let held_bytes: usize = held.iter().map(|m| m.charged_bytes()).sum();
    assert!(held_bytes > 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while shared.used() != held_bytes {
        assert!(std::time::Instant::now() < deadline, "shared {} != held {held_bytes}", shared.used());
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(held);
    assert_eq!(shared.used(), 0, "dropped messages give their bytes back");
}
