//! Hand-written ZMTP peers on raw sockets (tests/python/zmtppeer.py): a ZMTP 3.0-only
//! publisher and a 3.1 one (which subscription form each gets, PING/PONG), refused mechanisms
//! and socket types, and hostile peers: a 2^36-byte frame header on the SUB and on the replay
//! DEALER, an endless multi-part message, one address holding unfinished messages on many
//! connections, floods of connections, and silence before and after the handshake.

use std::time::Duration;

use crate::support::{hex, peak_rss_kib, quick_limits, runtime, Peer, Sub};
use bytes::Bytes;
use kvindex_zmtp::{Backoff, ConnId, Dealer, Error, Event, Limits, ProtocolError, Reason, SubDialer, SubListener};
use serde_json::json;
use tokio::runtime::Runtime;

const GREETING_30: &str = "ff00000000000000007f03004e554c4c000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000";

fn listen(rt: &Runtime, limits: Limits, subs: &[&[u8]]) -> (Sub, String) {
    let listener = rt.block_on(SubListener::bind("tcp://127.0.0.1:0", subs, limits)).unwrap();
    let endpoint = listener.endpoint().to_string();
    (Sub::Listener(listener), endpoint)
}

fn connected(sub: &mut Sub, rt: &Runtime) -> (ConnId, (u8, u8)) {
    sub.wait_for(rt, 20, "Connected", |e| match e {
        Event::Connected { conn, info, .. } => Some((*conn, info.version)),
        _ => None,
    })
    .0
}

fn rejected(sub: &mut Sub, rt: &Runtime) -> Reason {
    sub.wait_for(rt, 20, "Rejected", |e| match e {
        Event::Rejected { reason, .. } => Some(reason.clone()),
        _ => None,
    })
    .0
}

fn disconnected(sub: &mut Sub, rt: &Runtime, conn: ConnId) -> Reason {
    sub.wait_for(rt, 20, "Disconnected", |e| match e {
        Event::Disconnected { conn: c, reason, .. } if *c == conn => Some(reason.clone()),
        _ => None,
    })
    .0
}

#[test]
fn a_zmtp_30_publisher_gets_a_subscription_message_and_a_31_one_a_subscribe_command() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let (mut sub, endpoint) = listen(&rt, Limits::default(), &[b"kv@"]);

    py.cmd(json!({"op": "raw_connect", "name": "v30", "endpoint": endpoint}));
    let theirs = py.cmd(json!({"op": "raw_handshake", "name": "v30", "version": [3, 0]}));
    assert_eq!((theirs["version"].clone(), theirs["mechanism"].clone()), (json!([3, 1]), json!("NULL")));
    assert_eq!(theirs["socket_type"], "SUB");
    let sub_frame = py.cmd(json!({"op": "raw_read_frame", "name": "v30"}));
    assert_eq!((sub_frame["flags"].as_u64(), sub_frame["body"].as_str()), (Some(0), Some(hex(b"\x01kv@").as_str())));
    let (conn30, version) = connected(&mut sub, &rt);
    assert_eq!(version, (3, 0));

    py.cmd(json!({"op": "raw_connect", "name": "v31", "endpoint": endpoint}));
    py.cmd(json!({"op": "raw_handshake", "name": "v31", "version": [3, 1]}));
    let sub_frame = py.cmd(json!({"op": "raw_read_frame", "name": "v31"}));
    assert_eq!(sub_frame["flags"].as_u64(), Some(4), "a command");
    assert_eq!(sub_frame["body"].as_str(), Some(hex(b"\x09SUBSCRIBEkv@").as_str()));
    let (conn31, version) = connected(&mut sub, &rt);
    assert_eq!(version, (3, 1));

    // PING with a context: the PONG echoes it.
    py.cmd(json!({"op": "raw_command", "name": "v31", "command_name": "PING", "data": hex(b"\x00\x00ctx")}));
    let pong = py.cmd(json!({"op": "raw_read_frame", "name": "v31"}));
    assert_eq!(pong["body"].as_str(), Some(hex(b"\x04PONGctx").as_str()));

    // Messages from each, including a long frame (8-byte size) and a PING between parts.
    py.cmd(json!({"op": "raw_message", "name": "v30", "frames": [hex(b"kv@a"), hex(&[0; 8]), hex(&[7; 300])]}));
    py.cmd(
        json!({"op": "raw_send", "name": "v31", "hex": format!("01046b764062{}", hex(b"\x04\x07\x04PING\x00\x00"))}),
    );
    py.cmd(json!({"op": "raw_message", "name": "v31", "frames": [hex(&1u64.to_be_bytes()), "ff"]}));
    let mut got = Vec::new();
    while got.len() < 2 {
        if let Event::Message(m) = sub.next(&rt, 20) {
            got.push((m.conn, m.frames));
        }
    }
    got.sort_by_key(|g| g.0);
    assert_eq!(got[0], (conn30, vec![Bytes::from_static(b"kv@a"), Bytes::from(vec![0; 8]), Bytes::from(vec![7; 300])]));
    assert_eq!(
        got[1],
        (
            conn31,
            vec![Bytes::from_static(b"kv@b"), Bytes::from(1u64.to_be_bytes().to_vec()), Bytes::from_static(b"\xff")]
        )
    );

    // A dialling SUB meets a 3.0-only publisher it dialled.
    let listening = py.cmd(json!({"op": "raw_listen", "name": "l", "endpoint": "tcp://127.0.0.1:0"}))["endpoint"]
        .as_str()
        .unwrap()
        .to_string();
    let _guard = rt.enter();
    let mut dialer =
        Sub::Dialer(SubDialer::connect(&listening, &[b"kv@"], Limits::default(), Backoff::default()).unwrap());
    py.cmd(json!({"op": "raw_accept", "name": "d", "listener": "l"}));
    py.cmd(json!({"op": "raw_handshake", "name": "d", "version": [3, 0]}));
    let sub_frame = py.cmd(json!({"op": "raw_read_frame", "name": "d"}));
    assert_eq!(sub_frame["body"].as_str(), Some(hex(b"\x01kv@").as_str()));
    assert_eq!(connected(&mut dialer, &rt).1, (3, 0));
}

