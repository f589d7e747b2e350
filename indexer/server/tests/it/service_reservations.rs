//! The routers' shared in-flight load through real gRPC (`grpcio` clients, two of them from
//! different loopback addresses: two callers) and real ZeroMQ publishers (`pyzmq`): RecordRoute's
//! reservations show in every caller's ScoreTokens (`in_flight`), never in `matched_blocks`;
//! ReleaseRoute ends the prefill part and then the request; only the caller that reserved can
//! release; the TTL ends what nobody releases; the bounds refuse and count; a call without the
//! admin token changes nothing; bad batches get a clear status and a count.

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "m";
const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";

fn reservation(pod: &str, request_id: u64, prefill_blocks: u32) -> Value {
    json!({"pod": pod, "request_id": request_id, "prefill_blocks": prefill_blocks})
}

/// A reservation-only RecordRoute (no token ids: no credit asked).
fn reserve(peer: &mut Peer, reservations: &[Value]) -> Value {
    peer.try_cmd(json!({"op": "record_route", "reservations": reservations}))
}

fn release(peer: &mut Peer, releases: &[(u64, &str)]) -> Value {
    peer.try_cmd(json!({"op": "release_route", "releases": releases}))
}

/// Each pod's [requests, prefill blocks] in a ScoreTokens answer (`Null` when reservations are
/// off).
fn in_flight(peer: &mut Peer) -> Value {
    peer.score(MODEL, &chain(0, 2), &[])["in_flight"].clone()
}

/// A server in central mode with pods `a` (holding 2 blocks of `chain(0, ..)`) and `b`, both
/// EXACT, and a peer connected to its gRPC.
fn two_pods(extra: &[&str]) -> (Server, Peer) {
    let py = python().expect("the test venv");
    let server = Server::central(extra);
    let mut peer = Peer::with_grpc(&py, &server);
    for (name, pod) in [("a", A), ("b", B)] {
        peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(), "topic": format!("kv@{pod}@{MODEL}")}));
    }
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a", "b"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "c", "tokens": chain(0, 2)}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "other", "tokens": chain(9, 1)}));
    peer.wait_exact(&server, &["a", "b"], MODEL, "EXACT", 20);
    (server, peer)
}

#[test]
fn two_callers_see_each_others_reservations_until_they_release_them() {
    if python().is_none() {
        return;
    }
    let (server, mut first) = two_pods(&[]);
    let mut second = Peer::start(&python().unwrap());
    second.cmd(json!({"op": "grpc", "addr": server.grpc, "source": "127.0.0.2"}));
    assert_eq!(in_flight(&mut first), json!({}), "on, and nothing reserved yet");

    // The first caller reserves two requests on a (one with a credit, as a router's pick
    // sends it), the second one on a and one on b, reusing the first's request id.
    let r = first.cmd(json!({"op": "record_route", "pod": A, "model": MODEL, "tokens": chain(0, 6),
        "reservations": [reservation(A, 1, 4)]}));
    assert_eq!(
        (&r["credited_blocks"], &r["reserved"], &r["reservation_ttl_ms"]),
        (&json!(4), &json!(1), &json!(30000))
    );
    assert_eq!(reserve(&mut first, &[reservation(A, 2, 10)])["reserved"], 1);
    assert_eq!(reserve(&mut second, &[reservation(A, 1, 100), reservation(B, 7, 3)])["reserved"], 2);
    let expected = json!({A: [3, 114], B: [1, 3]});
    assert_eq!(in_flight(&mut first), expected);
    assert_eq!(in_flight(&mut second), expected, "every caller sees all of them");
    // Load is not cache: a's matched blocks are what its engine announced, b matches nothing.
    assert_eq!(first.score_pod(MODEL, &chain(0, 6), A).0, 2);
    assert_eq!(first.score_pod(MODEL, &chain(0, 6), B).0, 0);
    // Filtered, only the filter's pods.
    assert_eq!(first.score(MODEL, &chain(0, 2), &[B])["in_flight"], json!({B: [1, 3]}));

    // A repeated reservation counts once.
    assert_eq!(reserve(&mut first, &[reservation(A, 2, 10)])["reserved"], 1);
    assert_eq!(in_flight(&mut first)[A], json!([3, 114]));

    // The first response byte of the first caller's request 1 ends its prefill part, its end
    // the request; the second caller's request 1 is untouched.
    assert_eq!(release(&mut first, &[(1, "prefill")])["released"], 1);
    assert_eq!(in_flight(&mut second)[A], json!([3, 110]));
    assert_eq!(release(&mut first, &[(1, "request"), (2, "request")])["released"], 2);
    assert_eq!(in_flight(&mut second), json!({A: [1, 100], B: [1, 3]}));
    // A caller releases only its own: the first cannot end the second's request 7.
    assert_eq!(release(&mut first, &[(7, "request")])["released"], 0);
    assert_eq!(in_flight(&mut first)[B], json!([1, 3]));
    assert_eq!(release(&mut second, &[(1, "request"), (7, "request")])["released"], 2);
    assert_eq!(in_flight(&mut first), json!({}));

    // A release that overtook its reservation (a response that failed at once) still ends it.
    assert_eq!(release(&mut first, &[(9, "request")])["released"], 0);
    assert_eq!(reserve(&mut first, &[reservation(A, 9, 50)])["reserved"], 1);
    assert_eq!(in_flight(&mut first), json!({}));

    assert_eq!(server.metric("kvindex_reservations_total", &["result=\"reserved\""]), 4.0);
    assert_eq!(server.metric("kvindex_reservations_total", &["result=\"renewed\""]), 1.0);
    assert_eq!(server.metric("kvindex_reservations_total", &["result=\"released_early\""]), 1.0);
    assert_eq!(server.metric("kvindex_reservation_releases_total", &["part=\"request\"", "result=\"ended\""]), 4.0);
    assert_eq!(server.metric("kvindex_reservation_releases_total", &["part=\"prefill\"", "result=\"ended\""]), 1.0);
    assert_eq!(server.metric("kvindex_reservation_releases_total", &["result=\"not_held\""]), 2.0);
    assert_eq!(server.metric("kvindex_reservations", &[]), 0.0);
    assert_eq!(server.metric("kvindex_release_route_requests_total", &["outcome=\"ok\""]), 5.0);
}

