//! A publisher's connection closing stops its pod's blocks being claimed at once, before
//! any new message: a restarted vLLM publishes nothing until it serves a request, so waiting
//! for its first event over-predicted the first request routed to it (found by the
//! real-vLLM agreement run, loadtest/real-vllm). Real sockets: the server on loopback,
//! independent pyzmq/msgspec publishers, a grpcio client; central (bind) and per-pod (dial).

use crate::support::*;
use serde_json::json;

const MODEL: &str = "m";

fn peer_for(py: &std::path::PathBuf, server: &Server) -> Peer {
    Peer::with_grpc(py, server)
}

/// Stores two chains on publisher `name` (pod `pod`) and waits until they are EXACT.
fn store_and_see(server: &Server, peer: &mut Peer, name: &str, pod: &str, first: u32) {
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": [name]}))["subscribed"], true);
    for k in first..first + 2 {
        peer.cmd(json!({"op": "store", "name": name, "chain": format!("c{k}"), "tokens": chain(k, 4)}));
    }
    peer.wait_exact(server, &[name], MODEL, "EXACT", 20);
    assert_eq!(peer.score_pod(MODEL, &chain(first, 4), pod), (4, "EXACT".to_string()));
}

/// Closes publisher `name` (linger 0: the TCP connection goes) and waits, with nothing else
/// published, until `pod` claims none of chains `first`, `first + 1`.
fn close_and_see_cleared(server: &Server, peer: &mut Peer, name: &str, pod: &str, first: u32) {
    peer.cmd(json!({"op": "stop", "name": name}));
    wait_until(&format!("{pod} cleared by the disconnect alone"), 20, || {
        let gone = (first..first + 2).all(|k| peer.score_pod(MODEL, &chain(k, 4), pod).0 == 0);
        gone.then_some(())
    });
    let s = wait_until("the debug view shows the disconnect", 20, || {
        server.source(pod).filter(|s| s["disconnects"] == 1 && s["state"] == "CONNECTING")
    });
    assert_eq!(s["restarts"], 0, "{s}");
    assert!(server.metric("kvindex_clears_total", &["reason=\"disconnect\""]) >= 1.0);
    assert!(server.metric("kvindex_source_transitions_total", &["to=\"CONNECTING\"", "reason=\"disconnect\""]) >= 1.0);
}

/// The speculative credit (RecordRoute) of `pod` for `tokens`.
fn credit(peer: &mut Peer, tokens: &[u32], pod: &str) -> u64 {
    peer.score(MODEL, tokens, &[pod])["scores"][0]["speculative_blocks"].as_u64().unwrap()
}

#[test]
fn service_central_disconnect_clears_the_pod_until_the_next_publisher() {
    let Some(py) = python() else { return };
    let server = Server::central(&["--speculative-ttl-ms", "60000", "--speculative-max-ttl-ms", "60000"]);
    let mut peer = peer_for(&py, &server);
    let topic = format!("kv@pod-a@{MODEL}");
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": server.zmq(), "topic": topic}));
    store_and_see(&server, &mut peer, "a", "pod-a", 0);
    let routed = chain(7, 4);
    let r = peer.cmd(json!({"op": "record_route", "pod": "pod-a", "model": MODEL, "tokens": routed}));
    assert_eq!(r["credited_blocks"], 4, "{r}");
    assert_eq!(credit(&mut peer, &routed, "pod-a"), 4);
    close_and_see_cleared(&server, &mut peer, "a", "pod-a", 0);
    assert_eq!(credit(&mut peer, &routed, "pod-a"), 0, "the speculative credit goes with the blocks");
    // A new process for the same pod, from seq 0, is indexed again.
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": server.zmq(), "topic": topic}));
    store_and_see(&server, &mut peer, "a", "pod-a", 10);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pod-a").0, 0, "the old process's blocks stay gone");
    assert_eq!(server.source("pod-a").unwrap()["last_seq"], 1);
}

#[test]
fn service_per_pod_disconnect_clears_the_pod_until_the_next_publisher() {
    let Some(py) = python() else { return };
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    let flag = format!("pod-d,{MODEL},{endpoint}");
    let server = Server::start(&["--block-size", "16", "--pod", &flag]);
    let mut peer = peer_for(&py, &server);
    let topic = format!("kv@pod-d@{MODEL}");
    peer.cmd(json!({"op": "pub_start", "name": "d", "pod": "pod-d", "bind": endpoint, "topic": topic}));
    store_and_see(&server, &mut peer, "d", "pod-d", 0);
    close_and_see_cleared(&server, &mut peer, "d", "pod-d", 0);
    assert_eq!(server.source("pod-d").unwrap()["mode"], "per-pod");
    // The engine comes back on the same endpoint; the dialer reconnects and it is indexed again.
    peer.cmd(json!({"op": "pub_start", "name": "d", "pod": "pod-d", "bind": endpoint, "topic": topic}));
    store_and_see(&server, &mut peer, "d", "pod-d", 10);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pod-d").0, 0, "the old process's blocks stay gone");
}

/// Central mode binds a topic to its first source address: a publisher elsewhere sending the
/// same topic has its messages dropped, and its connection closing must not clear the pod.
#[test]
fn service_foreign_disconnect_clears_nothing() {
    let Some(py) = python() else { return };
    let server = Server::central(&[]);
    let mut peer = peer_for(&py, &server);
    let topic = format!("kv@pod-a@{MODEL}");
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": server.zmq(), "topic": topic}));
    store_and_see(&server, &mut peer, "a", "pod-a", 0);
    // 127.0.0.2 is another loopback address (libzmq's source;destination form).
    let from_elsewhere = format!("tcp://127.0.0.2:0;{}", server.zmq().trim_start_matches("tcp://"));
    peer.cmd(json!({"op": "pub_start", "name": "evil", "pod": "pod-a", "connect": from_elsewhere, "topic": topic}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["evil"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "evil", "chain": "fake", "tokens": chain(9, 4)}));
    wait_until("the foreign message dropped", 20, || {
        (server.metric("kvindex_topic_conflicts_total", &[]) >= 1.0).then_some(())
    });
    let before = server.metric("kvindex_zmq_disconnects_total", &["socket=\"central\""]);
    peer.cmd(json!({"op": "stop", "name": "evil"}));
    wait_until("the foreign disconnect seen", 20, || {
        (server.metric("kvindex_zmq_disconnects_total", &["socket=\"central\""]) > before).then_some(())
    });
    // A message of the real publisher queues behind the disconnect on its worker: once it is
    // applied, the disconnect has been handled.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c5", "tokens": chain(5, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), "pod-a"), (4, "EXACT".to_string()), "the pod is not cleared");
    assert_eq!(peer.score_pod(MODEL, &chain(9, 4), "pod-a").0, 0, "invented blocks are not served");
    let s = server.source("pod-a").unwrap();
    assert_eq!((s["disconnects"].as_u64(), s["restarts"].as_u64()), (Some(0), Some(0)), "{s}");
    assert_eq!(server.metric("kvindex_clears_total", &["reason=\"disconnect\""]), 0.0);
}
