//! One pod, one owner: a pod id (after DP naming) belongs to the first stream that names it,
//! and no other stream can credit, extend, remove, clear or withhold its blocks, whatever the
//! naming mode. Before, the topic binding held per (topic id, rank) while blocks, clears and
//! scores were kept per resulting pod id, so a publisher at another address sending
//! `kv@h:7999@m` with DP rank 1 fed pod `h:8000`, another engine's; another address sending the
//! owner's own topic with rank 1 took pod `h:8001`; and two real engines whose DP names met
//! (`h:8000` with DP 2, and `h:8001`) mixed their blocks in one pod.
//!
//! Independent peers: pyzmq publishers sending vLLM's frames from two loopback addresses
//! (127.0.0.2 the owner, 127.0.0.3 the other: libzmq's `source;destination` connect form), the
//! server's bound SUB or its dialled sockets, and a grpcio client scoring through ScoreTokens.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::support::*;
use serde_json::json;

const MODEL: &str = "m";
/// The owner's pod, as its topic names it.
const VICTIM: &str = "10.0.0.9:8000";

/// The central SUB's endpoint, dialled from 127.0.0.`last`.
fn from(server: &Server, last: u8) -> String {
    format!("tcp://127.0.0.{last}:0;{}", server.zmq().trim_start_matches("tcp://"))
}

/// Starts publisher `name` for `pod` on `topic` with DP rank `rank`, from 127.0.0.`last`.
fn publisher(peer: &mut Peer, server: &Server, name: &str, pod: &str, topic: &str, rank: u32, last: u8) {
    let connect = from(server, last);
    peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": connect, "topic": topic, "dp_rank": rank}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": [name]}))["subscribed"], true, "{name} subscribed");
}

/// The owner, from 127.0.0.2, holding chain 0 (4 blocks) on `VICTIM`, EXACT.
fn owner(peer: &mut Peer, server: &Server) {
    publisher(peer, server, "owner", VICTIM, &format!("kv@{VICTIM}@{MODEL}"), 0, 2);
    peer.cmd(json!({"op": "store", "name": "owner", "chain": "c0", "tokens": chain(0, 4)}));
    peer.wait_exact(server, &["owner"], MODEL, "EXACT", 30);
}

/// The owner's pod holds chain 0 and nothing else, credited (neither extended, cleared,
/// removed, invented nor withheld).
fn assert_victim_intact(peer: &mut Peer) {
    assert_eq!(
        peer.score_pod(MODEL, &chain(0, 8), VICTIM),
        (4, "EXACT".to_string()),
        "the owner's chain, as it holds it"
    );
    assert_eq!(peer.score_pod(MODEL, &chain(9, 4), VICTIM).0, 0, "a chain the owner never held");
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// From 127.0.0.3, publisher `evil` on `topic` with DP rank `rank` tries everything a stream
/// can do to a pod: invent a chain, extend the owner's, remove and clear the owner's blocks,
/// and fall behind its engine (a frozen `ts`) so the pod is withheld. Each message must be
/// refused (`refusals` counts them) and the owner's pod untouched; the owner goes on.
fn attack(server: &Server, peer: &mut Peer, topic: &str, rank: u32, refusals: &dyn Fn(&Server) -> f64) {
    publisher(peer, server, "evil", VICTIM, topic, rank, 3);
    let before = refusals(server);
    peer.cmd(json!({"op": "store", "name": "evil", "chain": "fake", "tokens": chain(9, 4)}));
    peer.cmd(json!({"op": "store", "name": "evil", "chain": "ext", "tokens": chain(0, 8), "start": 4, "n": 4}));
    peer.cmd(json!({"op": "remove", "name": "evil", "tokens": chain(0, 4), "blocks": [0, 1, 2, 3]}));
    peer.cmd(json!({"op": "clear", "name": "evil"}));
    // 2.5 s of batches all made at one instant: a backlog past the 1 s bound the servers run.
    peer.cmd(json!({"op": "pace", "name": "evil", "n": 100, "interval_ms": 25, "frozen_ts": unix_now()}));
    let sent = 104.0;
    wait_until("every message of the other stream refused", 30, || {
        assert_victim_intact(peer);
        (refusals(server) - before >= sent).then_some(())
    });
    assert_victim_intact(peer);
    assert_eq!(listed(server, "sources"), [VICTIM], "the other stream was never made");
    // The owner is served as before.
    peer.cmd(json!({"op": "store", "name": "owner", "chain": "c1", "tokens": chain(1, 4)}));
    peer.wait_exact(server, &["owner"], MODEL, "EXACT", 30);
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), VICTIM).0, 4);
}