#[test]
fn reservations_nobody_releases_end_at_their_ttl() {
    if python().is_none() {
        return;
    }
    let (server, mut peer) = two_pods(&["--reservation-ttl-ms", "300", "--reservation-max-ttl-ms", "60000"]);
    let r = reserve(&mut peer, &[reservation(A, 1, 8)]);
    assert_eq!((&r["reserved"], &r["reservation_ttl_ms"]), (&json!(1), &json!(300)));
    let long = json!({"pod": B, "request_id": 2, "prefill_blocks": 8, "ttl_ms": 600_000});
    assert_eq!(reserve(&mut peer, &[long])["reservation_ttl_ms"], 60000, "capped at the maximum");
    wait_until("the 300 ms reservation to expire", 20, || (in_flight(&mut peer) == json!({B: [1, 8]})).then_some(()));
    assert_eq!(server.metric("kvindex_reservations_expired_total", &[]), 1.0);
}

#[test]
fn bounds_refuse_reservations_and_count_them() {
    if python().is_none() {
        return;
    }
    let (server, mut peer) = two_pods(&[
        "--reservation-max-entries",
        "5",
        "--reservation-max-entries-per-pod",
        "3",
        "--reservation-max-entries-per-caller",
        "4",
    ]);
    let mut other = Peer::start(&python().unwrap());
    other.cmd(json!({"op": "grpc", "addr": server.grpc, "source": "127.0.0.2"}));
    let batch: Vec<Value> = (1..=4).map(|id| reservation(A, id, 1)).collect();
    assert_eq!(reserve(&mut peer, &batch)["reserved"], 3, "a's share");
    assert_eq!(reserve(&mut peer, &[reservation(B, 5, 1), reservation(B, 6, 1)])["reserved"], 1, "the caller's share");
    assert_eq!(reserve(&mut other, &[reservation(B, 1, 1), reservation(B, 2, 1)])["reserved"], 1, "the table's");
    assert_eq!(reserve(&mut peer, &[reservation("nope:1", 9, 1)])["reserved"], 0, "neither a source nor registered");
    assert_eq!(in_flight(&mut peer), json!({A: [3, 3], B: [2, 2]}));
    for (bound, n) in [("pod", 1.0), ("caller", 1.0), ("table", 1.0)] {
        let labels = ["result=\"refused\"".to_string(), format!("bound=\"{bound}\"")];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        assert_eq!(server.metric("kvindex_reservations_total", &labels), n, "{bound}");
    }
    assert_eq!(server.metric("kvindex_reservations_total", &["result=\"unknown_pod\""]), 1.0);
    // Released, the room is there again; a pod registered that has not published yet is a
    // pod of this indexer too.
    assert_eq!(release(&mut peer, &[(1, "request")])["released"], 1);
    peer.cmd(json!({"op": "register", "pod": "10.0.0.9:8000", "model": MODEL}));
    assert_eq!(reserve(&mut other, &[reservation("10.0.0.9:8000", 2, 1)])["reserved"], 1);
    assert_eq!(in_flight(&mut peer)["10.0.0.9:8000"], json!([1, 1]));
}

