//! The source table is a door too: a publisher that makes up topics cannot fill it and keep a
//! real engine out. Its streams are capped per address (`max_sources_per_address`), and when
//! the table is full a stream nobody configured that never became EXACT and went silent is
//! reclaimed for the newcomer (issue 23: one publisher filled the 4,096 slots for good, and a
//! real engine still scored 0 at 35 s).

mod support;

use serde_json::json;
use support::*;

const MODEL: &str = "m";

fn central(extra: &[&str]) -> Server {
    let mut args = vec!["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16", "--apply-workers", "1"];
    args.extend_from_slice(extra);
    Server::start(&args)
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
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    peer.cmd(json!({"op": "pub_start", "name": "flood", "pod": "x", "connect": from_address("127.0.0.2", &zmq), "topic": "kv@x@m"}));
    peer.cmd(json!({"op": "wait_sub", "names": ["flood"]}));
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
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    // Made-up topics that start past seq 0 with no replay: never EXACT.
    peer.cmd(json!({"op": "pub_start", "name": "flood", "pod": "x", "connect": from_address("127.0.0.2", &zmq), "topic": "kv@x@m"}));
    peer.cmd(json!({"op": "wait_sub", "names": ["flood"]}));
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
