//! The descriptor door: sockets that never finish their ZeroMQ handshake hold a descriptor
//! each until the handshake timeout. With the default config, under a 256-descriptor limit, 300
//! of them from one address (reopened as fast as the server closes them) must not keep an
//! engine at another address from subscribing and being indexed, nor stop gRPC and HTTP.
//!
//! Why: the `idle connections` attack. The listener's caps counted every connection
//! alike, so half-open sockets from one address filled the (descriptor-derived) listener cap
//! and a real publisher was refused until they timed out, and again after they were reopened.

use crate::support::*;
use serde_json::json;

const MODEL: &str = "m";

fn central_under(max_open_files: u32, token: &std::path::Path) -> ServeProcess {
    kvindex_serve()
        .max_open_files(max_open_files)
        .args([
            "--zmq-bind",
            "tcp://127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--block-size",
            "16",
            "--admin-token-file",
            token.to_str().unwrap(),
        ])
        .start()
        .expect("kvindex serve")
}

/// An engine at 127.0.0.1 subscribes within 5 s (well within the 10 s handshake timeout) and
/// is indexed.
fn an_engine_subscribes_and_is_indexed(py: &std::path::PathBuf, server: &ServeProcess, zmq: &str) {
    let mut peer = Peer::start(py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    peer.cmd(
        json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": zmq, "topic": format!("kv@pod-a@{MODEL}")}),
    );
    assert_eq!(
        peer.cmd(json!({"op": "wait_sub", "names": ["a"], "timeout": 5}))["subscribed"],
        true,
        "the engine could not subscribe"
    );
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(1, 4)}));
    wait_until("the engine's store indexed", 10, || {
        (peer.score_pod(MODEL, &chain(1, 4), "pod-a").0 == 4).then_some(())
    });
    assert_eq!(server.get("/healthz").0, 200, "HTTP answers");
}

#[test]
fn half_open_sockets_from_one_address_do_not_lock_out_an_engine_at_another() {
    let Some(py) = python() else { return };
    let token = admin_token_file();
    let server = central_under(256, &token);
    let zmq = server.zmq.clone().expect("central mode");
    let target = zmq.trim_start_matches("tcp://").to_string();
    let mut attacker = Peer::start(&py);
    attacker.cmd(json!({"op": "hold_half_open", "target": target, "count": 300, "source": "127.0.0.2"}));
    // The listener is full of the attacker's sockets (the rest are refused, counted).
    wait_until("half-open sockets refused", 20, || {
        (server.metric("kvindex_zmq_rejected_total", &[]) >= 100.0).then_some(())
    });
    // An engine from 127.0.0.1 subscribes while the attacker keeps its sockets open.
    an_engine_subscribes_and_is_indexed(&py, &server, &zmq);
    let opened = attacker.cmd(json!({"op": "release_half_open"}))["opened"].as_u64().unwrap();
    assert!(opened >= 300, "the attacker opened {opened} sockets");
    // Refused as half-open sockets of one address, never for want of room in the listener.
    assert!(server.metric("kvindex_zmq_rejected_total", &["reason=\"source_handshaking_full\""]) >= 100.0);
    assert_eq!(server.metric("kvindex_zmq_rejected_total", &["reason=\"listener_full\""]), 0.0);
}

/// At `nofile` 1024 (384 connections, 96 of them handshaking), 24 addresses holding
/// 4 half-open sockets each kept a legitimate engine from subscribing for 25 s: the per-address
/// caps held, the total did not. At the total, the newcomer now takes the place of the oldest
/// half-open socket.
#[test]
fn half_open_sockets_from_many_addresses_do_not_lock_out_an_engine() {
    let Some(py) = python() else { return };
    let token = admin_token_file();
    let server = central_under(1024, &token);
    let zmq = server.zmq.clone().expect("central mode");
    let target = zmq.trim_start_matches("tcp://").to_string();
    let mut attacker = Peer::start(&py);
    // Five each: four held, the fifth refused for its address (re-opened as it is closed), so
    // once 24 are refused every address holds its four and the handshaking places are full.
    for i in 2..26 {
        attacker.cmd(json!({"op": "hold_half_open", "target": target, "count": 5, "source": format!("127.0.0.{i}")}));
    }
    wait_until("every address holding its four", 20, || {
        (server.metric("kvindex_zmq_rejected_total", &["reason=\"source_handshaking_full\""]) >= 24.0).then_some(())
    });
    an_engine_subscribes_and_is_indexed(&py, &server, &zmq);
    attacker.cmd(json!({"op": "release_half_open"}));
    assert!(server.metric("kvindex_zmq_rejected_total", &["reason=\"evicted\""]) >= 1.0, "the oldest made room");
    assert_eq!(server.metric("kvindex_zmq_rejected_total", &["reason=\"handshaking_full\""]), 0.0);
}

/// The per-address caps bounded one address, not several of one owner. Under a
/// 256-descriptor limit (16 connections, 4 per address), four addresses of one /24 with four
/// publishers each filled the listener for good. A network now holds half of it.
#[test]
fn one_network_cannot_take_the_listener() {
    let Some(py) = python() else { return };
    let token = admin_token_file();
    let server = central_under(256, &token);
    let zmq = server.zmq.clone().expect("central mode");
    let mut attacker = Peer::start(&py);
    let from = |source: &str| format!("tcp://{source}:0;{}", zmq.trim_start_matches("tcp://"));
    for address in 1..=4 {
        for i in 0..4 {
            let name = format!("n{address}-{i}");
            let topic = format!("kv@{name}@{MODEL}");
            attacker.cmd(json!({"op": "pub_start", "name": name, "pod": name, "connect": from(&format!("127.0.9.{address}")), "topic": topic}));
        }
    }
    // They hold their network's share and the rest are refused (or, without that share, the
    // whole listener).
    wait_until("the attackers' connections in", 20, || {
        let held = server.metric("kvindex_zmq_connections_total", &[]);
        let refused = server.metric("kvindex_zmq_rejected_total", &[]);
        (held >= 16.0 || (held >= 8.0 && refused >= 8.0)).then_some(())
    });
    an_engine_subscribes_and_is_indexed(&py, &server, &zmq);
    // The refused publishers keep re-dialling; at first some are refused by the per-address
    // handshake caps (all sixteen dial at once), then, once the network's share is held, for
    // their network.
    wait_until("the network's share refused", 20, || {
        (server.metric("kvindex_zmq_rejected_total", &["reason=\"network_full\""]) >= 8.0).then_some(())
    });
    assert_eq!(server.metric("kvindex_zmq_rejected_total", &["reason=\"listener_full\""]), 0.0);
}