#[test]
fn without_the_admin_token_nothing_is_reserved_or_released() {
    if python().is_none() {
        return;
    }
    let (server, mut peer) = two_pods(&[]);
    assert_eq!(reserve(&mut peer, &[reservation(A, 1, 5)])["reserved"], 1);
    for token in ["", "not-the-admin-token-at-all"] {
        let r = peer.try_cmd(json!({"op": "record_route", "token": token, "reservations": [reservation(B, 2, 5)]}));
        assert_eq!(r["code"], "UNAUTHENTICATED", "{r}");
        let r = peer.try_cmd(json!({"op": "release_route", "token": token, "releases": [[1, "request"]]}));
        assert_eq!(r["code"], "UNAUTHENTICATED", "{r}");
    }
    assert_eq!(in_flight(&mut peer), json!({A: [1, 5]}), "unchanged");
    assert_eq!(server.metric("kvindex_release_route_requests_total", &["outcome=\"missing_token\""]), 1.0);
    assert_eq!(server.metric("kvindex_release_route_requests_total", &["outcome=\"wrong_token\""]), 1.0);
    assert_eq!(server.metric("kvindex_record_route_requests_total", &["outcome=\"missing_token\""]), 1.0);

    // A server without an admin token refuses both.
    let open = kvindex_serve()
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .start()
        .expect("kvindex serve");
    let mut peer = Peer::start(&python().unwrap());
    peer.cmd(json!({"op": "grpc", "addr": open.grpc}));
    let r = peer.try_cmd(json!({"op": "release_route", "releases": [[1, "request"]]}));
    assert_eq!(r["code"], "PERMISSION_DENIED", "{r}");
    assert!(r["details"].as_str().unwrap().contains("ReleaseRoute is disabled"), "{r}");
}

#[test]
fn bad_batches_are_refused_whole_with_a_status_and_a_count() {
    if python().is_none() {
        return;
    }
    let (server, mut peer) = two_pods(&["--max-tokens", "1000"]);
    let cases = [
        (
            json!({"op": "record_route", "reservations": (0..17).map(|i| reservation(A, i, 1)).collect::<Vec<_>>()}),
            "more than 16",
        ),
        (
            json!({"op": "record_route", "reservations": [reservation(A, 1, 63), reservation(A, 2, 1)]}),
            "prefill_blocks is 63",
        ),
        (json!({"op": "record_route", "reservations": [reservation("", 1, 1)]}), "non-empty"),
        (json!({"op": "release_route", "releases": [[1, "request"], [2, 0]]}), "RELEASE_PREFILL or RELEASE_REQUEST"),
    ];
    for (cmd, says) in &cases {
        let r = peer.try_cmd(cmd.clone());
        assert_eq!(r["code"], "INVALID_ARGUMENT", "{cmd}: {r}");
        assert!(r["details"].as_str().unwrap().contains(says), "{cmd}: {r}");
    }
    assert_eq!(in_flight(&mut peer), json!({}), "nothing was reserved by any of them");
    assert_eq!(server.metric("kvindex_record_route_requests_total", &["outcome=\"invalid\""]), 3.0);
    assert_eq!(server.metric("kvindex_release_route_requests_total", &["outcome=\"invalid\""]), 1.0);
    // 62 blocks is the largest prompt's (1000 tokens / 16).
    assert_eq!(reserve(&mut peer, &[reservation(A, 1, 62)])["reserved"], 1);
}

#[test]
fn with_reservations_off_score_tokens_answers_no_load_and_the_credit_still_works() {
    if python().is_none() {
        return;
    }
    let (server, mut peer) = two_pods(&["--reservation-max-entries", "0"]);
    assert_eq!(in_flight(&mut peer), Value::Null, "unset: routers keep their own counts");
    let r = peer.cmd(json!({"op": "record_route", "pod": A, "model": MODEL, "tokens": chain(0, 6),
        "reservations": [reservation(A, 1, 4)]}));
    assert_eq!((&r["credited_blocks"], &r["reserved"]), (&json!(4), &json!(0)));
    assert_eq!(server.metric("kvindex_reservations_total", &["result=\"disabled\""]), 1.0);
    // A credit the pod cannot take does not fail a call that carries reservations.
    let r = peer.cmd(json!({"op": "record_route", "pod": "nope:1", "model": MODEL, "tokens": chain(0, 6),
        "reservations": [reservation(A, 2, 4)]}));
    assert_eq!((&r["credited_blocks"], &r["reserved"]), (&json!(0), &json!(0)));
    assert_eq!(server.metric("kvindex_record_route_requests_total", &["outcome=\"unknown_pod\""]), 1.0);
}