#[test]
fn strangers_other_mechanisms_and_wrong_socket_types_are_refused_with_a_named_reason() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let (mut sub, endpoint) = listen(&rt, Limits::default(), &[b""]);
    let cases: [(&str, serde_json::Value, &str); 4] = [
        ("curve", json!({"op": "raw_handshake", "name": "curve", "mechanism": "CURVE"}), "unsupported_mechanism"),
        (
            "router",
            json!({"op": "raw_handshake", "name": "router", "socket_type": "ROUTER"}),
            "incompatible_socket_type",
        ),
        ("http", json!({"op": "raw_send", "name": "http", "hex": hex(b"GET / HTTP/1.1\r\n\r\n")}), "bad_signature"),
        (
            "error",
            json!({"op": "raw_send", "name": "error", "hex": format!("{GREETING_30}040c054552524f5205{}", hex(b"nope!"))}),
            "peer_error",
        ),
    ];
    for (name, action, label) in cases {
        py.cmd(json!({"op": "raw_connect", "name": name, "endpoint": endpoint}));
        py.try_cmd(action); // the handshake may fail on the peer's side too
        let reason = rejected(&mut sub, &rt);
        assert_eq!(reason.label(), label, "{name}: {reason}");
        if name == "curve" {
            assert_eq!(reason, Reason::Protocol(ProtocolError::UnsupportedMechanism("CURVE".into())));
            assert!(reason.to_string().contains("only NULL is supported"));
        }
        if name == "error" {
            assert_eq!(reason, Reason::Protocol(ProtocolError::PeerError("nope!".into())));
        }
    }
}

/// The header of a frame declaring `len` bytes (8-byte size), with MORE set.
fn huge_header(len: u64) -> String {
    format!("03{}", hex(&len.to_be_bytes()))
}

