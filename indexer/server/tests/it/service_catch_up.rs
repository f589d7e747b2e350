//! What an engine published before our SUB's subscription reached it is learned without its
//! next store: on every live connection to a publisher whose replay endpoint is known, the
//! server asks that replay socket for everything after its cursor. Found by the real-vLLM
//! agreement run (loadtest/real-vllm): the start-up replay was refused (the engine was not up),
//! the dialer joined the engine's PUB 2.2 s after it had published the fence's only batch, and
//! the idle engine published nothing more, so the index never learnt it.
//!
//! Real sockets: the server on loopback, independent pyzmq/msgspec publishers whose ROUTER
//! answers replays as vLLM's does (kvpeer.py), a grpcio client. A store "before the
//! subscription" is published while the publisher's live socket is unbound or closed (so it
//! reaches no one, as a PUB drops what no subscriber has asked for yet) and kept in its replay
//! buffer. The publisher then stays silent: only a catch-up can bring it.

use crate::support::*;
use serde_json::json;

const MODEL: &str = "m";
/// Generous: a catch-up waits for the replay cooldown (5 s) after a refused start-up replay.
const DEADLINE_S: u64 = 30;

/// A publisher of pod `pod` with a replay ROUTER, bound on fixed loopback ports (the server
/// dials them by name); `bind_later`: its PUB is not bound until `plug`.
fn publisher(peer: &mut Peer, name: &str, pod: &str, ports: (u16, u16), bind_later: bool) {
    peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "topic": format!("kv@{pod}@{MODEL}"),
        "bind": format!("tcp://127.0.0.1:{}", ports.0), "replay": format!("tcp://127.0.0.1:{}", ports.1),
        "bind_later": bind_later}));
}

/// A server dialling `pod` on `ports` (PUB, replay).
fn dialling(pod: &str, ports: (u16, u16)) -> Server {
    let flag = format!("{pod},{MODEL},tcp://127.0.0.1:{},tcp://127.0.0.1:{}", ports.0, ports.1);
    Server::start(&["--block-size", "16", "--pod", &flag])
}

/// A publisher up and a server dialling it, which holds its first store (`chain(0, 4)`) EXACT.
fn dialled_and_exact(py: &std::path::PathBuf, name: &str, pod: &str) -> (Server, Peer) {
    let ports = (free_port(), free_port());
    let mut peer = Peer::start(py);
    publisher(&mut peer, name, pod, ports, false);
    let server = dialling(pod, ports);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": [name]}))["subscribed"], true);
    store(&mut peer, name, "first", &chain(0, 4));
    peer.wait_exact(&server, &[name], MODEL, "EXACT", DEADLINE_S);
    (server, peer)
}

fn store(peer: &mut Peer, name: &str, chain_name: &str, tokens: &[u32]) -> u64 {
    peer.cmd(json!({"op": "store", "name": name, "chain": chain_name, "tokens": tokens}))["seq"].as_u64().unwrap()
}

/// Waits until `pod` is EXACT and credited `want` blocks of each `(tokens, want)`, and then
/// that it is credited with nothing its publisher does not hold.
fn wait_learnt(server: &Server, peer: &mut Peer, name: &str, pod: &str, want: &[(&[u32], u64)]) {
    wait_until(&format!("{pod} learns what was published before the subscription"), DEADLINE_S, || {
        want.iter()
            .all(|(tokens, blocks)| peer.score_pod(MODEL, tokens, pod) == (*blocks, "EXACT".to_string()))
            .then_some(())
    });
    let r = peer.check(&[name], MODEL);
    assert_eq!(r["mismatches"], json!([]), "{r}");
    assert!(server.metric("kvindex_replay_requests_total", &["reason=\"catch_up\""]) >= 1.0);
}

/// `/debug/sources` (refreshed on the workers' tick) shows `pod` at `seq`.
fn wait_last_seq(server: &Server, pod: &str, seq: u64) {
    wait_until(&format!("{pod} at seq {seq} in /debug/sources"), DEADLINE_S, || {
        server.source(pod).filter(|s| s["last_seq"] == seq)
    });
}

/// The connection `pod`'s stream was on closed: the stream is cleared and CONNECTING.
fn wait_disconnected(server: &Server, pod: &str, disconnects: u64) {
    wait_until(&format!("{pod}'s disconnect seen"), DEADLINE_S, || {
        server.source(pod).filter(|s| s["disconnects"] == disconnects && s["state"] == "CONNECTING")
    });
}

/// The issue's case: the start-up replay is refused (the engine is not up), the engine comes
/// up, publishes once before our dialer joins its PUB, and then stays idle.
#[test]
fn service_an_engine_up_after_a_refused_start_is_caught_up_while_it_stays_idle() {
    let Some(py) = python() else { return };
    let ports = (free_port(), free_port());
    let server = dialling("pod-c", ports);
    wait_until("the start-up replay refused", DEADLINE_S, || {
        (server.metric("kvindex_replays_total", &["outcome=\"unavailable\""]) >= 1.0).then_some(())
    });
    let mut peer = Peer::with_grpc(&py, &server);
    publisher(&mut peer, "c", "pod-c", ports, true);
    assert_eq!(store(&mut peer, "c", "c0", &chain(0, 4)), 0, "the engine's first batch");
    peer.cmd(json!({"op": "plug", "name": "c"}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["c"]}))["subscribed"], true, "the dialer joins");
    wait_learnt(&server, &mut peer, "c", "pod-c", &[(&chain(0, 4), 4)]);
    wait_last_seq(&server, "pod-c", 0);
}

