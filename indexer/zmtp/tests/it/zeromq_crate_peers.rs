//! Interop with a second independent implementation: the `zeromq` crate, a ZMTP 3.0-only peer
//! (it announces 3.0, understands only `0x01 + prefix` subscription messages and drops a
//! connection on any command but READY). Its PUB binds or dials us; its ROUTER answers our
//! DEALER as vLLM's replay socket does.
//!
//! Each zeromq peer runs on its own current-thread runtime in its own thread (its fair queue
//! loses wake-ups on a multi-threaded one), apart from our sockets' runtime.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{quick_limits, runtime, Sub};
use bytes::Bytes;
use kvindex_zmtp::{Backoff, Dealer, Event, Limits, Reason, SubDialer, SubListener};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// Runs `f` on a fresh current-thread runtime in its own thread.
fn peer_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    std::thread::spawn(f)
}

fn peer_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A zeromq PUB that publishes `[kv@z, seq, payload]` every 20 ms (it drops messages until our
/// subscription arrives), pausing 600 ms after seq 10, until told to stop; returns how many it
/// sent.
fn publisher(
    bind: Option<String>,
    connect: Option<String>,
    bound: mpsc::Sender<String>,
    stop: mpsc::Receiver<()>,
) -> u64 {
    peer_runtime().block_on(async move {
        let mut pub_socket = zeromq::PubSocket::new();
        if let Some(ep) = bind {
            let ep = pub_socket.bind(&ep).await.unwrap();
            bound.send(ep.to_string()).unwrap();
        } else {
            pub_socket.connect(&connect.unwrap()).await.unwrap();
            bound.send(String::new()).unwrap();
        }
        let mut seq = 0u64;
        while stop.try_recv().is_err() {
            let mut msg = ZmqMessage::from(Bytes::from_static(b"kv@z"));
            msg.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
            msg.push_back(Bytes::from(vec![seq as u8; 64]));
            pub_socket.send(msg).await.unwrap();
            // An unsubscribed topic: the PUB filters it out for us.
            pub_socket.send(ZmqMessage::from(Bytes::from_static(b"other"))).await.unwrap();
            seq += 1;
            let pause = if seq == 11 { 600 } else { 20 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        seq
    })
}

/// Waits until seq 13 arrived, every message in order on one connection: the 600 ms pause
/// is three heartbeat intervals of [`pausing_limits`], and a PING would make the 3.0 peer drop
/// us.
fn in_order_past_the_pause(sub: &mut Sub, rt: &tokio::runtime::Runtime) {
    let (info, _) = sub.wait_for(rt, 20, "Connected", |e| match e {
        Event::Connected { info, .. } => Some(info.clone()),
        _ => None,
    });
    assert_eq!((info.version, info.socket_type.as_str()), ((3, 0), "PUB"));
    let mut seqs = Vec::new();
    while seqs.last() < Some(&13) {
        match sub.next(rt, 20) {
            Event::Message(m) => {
                assert_eq!(m.frames[0], Bytes::from_static(b"kv@z"), "only the subscribed topic arrives");
                seqs.push(u64::from_be_bytes(m.frames[1][..].try_into().unwrap()));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
}

/// `quick_limits` with an idle timeout well past the publisher's 600 ms pause: a silent 3.0
/// peer is closed at the idle timeout, and a loaded box may stretch the pause by a second.
fn pausing_limits() -> Limits {
    Limits { idle_timeout: Duration::from_secs(3), ..quick_limits() }
}

#[test]
fn a_zeromq_crate_publisher_bound_and_dialling() {
    let rt = runtime();
    // It binds; we dial (3.0 peer: the subscription goes as a message).
    let (bound_tx, bound_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel();
    let peer = peer_thread(move || publisher(Some("tcp://127.0.0.1:0".into()), None, bound_tx, stop_rx));
    let endpoint = bound_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let _guard = rt.enter();
    let mut sub = Sub::Dialer(SubDialer::connect(&endpoint, &[b"kv@"], pausing_limits(), Backoff::default()).unwrap());
    in_order_past_the_pause(&mut sub, &rt);
    stop_tx.send(()).unwrap();
    assert!(peer.join().unwrap() >= 14);

    // It dials our bound SUB.
    let listener = rt.block_on(SubListener::bind("tcp://127.0.0.1:0", &[b"kv@"], pausing_limits())).unwrap();
    let endpoint = listener.endpoint().to_string();
    let mut sub = Sub::Listener(listener);
    let (bound_tx, bound_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel();
    let peer = peer_thread(move || publisher(None, Some(endpoint), bound_tx, stop_rx));
    bound_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    in_order_past_the_pause(&mut sub, &rt);
    stop_tx.send(()).unwrap();
    peer.join().unwrap();
}

#[test]
fn a_zeromq_crate_router_answers_our_dealer() {
    let rt = runtime();
    let (bound_tx, bound_rx) = mpsc::channel();
    let router = peer_thread(move || {
        peer_runtime().block_on(async move {
            let mut router = zeromq::RouterSocket::new();
            let ep = router.bind("tcp://127.0.0.1:0").await.unwrap();
            bound_tx.send(ep.to_string()).unwrap();
            let request = router.recv().await.unwrap().into_vec();
            let (identity, start) = (request[0].clone(), u64::from_be_bytes(request[2][..].try_into().unwrap()));
            for seq in start..start + 3 {
                let frames = vec![
                    identity.clone(),
                    Bytes::new(),
                    Bytes::copy_from_slice(&seq.to_be_bytes()),
                    Bytes::from(format!("batch-{seq}")),
                ];
                router.send(ZmqMessage::try_from(frames).unwrap()).await.unwrap();
            }
            let end = vec![identity, Bytes::new(), Bytes::from_static(&[0xff; 8]), Bytes::new()];
            router.send(ZmqMessage::try_from(end).unwrap()).await.unwrap();
            request.len()
        })
    });
    let endpoint = bound_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let request = [Bytes::new(), Bytes::copy_from_slice(&7u64.to_be_bytes())];
    let started = Instant::now();
    let mut dealer = rt.block_on(Dealer::request(&endpoint, &request, &Limits::default(), deadline)).unwrap();
    assert_eq!(dealer.peer_info().version, (3, 0));
    let mut got = Vec::new();
    loop {
        let m = rt.block_on(dealer.recv()).unwrap();
        if m.frames[1][..] == [0xff; 8] {
            break;
        }
        got.push((u64::from_be_bytes(m.frames[1][..].try_into().unwrap()), m.frames[2].clone()));
    }
    assert_eq!(got, (7..10).map(|s| (s, Bytes::from(format!("batch-{s}")))).collect::<Vec<_>>());
    assert_eq!(router.join().unwrap(), 3, "the ROUTER saw [identity, b\"\", seq]");
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// A dialling peer: how its connect went, its stop signal and its thread.
type HeldPeer = (Result<(), String>, mpsc::Sender<()>, std::thread::JoinHandle<()>);

/// A zeromq PUB that dials `endpoint`, reports the outcome, then holds its connection until
/// told to stop.
fn dial(endpoint: String) -> HeldPeer {
    let (done_tx, done_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let peer = peer_thread(move || {
        peer_runtime().block_on(async move {
            let mut pub_socket = zeromq::PubSocket::new();
            done_tx.send(pub_socket.connect(&endpoint).await.map_err(|e| format!("{e:?}"))).unwrap();
            // Hold the socket (and its connection) until the test is done.
            tokio::task::spawn_blocking(move || stop_rx.recv()).await.unwrap().ok();
        })
    });
    let outcome = done_rx.recv_timeout(Duration::from_secs(20)).expect("connect returned");
    (outcome, stop_tx, peer)
}

/// A zeromq PUB dialling a listener whose per-source cap is spent is refused before the
/// greeting, and the crate reports that only as `connect: Other("Failed Greeting exchange")` or a
/// reset (what the e2e bench saw with 64 publishers on loopback against the default cap of 32):
/// the refusal is ours and counted as `SourceFull`, and a publisher within the cap connects.
#[test]
fn a_zeromq_crate_publisher_past_the_per_source_cap_is_refused_before_the_greeting() {
    let rt = runtime();
    let limits = Limits { max_connections_per_source: 2, ..quick_limits() };
    let listener = rt.block_on(SubListener::bind("tcp://127.0.0.1:0", &[b"kv@"], limits)).unwrap();
    let endpoint = listener.endpoint().to_string();
    let mut sub = Sub::Listener(listener);
    let mut peers = Vec::new();
    for _ in 0..2 {
        let (outcome, stop, peer) = dial(endpoint.clone());
        assert_eq!(outcome, Ok(()));
        sub.wait_for(&rt, 20, "Connected", |e| matches!(e, Event::Connected { .. }).then_some(()));
        peers.push((stop, peer));
    }
    let (outcome, stop, peer) = dial(endpoint.clone());
    // EOF before its greeting was read, or a reset if its greeting landed after our close.
    let refused = outcome.expect_err("the third connection from one source is refused");
    assert!(refused.contains("Failed Greeting exchange") || refused.contains("ConnectionReset"), "{refused}");
    sub.wait_for(&rt, 20, "SourceFull", |e| {
        matches!(e, Event::Rejected { reason: Reason::SourceFull { limit: 2 }, .. }).then_some(())
    });
    peers.push((stop, peer));
    for (stop, peer) in peers {
        stop.send(()).unwrap();
        peer.join().unwrap();
    }
}

/// One SUB bound to two ports (every DP rank's port, `zmq_bind_dp_size`): publishers connect on
/// either, and the per-source cap counts them together, so a second port admits no more.
#[test]
fn a_sub_bound_to_two_ports_accepts_on_both_under_one_per_source_cap() {
    let rt = runtime();
    let limits = Limits { max_connections_per_source: 2, ..quick_limits() };
    let endpoints = ["tcp://127.0.0.1:0", "tcp://127.0.0.1:0"];
    let listener = rt.block_on(SubListener::bind_all_admitting(&endpoints, &[b"kv@"], limits, None)).unwrap();
    let bound = listener.endpoints().to_vec();
    assert_eq!((bound.len(), listener.endpoint()), (2, bound[0].as_str()));
    assert_ne!(bound[0], bound[1]);
    let mut sub = Sub::Listener(listener);
    let mut peers = Vec::new();
    for endpoint in &bound {
        let (outcome, stop, peer) = dial(endpoint.clone());
        assert_eq!(outcome, Ok(()), "{endpoint}");
        sub.wait_for(&rt, 20, "Connected", |e| matches!(e, Event::Connected { .. }).then_some(()));
        peers.push((stop, peer));
    }
    let (outcome, stop, peer) = dial(bound[1].clone());
    assert!(outcome.is_err(), "the third connection from one source is refused, whichever port");
    sub.wait_for(&rt, 20, "SourceFull", |e| {
        matches!(e, Event::Rejected { reason: Reason::SourceFull { limit: 2 }, .. }).then_some(())
    });
    peers.push((stop, peer));
    for (stop, peer) in peers {
        stop.send(()).unwrap();
        peer.join().unwrap();
    }
}