#[test]
fn a_huge_declared_frame_is_refused_before_allocation_on_the_sub_and_the_dealer() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let before = peak_rss_kib();
    let (mut sub, endpoint) = listen(&rt, Limits::default(), &[b""]);
    for (name, len) in [("a", 1u64 << 36), ("b", u64::MAX), ("c", (16 << 20) + 1)] {
        py.cmd(json!({"op": "raw_connect", "name": name, "endpoint": endpoint}));
        py.cmd(json!({"op": "raw_handshake", "name": name}));
        let (conn, _) = connected(&mut sub, &rt);
        py.cmd(json!({"op": "raw_send", "name": name, "hex": huge_header(len)}));
        let reason = disconnected(&mut sub, &rt, conn);
        assert_eq!(reason, Reason::Protocol(ProtocolError::FrameTooLarge { declared: len, limit: 16 << 20 }));
        assert_eq!(py.cmd(json!({"op": "raw_wait_closed", "name": name}))["closed"], true);
    }

    // vLLM's replay shape, from a hostile ROUTER: the DEALER's request, then a 2^36 header.
    let listening = py.cmd(json!({"op": "raw_listen", "name": "l", "endpoint": "tcp://127.0.0.1:0"}))["endpoint"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let request = [Bytes::new(), Bytes::copy_from_slice(&5u64.to_be_bytes())];
    let dealer = rt.spawn(async move { Dealer::request(&listening, &request, &Limits::default(), deadline).await });
    py.cmd(json!({"op": "raw_accept", "name": "router", "listener": "l"}));
    assert_eq!(
        py.cmd(json!({"op": "raw_handshake", "name": "router", "socket_type": "ROUTER"}))["socket_type"],
        "DEALER"
    );
    let req = py.cmd(json!({"op": "raw_read_message", "name": "router"}));
    assert_eq!(req["frames"], json!(["", hex(&5u64.to_be_bytes())]));
    let mut dealer = rt.block_on(dealer).unwrap().unwrap();
    py.cmd(json!({"op": "raw_send", "name": "router", "hex": format!("0100{}", huge_header(1 << 36))}));
    match rt.block_on(dealer.recv()) {
        Err(Error::Connection { reason, .. }) => {
            assert_eq!(reason, Reason::Protocol(ProtocolError::FrameTooLarge { declared: 1 << 36, limit: 16 << 20 }))
        }
        other => panic!("expected a refused frame, got {other:?}"),
    }
    let grew = peak_rss_kib().saturating_sub(before);
    assert!(grew < 64 << 10, "peak RSS grew by {grew} KiB for frames that declared up to 2^64 bytes");
}

#[test]
fn an_endless_multipart_message_is_cut_at_the_message_size() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let before = peak_rss_kib();
    let limits = Limits { max_frame_size: 128 << 10, max_message_size: 1 << 20, ..Limits::default() };
    let (mut sub, endpoint) = listen(&rt, limits, &[b""]);
    py.cmd(json!({"op": "raw_connect", "name": "m", "endpoint": endpoint}));
    py.cmd(json!({"op": "raw_handshake", "name": "m"}));
    let (conn, _) = connected(&mut sub, &rt);
    let sent = py.cmd(json!({"op": "raw_endless", "name": "m", "frame_len": 100 << 10}));
    assert_eq!(sent["closed"], true, "we close the connection: {sent}");
    let reason = disconnected(&mut sub, &rt, conn);
    assert_eq!(reason.label(), "message_too_large", "{reason}");
    assert_eq!(sub.bytes_in_flight(), 0, "the unfinished message's bytes are given back");
    let grew = peak_rss_kib().saturating_sub(before);
    assert!(grew < 32 << 10, "peak RSS grew by {grew} KiB for a 1 MiB message cap");
}