/// A network blip: the same engine process, its live connection gone and back. While it was
/// gone the engine removed blocks it had published and stored others: the catch-up replays
/// them in order (stores, then the removes of some), and the pod is credited with what the
/// engine holds, never with a removed block.
#[test]
fn service_a_dialled_connection_that_drops_and_returns_is_caught_up_in_order() {
    let Some(py) = python() else { return };
    let (server, mut peer) = dialled_and_exact(&py, "d", "pod-d");
    peer.cmd(json!({"op": "unplug", "name": "d"}));
    wait_disconnected(&server, "pod-d", 1);
    // While nobody listens: blocks 2 and 3 of `a` go, `b` is stored.
    peer.cmd(json!({"op": "remove", "name": "d", "tokens": chain(0, 4), "blocks": [2, 3]}));
    store(&mut peer, "d", "b", &chain(1, 4));
    peer.cmd(json!({"op": "plug", "name": "d"}));
    wait_learnt(&server, &mut peer, "d", "pod-d", &[(&chain(0, 4), 2), (&chain(1, 4), 4)]);
    wait_last_seq(&server, "pod-d", 2);
}

/// The engine restarts (a new process: seq from 0, an empty replay buffer) and stores before
/// our dialer reaches its new PUB: the new process's batch is learnt, the old one's blocks
/// stay gone.
#[test]
fn service_a_restarted_engine_that_stores_before_the_dialer_joins_is_caught_up() {
    let Some(py) = python() else { return };
    let (server, mut peer) = dialled_and_exact(&py, "r", "pod-r");
    peer.cmd(json!({"op": "restart", "name": "r", "connect_later": true}));
    wait_disconnected(&server, "pod-r", 1);
    assert_eq!(store(&mut peer, "r", "new", &chain(5, 4)), 0, "the new process's first batch");
    peer.cmd(json!({"op": "plug", "name": "r"}));
    wait_learnt(&server, &mut peer, "r", "pod-r", &[(&chain(5, 4), 4), (&chain(0, 4), 0)]);
}

/// Central mode: an engine that dials our SUB loses its connection and dials again, having
/// stored while it was away. Its topic is bound to its address, and its replay endpoint is
/// registered: the new connection from that address catches it up.
#[test]
fn service_a_central_engine_that_reconnects_is_caught_up() {
    let Some(py) = python() else { return };
    let server = Server::central(&[]);
    let mut peer = Peer::with_grpc(&py, &server);
    let p = peer.cmd(json!({"op": "pub_start", "name": "z", "pod": "pod-z", "connect": server.zmq(),
        "replay": "tcp://127.0.0.1:0", "topic": format!("kv@pod-z@{MODEL}")}));
    peer.cmd(json!({"op": "register", "pod": "pod-z", "model": MODEL, "replay_endpoint": p["replay_endpoint"]}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["z"]}))["subscribed"], true);
    store(&mut peer, "z", "a", &chain(0, 4));
    peer.wait_exact(&server, &["z"], MODEL, "EXACT", DEADLINE_S);
    peer.cmd(json!({"op": "unplug", "name": "z"}));
    wait_disconnected(&server, "pod-z", 1);
    store(&mut peer, "z", "b", &chain(1, 4));
    peer.cmd(json!({"op": "plug", "name": "z"}));
    wait_learnt(&server, &mut peer, "z", "pod-z", &[(&chain(0, 4), 4), (&chain(1, 4), 4)]);
    // Away and back at once: the new connection may be reported before the old one's close.
    peer.cmd(json!({"op": "unplug", "name": "z"}));
    store(&mut peer, "z", "c", &chain(2, 4));
    peer.cmd(json!({"op": "plug", "name": "z"}));
    wait_learnt(&server, &mut peer, "z", "pod-z", &[(&chain(0, 4), 4), (&chain(1, 4), 4), (&chain(2, 4), 4)]);
    wait_last_seq(&server, "pod-z", 2);
    let s = server.source("pod-z").unwrap();
    assert_eq!((s["disconnects"].as_u64(), s["clears"].as_u64()), (Some(2), Some(2)), "{s}");
}

/// The engine restarts between our start-up replay and our dialer reaching its PUB (bound
/// late): the new process's seq 0 sits below the cursor the start-up replay left and its buffer
/// holds nothing past it, so by seq alone its batch is a duplicate and the old process's blocks
/// look current. The first connection reads the history again from 0: the old blocks go, the
/// new one is learnt.
#[test]
fn service_an_engine_that_restarts_between_the_start_up_replay_and_the_subscription_is_read_again() {
    let Some(py) = python() else { return };
    let ports = (free_port(), free_port());
    let mut peer = Peer::start(&py);
    publisher(&mut peer, "s", "pod-s", ports, true);
    store(&mut peer, "s", "old0", &chain(0, 4));
    store(&mut peer, "s", "old1", &chain(1, 4));
    let server = dialling("pod-s", ports);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    wait_until("the start-up replay learns the old process's blocks", DEADLINE_S, || {
        (peer.score_pod(MODEL, &chain(1, 4), "pod-s").0 == 4).then_some(())
    });
    peer.cmd(json!({"op": "restart", "name": "s", "connect_later": true}));
    assert_eq!(store(&mut peer, "s", "new", &chain(5, 4)), 0, "the new process's first batch");
    peer.cmd(json!({"op": "plug", "name": "s"}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["s"]}))["subscribed"], true, "the dialer joins");
    wait_learnt(&server, &mut peer, "s", "pod-s", &[(&chain(5, 4), 4), (&chain(0, 4), 0), (&chain(1, 4), 0)]);
    wait_last_seq(&server, "pod-s", 0);
}
