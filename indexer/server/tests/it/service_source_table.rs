//! The source table is a door too: a publisher that makes up topics cannot fill it and keep a
//! real engine out. Its streams are capped per address (`max_sources_per_address`), and when
//! the table is full a stream nobody configured that never became EXACT and went silent is
//! reclaimed for the newcomer (one publisher filled the 4,096 slots for good, and a
//! real engine still scored 0 at 35 s).

use crate::support::*;
use serde_json::json;

const MODEL: &str = "m";

fn central(extra: &[&str]) -> Server {
    let mut args = vec!["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16", "--apply-workers", "1"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// A peer with a gRPC client and a publisher, `flood`, dialling the central SUB from 127.0.0.2:
/// the one that makes topics up.
fn flooder(py: &std::path::PathBuf, server: &Server) -> Peer {
    let mut peer = Peer::start(py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let connect = from_address("127.0.0.2", &server.zmq());
    peer.cmd(json!({"op": "pub_start", "name": "flood", "pod": "x", "connect": connect, "topic": "kv@x@m"}));
    peer.cmd(json!({"op": "wait_sub", "names": ["flood"]}));
    peer
}

/// A publisher dialling `zmq` from source address `from` (libzmq's `source;destination` form).
fn from_address(from: &str, zmq: &str) -> String {
    format!("tcp://{from}:0;{}", zmq.trim_start_matches("tcp://"))
}

#[test]
fn one_address_cannot_take_more_than_its_share_of_the_table() {
    let Some(py) = python() else { return };
    let server = central(&["--max-sources", "100", "--max-sources-per-address", "8"]);
    let zmq = server.zmq();
    let mut peer = flooder(&py, &server);
    peer.cmd(json!({"op": "topics_flood", "name": "flood", "prefix": "made-up-", "n": 40, "model": MODEL}));
    wait_until("32 made-up topics refused", 20, || {
        (server.metric("kvindex_sources_refused_total", &["reason=\"max_sources_per_address\""]) >= 32.0).then_some(())
    });
    // The debug view follows every 100 ms: wait for it to show the eight.
    wait_until("the eight admitted streams listed", 20, || {
        (server.sources()["sources"].as_array().unwrap().len() == 8).then_some(())
    });
    // An engine at another address is in at once.
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": from_address("127.0.0.3", &zmq), "topic": format!("kv@pod-a@{MODEL}")}));
    peer.cmd(json!({"op": "wait_sub", "names": ["a"]}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert_eq!(server.metric("kvindex_sources_refused_total", &["reason=\"max_sources_per_address\""]), 32.0);
}

#[test]
fn a_full_table_reclaims_made_up_streams_for_a_real_engine() {
    let Some(py) = python() else { return };
    let server = central(&["--max-sources", "6"]);
    let zmq = server.zmq();
    let mut peer = flooder(&py, &server);
    // Made-up topics that start past seq 0 with no replay: never EXACT.
    peer.cmd(json!({"op": "topics_flood", "name": "flood", "prefix": "made-up-", "n": 6, "model": MODEL, "seq": 5}));
    wait_until("the table full of made-up streams", 20, || {
        (server.sources()["sources"].as_array().unwrap().len() == 6).then_some(())
    });
    // While they keep talking, a newcomer is refused (nothing is reclaimed that is not silent).
    peer.cmd(json!({"op": "topics_flood", "name": "flood", "prefix": "made-up-", "n": 7, "model": MODEL, "seq": 6}));
    wait_until("the seventh made-up topic refused", 20, || {
        (server.metric("kvindex_sources_refused_total", &["reason=\"max_sources\""]) >= 1.0).then_some(())
    });
    // Once they have been silent for a second, a real engine takes a slot from its first
    // message on and is indexed exactly.
    wait_until("the made-up streams silent for 1 s", 20, || {
        let sources = server.sources();
        let all = sources["sources"].as_array().unwrap();
        all.iter().all(|s| s["last_event_age_ms"].as_u64().is_some_and(|age| age >= 1_100)).then_some(())
    });
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": from_address("127.0.0.3", &zmq), "topic": format!("kv@pod-a@{MODEL}")}));
    peer.cmd(json!({"op": "wait_sub", "names": ["a"]}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert!(server.metric("kvindex_sources_reclaimed_total", &["reason=\"unconfirmed\""]) >= 1.0);
    assert_eq!(server.sources()["sources"].as_array().unwrap().len(), 6);
}

/// Every listed stream whose pod id starts with `prefix` has said nothing for over a second:
/// old enough to be reclaimed, if it may be.
fn quiet_for_a_second(server: &Server, prefix: &str) -> bool {
    let sources = server.sources();
    let all = sources["sources"].as_array().unwrap();
    all.iter()
        .filter(|s| s["pod"].as_str().is_some_and(|p| p.starts_with(prefix)))
        .all(|s| s["last_event_age_ms"].as_u64().is_some_and(|age| age >= 1_100))
}

/// Streams that stay EXACT and keep talking were never reclaimed, so 64 addresses
/// could hold the default table for good. A stream whose pod holds no block in the index now
/// makes room however much it talks; one that holds blocks never does while it talks, so a
/// peer churning made-up topics cannot evict a real engine.
#[test]
fn a_talking_stream_that_holds_nothing_makes_room_and_churn_never_evicts_an_engine() {
    let Some(py) = python() else { return };
    let server = central(&["--max-sources", "4"]);
    let zmq = server.zmq();
    let mut peer = flooder(&py, &server);
    // Four made-up topics from seq 0, EXACT, each batch empty: they talk and hold nothing.
    let talk = |peer: &mut Peer, prefix: &str, first: u64, n: u64, seq: u64| {
        peer.cmd(json!({"op": "topics_flood", "name": "flood", "prefix": prefix, "first": first, "n": n, "model": MODEL, "seq": seq, "empty": true}));
    };
    talk(&mut peer, "talker-", 0, 4, 0);
    wait_until("the table full of EXACT talkers, a second old", 20, || {
        let sources = server.sources();
        let all = sources["sources"].as_array().unwrap();
        (all.len() == 4 && all.iter().all(|s| s["state"] == "EXACT") && quiet_for_a_second(&server, "talker-"))
            .then_some(())
    });
    // They talk again, and an engine at another address publishes a store meanwhile.
    talk(&mut peer, "talker-", 0, 4, 1);
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "pod-a", "connect": from_address("127.0.0.3", &zmq), "topic": format!("kv@pod-a@{MODEL}")}));
    peer.cmd(json!({"op": "wait_sub", "names": ["a"]}));
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert!(server.metric("kvindex_sources_reclaimed_total", &["reason=\"empty\""]) >= 1.0);

    // Waves of new made-up topics, each meeting a full table whose other streams are old
    // enough to go: they take the talkers' places and each other's, never the engine's, which
    // holds blocks in the first wave and none after it cleared its cache (it stored some: an
    // engine that emptied its cache keeps its place).
    let refused = |server: &Server| server.metric("kvindex_sources_refused_total", &["reason=\"max_sources\""]);
    for wave in 0..3u64 {
        if wave == 1 {
            peer.cmd(json!({"op": "clear", "name": "a"}));
            wait_until("the engine's cache cleared", 20, || {
                (peer.score_pod(MODEL, &chain(1, 4), "pod-a") == (0, "EXACT".to_string())).then_some(())
            });
        }
        wait_until("the made-up streams a second old", 20, || {
            (quiet_for_a_second(&server, "talker-") && quiet_for_a_second(&server, "churn-")).then_some(())
        });
        let before = refused(&server);
        talk(&mut peer, "churn-", wave * 8, 8, 0);
        // Its first topics took the places of the old made-up streams; the rest were refused.
        let first = format!("churn-{}", wave * 8);
        wait_until("the wave in, and met a full table", 20, || {
            (server.source(&first).is_some() && refused(&server) > before).then_some(())
        });
        let held = if wave == 0 { 4 } else { 0 };
        assert_eq!(peer.score_pod(MODEL, &chain(1, 4), "pod-a"), (held, "EXACT".to_string()), "wave {wave}");
        assert!(server.source("pod-a").is_some(), "wave {wave}: the engine's stream was reclaimed");
    }
    assert!(server.metric("kvindex_sources_reclaimed_total", &["reason=\"empty\""]) >= 4.0);
    // Its stream was never forgotten: its next store is indexed exactly on it.
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["a"], MODEL, "EXACT", 20);
    assert_eq!(server.source("pod-a").unwrap()["restarts"], 0);
}

/// The lines of `/metrics` that carry a `source` or `pod` label naming `prefix…`.
fn series_of(server: &Server, prefix: &str) -> Vec<String> {
    let text = server.get("/metrics").1;
    let labels = [format!("source=\"{prefix}"), format!("pod=\"{prefix}")];
    text.lines().filter(|l| !l.starts_with('#') && labels.iter().any(|p| l.contains(p))).map(str::to_string).collect()
}

/// Per-source series were never removed: with `max_sources 64`, two addresses
/// churning never-confirmed topics left 6,400 `source="…"` series for 64 live sources, and
/// normal pod churn grows them too. A reclaimed stream, and an unregistered pod's, take their
/// series with them.
#[test]
fn per_source_series_go_with_their_source() {
    let Some(py) = python() else { return };
    let server = central(&["--max-sources", "4"]);
    let zmq = server.zmq();
    let mut peer = flooder(&py, &server);
    // Five waves of four never-confirmed topics (past seq 0, no replay): each wave reclaims
    // the one before once it has been silent for a second.
    for wave in 0..5u64 {
        wait_until("the made-up streams silent for a second", 20, || {
            quiet_for_a_second(&server, "made-up-").then_some(())
        });
        peer.cmd(json!({"op": "topics_flood", "name": "flood", "prefix": "made-up-", "first": wave * 4, "n": 4, "model": MODEL, "seq": 5}));
        let last = format!("made-up-{}", wave * 4 + 3);
        wait_until("the wave's streams listed", 20, || server.source(&last).map(|_| ()));
    }
    assert!(server.metric("kvindex_sources_reclaimed_total", &["reason=\"unconfirmed\""]) >= 16.0);
    let series = series_of(&server, "made-up-");
    // Five series per live source (four event types and gaps), for the four live ones only.
    assert_eq!(series.len(), 4 * 5, "{series:#?}");
    assert!(series.iter().all(|l| (16..20).any(|i| l.contains(&format!("\"made-up-{i}\"")))), "{series:#?}");

    // A registered pod's series go when it is unregistered.
    let register = json!({"pod": "pod-r", "model": MODEL}).to_string();
    assert_eq!(server.http("POST", "/pods", Some(&register)).0, 200);
    peer.cmd(json!({"op": "pub_start", "name": "r", "pod": "pod-r", "connect": from_address("127.0.0.3", &zmq), "topic": format!("kv@pod-r@{MODEL}")}));
    peer.cmd(json!({"op": "wait_sub", "names": ["r"]}));
    // The table is full: its first message takes the place of a made-up stream silent for a second.
    wait_until("the made-up streams silent for a second", 20, || quiet_for_a_second(&server, "made-up-").then_some(()));
    peer.cmd(json!({"op": "store", "name": "r", "chain": "c", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["r"], MODEL, "EXACT", 20);
    assert_eq!(series_of(&server, "pod-r").len(), 5, "{:#?}", series_of(&server, "pod-r"));
    assert_eq!(server.metric("kvindex_events_total", &["source=\"pod-r\"", "type=\"BlockStored\""]), 1.0);
    assert_eq!(server.http("DELETE", "/pods/pod-r", None).0, 200);
    wait_until("pod-r's series gone", 20, || series_of(&server, "pod-r").is_empty().then_some(()));
}