#[test]
fn one_address_holding_unfinished_messages_cannot_stall_another() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let limits = Limits {
        max_frame_size: 1 << 20,
        max_message_size: 1 << 20,
        max_bytes_in_flight_per_source: 2 << 20,
        max_bytes_in_flight: 3 << 20,
        ..Limits::default()
    };
    let (mut sub, endpoint) = listen(&rt, limits, &[b""]);
    // Four connections from 127.0.0.2, each sending 900 KiB of a 1 MiB frame and stopping:
    // 3.6 MiB unfinished, more than the whole budget.
    for i in 0..4 {
        let name = format!("hog{i}");
        py.cmd(json!({"op": "raw_connect", "name": name, "endpoint": endpoint, "source": "127.0.0.2"}));
        py.cmd(json!({"op": "raw_handshake", "name": name}));
        connected(&mut sub, &rt);
        py.cmd(json!({"op": "raw_send", "name": name, "hex": format!("02{}{}", hex(&(1u64 << 20).to_be_bytes()), "00".repeat(900 << 10))}));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sub.bytes_in_flight() < (2 << 20) - (64 << 10) {
        assert!(std::time::Instant::now() < deadline, "the hogs' bytes never arrived: {}", sub.bytes_in_flight());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(sub.bytes_in_flight() <= 2 << 20, "one source holds at most its budget: {}", sub.bytes_in_flight());
    // A publisher on 127.0.0.1 still gets through.
    py.cmd(json!({"op": "pub", "name": "good", "connect": endpoint}));
    py.wait_subs("good", 1);
    py.publish("good", "kv@good", 3);
    let (seqs, _) = sub.wait_for(&rt, 20, "the good publisher's messages", {
        let mut seqs = Vec::new();
        move |e| {
            if let Event::Message(m) = e {
                seqs.push(u64::from_be_bytes(m.frames[1][..].try_into().unwrap()));
            }
            (seqs.len() == 3).then(|| seqs.clone())
        }
    });
    assert_eq!(seqs, [0, 1, 2]);
    assert!(sub.bytes_in_flight() <= 3 << 20);
}

#[test]
fn half_open_connections_are_capped_per_source_and_the_oldest_makes_room_at_the_total() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let limits = Limits {
        max_connections: 16,
        max_connections_per_source: 8,
        max_handshaking: 3,
        max_handshaking_per_source: 2,
        ..quick_limits()
    };
    let (mut sub, endpoint) = listen(&rt, limits, &[b""]);
    // Five silent connections from 127.0.0.2: two held, three refused at once.
    py.cmd(json!({"op": "flood", "name": "f2", "endpoint": endpoint, "n": 5, "source": "127.0.0.2"}));
    sub.wait_for(&rt, 20, "three SourceHandshakingFull", {
        let mut n = 0;
        move |e| {
            n += matches!(e, Event::Rejected { reason: Reason::SourceHandshakingFull { limit: 2 }, .. }) as usize;
            (n == 3).then_some(())
        }
    });
    // A publisher from another address still handshakes while they are held.
    py.cmd(json!({"op": "pub", "name": "good", "connect": endpoint}));
    connected(&mut sub, &rt);
    // A third address takes the last handshaking place; the next takes the place of the
    // oldest half-open socket (one of 127.0.0.2's), which is closed.
    py.cmd(json!({"op": "flood", "name": "f3", "endpoint": endpoint, "n": 1, "source": "127.0.0.3"}));
    py.cmd(json!({"op": "flood", "name": "f4", "endpoint": endpoint, "n": 1, "source": "127.0.0.4"}));
    let (evicted, skipped) = sub.wait_for(&rt, 20, "Evicted", |e| match e {
        Event::Rejected { reason: Reason::Evicted, peer } => Some(peer.clone()),
        _ => None,
    });
    assert_eq!(evicted.source().to_string(), "127.0.0.2", "the oldest goes first");
    assert!(
        !skipped.iter().any(|e| matches!(e, Event::Rejected { reason: Reason::HandshakingFull { .. }, .. })),
        "no newcomer refused for the total: {skipped:?}"
    );
    // Half-open sockets from many addresses cannot keep a publisher out either: with every
    // handshaking place held, it takes the oldest's and handshakes.
    py.cmd(json!({"op": "flood", "name": "f5", "endpoint": endpoint, "n": 1, "source": "127.0.0.5"}));
    sub.wait_for(&rt, 20, "another Evicted", |e| {
        matches!(e, Event::Rejected { reason: Reason::Evicted, .. }).then_some(())
    });
    py.cmd(json!({"op": "pub", "name": "late", "connect": endpoint}));
    connected(&mut sub, &rt);
    for f in ["f2", "f3", "f4", "f5"] {
        py.cmd(json!({"op": "flood_close", "name": f}));
    }
}