/// The pods of `/debug/sources`' list `list` (`sources`, `registered_pods`), sorted.
fn listed(server: &Server, list: &str) -> Vec<String> {
    let mut pods: Vec<String> =
        server.sources()[list].as_array().unwrap().iter().map(|s| s["pod"].as_str().unwrap().to_string()).collect();
    pods.sort();
    pods
}

fn pod_owned(server: &Server) -> f64 {
    server.metric("kvindex_sources_refused_total", &["reason=\"pod_owned\""])
}

fn topic_conflicts(server: &Server) -> f64 {
    server.metric("kvindex_topic_conflicts_total", &[])
}

/// The central servers of these tests: a 1 s staleness bound (a frozen `ts` withholds fast).
fn central(extra: &[&str]) -> Server {
    let mut args = vec!["--max-source-staleness-ms", "1000"];
    args.extend_from_slice(extra);
    Server::central(&args)
}

/// A central server with `extra` flags and the owner on it, with a peer scoring on it.
fn with_owner(extra: &[&str]) -> Option<(Server, Peer)> {
    let py = python()?;
    let server = central(extra);
    let mut peer = Peer::with_grpc(&py, &server);
    owner(&mut peer, &server);
    Some((server, peer))
}

/// [`with_owner`], then [`attack`] with `topic`'s rank.
fn owner_attacked(extra: &[&str], topic: &str, rank: u32, refusals: &dyn Fn(&Server) -> f64) {
    let Some((server, mut peer)) = with_owner(extra) else { return };
    attack(&server, &mut peer, topic, rank, refusals);
}

/// Rank 1 of topic id `h:7999` is pod `h:8000` by the port offset: another base's pod.
#[test]
fn another_topics_dp_rank_cannot_feed_an_owned_pod() {
    owner_attacked(&[], &format!("kv@10.0.0.9:7999@{MODEL}"), 1, &pod_owned);
}

/// `--dp-naming topic`: every rank of a topic names the topic's pod, so another address sending
/// the owner's topic with rank 1 named the owner's pod itself.
#[test]
fn with_topic_naming_another_address_cannot_feed_an_owned_pod_through_a_rank() {
    owner_attacked(&["--dp-naming", "topic"], &format!("kv@{VICTIM}@{MODEL}"), 1, &topic_conflicts);
}

/// The operator's allowlist admits both addresses: being allowed to publish is not owning a pod.
#[test]
fn an_allowed_address_cannot_feed_another_streams_pod() {
    owner_attacked(&["--zmq-allow", "127.0.0.0/8"], &format!("kv@10.0.0.9:7999@{MODEL}"), 1, &pod_owned);
}