#[test]
fn connection_caps_hold_per_source_and_a_full_listener_makes_room_only_among_the_handshaking() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let limits = Limits { max_connections: 6, max_connections_per_source: 3, ..quick_limits() };
    let (mut sub, endpoint) = listen(&rt, limits, &[b""]);
    let count = |events: &[Event], label: &str| {
        events.iter().filter(|e| matches!(e, Event::Rejected { reason, .. } if reason.label() == label)).count()
    };
    // Five silent connections from 127.0.0.2: three admitted, two refused at once.
    py.cmd(json!({"op": "flood", "name": "f2", "endpoint": endpoint, "n": 5, "source": "127.0.0.2"}));
    let (_, mut seen) = sub.wait_for(&rt, 20, "two SourceFull", {
        let mut n = 0;
        move |e| {
            n += matches!(e, Event::Rejected { reason: Reason::SourceFull { limit: 3 }, .. }) as usize;
            (n == 2).then_some(())
        }
    });
    // Three from 127.0.0.3 fill the listener; one from 127.0.0.4 takes the place of the oldest
    // (a silent one from 127.0.0.2).
    py.cmd(json!({"op": "flood", "name": "f3", "endpoint": endpoint, "n": 3, "source": "127.0.0.3"}));
    py.cmd(json!({"op": "flood", "name": "f4", "endpoint": endpoint, "n": 1, "source": "127.0.0.4"}));
    let (evicted, skipped) = sub.wait_for(&rt, 20, "Evicted", |e| match e {
        Event::Rejected { reason: Reason::Evicted, peer } => Some(peer.clone()),
        _ => None,
    });
    seen.extend(skipped);
    assert_eq!(evicted.source().to_string(), "127.0.0.2");
    assert_eq!(count(&seen, "source_full"), 1, "{seen:?}"); // one counted in wait_for's pick
    assert_eq!(count(&seen, "listener_full"), 0, "{seen:?}");
    // The silent ones time out of the handshake and free their places for real publishers;
    // once six have handshaken, a seventh connection is refused: none is left to make room.
    let (_, skipped) = sub.wait_for(&rt, 20, "six handshake timeouts", {
        let mut n = 0;
        move |e| {
            n += matches!(e, Event::Rejected { reason: Reason::HandshakeTimeout, .. }) as usize;
            (n == 6).then_some(())
        }
    });
    assert_eq!(count(&skipped, "listener_full") + count(&skipped, "source_full"), 0);
    for name in ["g1", "g2", "g3", "g4", "g5", "g6"] {
        let source = if name <= "g3" { "127.0.0.5" } else { "127.0.0.6" };
        py.cmd(json!({"op": "pub", "name": name, "connect": format!("tcp://{source}:0;{}", endpoint.trim_start_matches("tcp://"))}));
        connected(&mut sub, &rt);
    }
    py.cmd(json!({"op": "flood", "name": "f7", "endpoint": endpoint, "n": 1, "source": "127.0.0.7"}));
    let (reason, _) = sub.wait_for(&rt, 20, "ListenerFull", |e| match e {
        Event::Rejected { reason: r @ Reason::ListenerFull { .. }, peer } => Some((r.clone(), peer.clone())),
        _ => None,
    });
    assert_eq!(reason.0, Reason::ListenerFull { limit: 6 });
    assert_eq!(reason.1.source().to_string(), "127.0.0.7");
    for f in ["f2", "f3", "f4", "f7"] {
        py.cmd(json!({"op": "flood_close", "name": f}));
    }
}

#[test]
fn a_network_holds_at_most_its_share_and_makes_room_only_among_its_own() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let limits = Limits { max_connections: 8, max_connections_per_network: 4, ..quick_limits() };
    let (mut sub, endpoint) = listen(&rt, limits, &[b""]);
    let from = |source: &str| format!("tcp://{source}:0;{}", endpoint.trim_start_matches("tcp://"));
    // Four publishers from two addresses of 127.0.9.0/24 fill their network's share.
    for (i, source) in ["127.0.9.1", "127.0.9.1", "127.0.9.2", "127.0.9.2"].iter().enumerate() {
        py.cmd(json!({"op": "pub", "name": format!("n{i}"), "connect": from(source)}));
        connected(&mut sub, &rt);
    }
    // A fifth from a third address of that network is refused: none of them is handshaking.
    py.cmd(json!({"op": "flood", "name": "f9", "endpoint": endpoint, "n": 1, "source": "127.0.9.3"}));
    let (reason, _) = sub.wait_for(&rt, 20, "NetworkFull", |e| match e {
        Event::Rejected { reason: r @ Reason::NetworkFull { .. }, peer } => Some((r.clone(), peer.clone())),
        _ => None,
    });
    assert_eq!((reason.0, reason.1.source().to_string()), (Reason::NetworkFull { limit: 4 }, "127.0.9.3".into()));
    // Another network still connects: the listener has room the first could not take.
    py.cmd(json!({"op": "pub", "name": "other", "connect": from("127.0.8.1")}));
    connected(&mut sub, &rt);
    py.cmd(json!({"op": "flood_close", "name": "f9"}));
}

#[test]
fn silence_is_closed_by_the_handshake_and_idle_timeouts() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let (mut sub, endpoint) = listen(&rt, quick_limits(), &[b""]);
    // Connects and never greets.
    py.cmd(json!({"op": "raw_connect", "name": "mute", "endpoint": endpoint}));
    assert_eq!(rejected(&mut sub, &rt), Reason::HandshakeTimeout);

    // A 3.0 peer cannot be PINGed: silence for the idle timeout closes it.
    py.cmd(json!({"op": "raw_connect", "name": "v30", "endpoint": endpoint}));
    py.cmd(json!({"op": "raw_handshake", "name": "v30", "version": [3, 0]}));
    let (conn, _) = connected(&mut sub, &rt);
    assert_eq!(disconnected(&mut sub, &rt, conn), Reason::IdleTimeout);
    let after = py.cmd(json!({"op": "raw_wait_closed", "name": "v30"}));
    assert_eq!(after["closed"], true);
    assert_eq!(after["received"], hex(b"\x00\x01\x01"), "only the subscription, no PING for a 3.0 peer");

    // A 3.1 peer that never answers our PING is closed too.
    py.cmd(json!({"op": "raw_connect", "name": "v31", "endpoint": endpoint}));
    py.cmd(json!({"op": "raw_handshake", "name": "v31"}));
    let (conn, _) = connected(&mut sub, &rt);
    assert_eq!(disconnected(&mut sub, &rt, conn), Reason::IdleTimeout);
    let after = py.cmd(json!({"op": "raw_wait_closed", "name": "v31"}));
    let ping = hex(b"\x04\x07\x04PING\x00\x00");
    assert_eq!(after["received"], format!("{}{ping}", hex(b"\x04\x0a\x09SUBSCRIBE")), "a SUBSCRIBE, then one PING");
}

#[test]
fn an_admission_filter_refuses_other_addresses_before_the_handshake() {
    let Some(mut py) = Peer::start() else { return };
    let rt = runtime();
    let only_loopback_1: kvindex_zmtp::Admission =
        std::sync::Arc::new(|peer: &kvindex_zmtp::Peer| peer.source().to_string() == "127.0.0.1");
    let listener = rt
        .block_on(SubListener::bind_admitting("tcp://127.0.0.1:0", &[b""], Limits::default(), Some(only_loopback_1)))
        .unwrap();
    let endpoint = listener.endpoint().to_string();
    let mut sub = Sub::Listener(listener);
    py.cmd(json!({"op": "raw_connect", "name": "stranger", "endpoint": endpoint, "source": "127.0.0.2"}));
    let (peer, _) = sub.wait_for(&rt, 20, "Rejected", |e| match e {
        Event::Rejected { peer, reason: Reason::NotAllowed } => Some(peer.clone()),
        _ => None,
    });
    assert_eq!(peer.source().to_string(), "127.0.0.2");
    let closed = py.cmd(json!({"op": "raw_wait_closed", "name": "stranger"}));
    assert_eq!((closed["closed"].clone(), closed["received"].clone()), (json!(true), json!("")), "not even a greeting");
    py.cmd(json!({"op": "raw_connect", "name": "friend", "endpoint": endpoint, "source": "127.0.0.1"}));
    py.cmd(json!({"op": "raw_handshake", "name": "friend"}));
    connected(&mut sub, &rt);
}