/// A pod the operator configured (central mode, pods file) is fed by configured streams only.
#[test]
fn an_operator_configured_pod_cannot_be_fed_by_another_topics_rank() {
    let Some(py) = python() else { return };
    let dir = std::env::temp_dir().join(format!("kvindex-pod-owner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pods.toml");
    std::fs::write(&file, format!("[[pods]]\nid = \"{VICTIM}\"\nmodel = \"{MODEL}\"\n")).unwrap();
    let server = central(&["--pods-file", file.to_str().unwrap()]);
    wait_until("the configured pod registered", 20, || (listed(&server, "registered_pods") == [VICTIM]).then_some(()));
    let mut peer = Peer::with_grpc(&py, &server);
    owner(&mut peer, &server);
    attack(&server, &mut peer, &format!("kv@10.0.0.9:7999@{MODEL}"), 1, &pod_owned);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bound topic binds all its DP ranks to its address: another address sending the owner's
/// topic with rank 1 does not take pod `:8001`, and the owner's real rank 1 then gets it.
#[test]
fn a_bound_topics_other_ranks_stay_with_its_address() {
    let Some((server, mut peer)) = with_owner(&[]) else { return };
    let topic = format!("kv@{VICTIM}@{MODEL}");
    let rank1 = "10.0.0.9:8001";
    publisher(&mut peer, &server, "evil", rank1, &topic, 1, 3);
    let before = topic_conflicts(&server);
    peer.cmd(json!({"op": "store", "name": "evil", "chain": "fake", "tokens": chain(9, 4)}));
    wait_until("the other address's rank 1 refused", 30, || {
        assert_eq!(peer.score_pod(MODEL, &chain(9, 4), rank1).0, 0, "the other address took rank 1's pod");
        (topic_conflicts(&server) > before).then_some(())
    });
    assert!(server.source(rank1).is_none(), "no stream for rank 1 from the other address");
    // The owner's rank 1, from the owner's address, is served.
    publisher(&mut peer, &server, "rank1", rank1, &topic, 1, 2);
    peer.cmd(json!({"op": "store", "name": "rank1", "chain": "r1", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["owner", "rank1"], MODEL, "EXACT", 30);
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), rank1), (4, "EXACT".to_string()));
    assert_eq!(peer.score_pod(MODEL, &chain(9, 4), rank1).0, 0);
    assert_eq!(server.metric("kvindex_sources_refused_total", &["reason=\"pod_owned\""]), 0.0);
}

/// A topic id with another spelling of a port (`07999`, `+7999`: both once read as 7999, so
/// rank 1 named `:8000`) or a spelled-out DP suffix names no stream: refused and counted.
#[test]
fn a_topic_id_with_a_port_spelled_otherwise_or_a_dp_suffix_is_refused() {
    let Some((server, mut peer)) = with_owner(&[]) else { return };
    let refused = |s: &Server| s.metric("kvindex_sources_refused_total", &["reason=\"name\""]);
    for (i, (topic, rank)) in
        [("kv@10.0.0.9:07999@m", 1), ("kv@10.0.0.9:+7999@m", 1), ("kv@10.0.0.9:8000#dp1@m", 0)].into_iter().enumerate()
    {
        let name = format!("evil{i}");
        publisher(&mut peer, &server, &name, VICTIM, topic, rank, 3);
        let before = refused(&server);
        peer.cmd(json!({"op": "store", "name": name, "chain": "fake", "tokens": chain(9, 4)}));
        peer.cmd(json!({"op": "clear", "name": name}));
        wait_until(&format!("{topic} refused"), 30, || {
            assert_victim_intact(&mut peer);
            (refused(&server) - before >= 2.0).then_some(())
        });
    }
    assert_victim_intact(&mut peer);
    assert_eq!(listed(&server, "sources"), [VICTIM], "only the owner's stream");
}

/// Two real engines on one host whose DP names meet: vLLM at `:8000` with DP 2 (rank 1 named
/// `:8001`) and another vLLM at `:8001`. The later stream is refused with a named reason; the
/// pod holds only its owner's blocks, never a mix.
#[test]
fn two_engines_whose_dp_names_meet_are_never_merged() {
    let Some(py) = python() else { return };
    let server = central(&[]);
    let mut peer = Peer::with_grpc(&py, &server);
    let (a, b) = ("10.0.0.5:8000", "10.0.0.5:8001");
    let topic_a = format!("kv@{a}@{MODEL}");
    publisher(&mut peer, &server, "a0", a, &topic_a, 0, 2);
    publisher(&mut peer, &server, "a1", b, &topic_a, 1, 2);
    peer.cmd(json!({"op": "store", "name": "a0", "chain": "a0", "tokens": chain(0, 4)}));
    peer.cmd(json!({"op": "store", "name": "a1", "chain": "a1", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["a0", "a1"], MODEL, "EXACT", 30);
    // Engine B, from the same host.
    publisher(&mut peer, &server, "b", b, &format!("kv@{b}@{MODEL}"), 0, 2);
    let before = pod_owned(&server);
    peer.cmd(json!({"op": "store", "name": "b", "chain": "b", "tokens": chain(2, 4)}));
    peer.cmd(json!({"op": "clear", "name": "b"}));
    wait_until("engine B's messages refused", 30, || {
        assert_eq!(peer.score_pod(MODEL, &chain(2, 4), b).0, 0, "engine B's blocks mixed into rank 1 of A");
        assert_eq!(peer.score_pod(MODEL, &chain(1, 4), b), (4, "EXACT".to_string()), "A's rank 1 cleared by B");
        (pod_owned(&server) - before >= 2.0).then_some(())
    });
    assert_eq!(listed(&server, "sources"), [a, b], "one stream per pod");
}

/// The same two engines dialled: the later registration is refused with an error naming both.
#[test]
fn a_registration_whose_dp_names_meet_another_pods_is_refused() {
    let server = Server::start(&["--block-size", "16"]);
    let register = |pod: &str, dp_size: u32, port: u16| {
        let body =
            json!({"pod": pod, "model": MODEL, "endpoint": format!("tcp://127.0.0.1:{port}"), "dp_size": dp_size});
        server.http("POST", "/pods", Some(&body.to_string()))
    };
    let (status, body) = register("10.0.0.5:8000", 2, free_port());
    assert_eq!(status, 200, "{body}");
    for (pod, dp_size) in [("10.0.0.5:8001", 1), ("10.0.0.5:7999", 3)] {
        let (status, body) = register(pod, dp_size, free_port());
        assert_eq!(status, 400, "{pod}: {body}");
        assert!(body.contains(pod) && body.contains("registered pod \\\"10.0.0.5:8000\\\""), "{body}");
    }
    assert_eq!(server.metric("kvindex_config_errors_total", &["source=\"http\""]), 2.0);
    assert_eq!(listed(&server, "registered_pods"), ["10.0.0.5:8000"]);
    // Re-registering the owner itself is no collision.
    assert_eq!(register("10.0.0.5:8000", 2, free_port()).0, 200);
}

/// Dial and bind modes together: a dialled pod's streams (and its ranks' pod ids) are fed by
/// its dialers only; the central SUB cannot feed them, by its topic or another's rank.
#[test]
fn a_central_topic_cannot_feed_a_dialled_pod() {
    let Some(py) = python() else { return };
    let server = central(&[]);
    let mut peer = Peer::with_grpc(&py, &server);
    let p = peer.cmd(json!({"op": "pub_start", "name": "owner", "pod": VICTIM, "bind": "tcp://127.0.0.1:0",
        "topic": format!("kv@{VICTIM}@{MODEL}")}));
    let body = json!({"pod": VICTIM, "model": MODEL, "endpoint": p["endpoint"]});
    let (status, reply) = server.http("POST", "/pods", Some(&body.to_string()));
    assert_eq!(status, 200, "{reply}");
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["owner"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "owner", "chain": "c0", "tokens": chain(0, 4)}));
    peer.wait_exact(&server, &["owner"], MODEL, "EXACT", 30);
    attack(&server, &mut peer, &format!("kv@{VICTIM}@{MODEL}"), 0, &pod_owned);
    peer.cmd(json!({"op": "stop", "name": "evil"}));
    attack(&server, &mut peer, &format!("kv@10.0.0.9:7999@{MODEL}"), 1, &pod_owned);
}

/// Ownership ends when the owning stream is gone: engine A (DP 2) leaves, and engine B, which
/// names A's rank-1 pod, is refused until A's stream may be reclaimed (its connection closed,
/// silent past `stale_after_ms`); then B owns the pod. A restarted A, at its address, would
/// have been its own stream again.
#[test]
fn a_departed_owners_pod_goes_to_the_engine_that_takes_its_place() {
    let Some(py) = python() else { return };
    let server = central(&["--stale-after-ms", "1500"]);
    let mut peer = Peer::with_grpc(&py, &server);
    let (a, b) = ("10.0.0.5:8000", "10.0.0.5:8001");
    publisher(&mut peer, &server, "a1", b, &format!("kv@{a}@{MODEL}"), 1, 2);
    peer.cmd(json!({"op": "store", "name": "a1", "chain": "a1", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["a1"], MODEL, "EXACT", 30);
    publisher(&mut peer, &server, "b", b, &format!("kv@{b}@{MODEL}"), 0, 3);
    let before = pod_owned(&server);
    peer.cmd(json!({"op": "store", "name": "b", "chain": "b", "tokens": chain(2, 4)}));
    wait_until("B refused while A is connected", 30, || (pod_owned(&server) > before).then_some(()));
    assert_eq!(peer.score_pod(MODEL, &chain(2, 4), b).0, 0);
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), b).0, 4, "A's rank 1 is still served");
    // A leaves: its pod is cleared at once, and given to B once A's stream may go. B's stream
    // starts past the batches that were refused (no replay here): DEGRADED, credited from then on.
    peer.cmd(json!({"op": "stop", "name": "a1"}));
    let mut round = 0;
    wait_until("B owns the pod", 30, || {
        round += 1;
        peer.cmd(json!({"op": "store", "name": "b", "chain": format!("b{round}"), "tokens": chain(2, 4)}));
        (peer.score_pod(MODEL, &chain(2, 4), b).0 == 4).then_some(())
    });
    wait_until("B's stream in the debug view", 20, || server.source(b).filter(|s| s["topic_id"] == b));
    assert_eq!(peer.score_pod(MODEL, &chain(1, 4), b).0, 0, "nothing of A's is left");
    assert!(server.metric("kvindex_sources_reclaimed_total", &["reason=\"contested\""]) >= 1.0);
    assert_eq!(listed(&server, "sources"), [b]);
}
