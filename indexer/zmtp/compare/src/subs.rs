//! The three subscribers under comparison, each run alone in a child process so its CPU time
//! and memory are its own: ours (`kvindex-zmtp`), libzmq's SUB through the `zmq` crate
//! (configured with the same bounds where libzmq has an option for them) and the `zeromq`
//! crate's SUB.
//!
//! `fanin` mode counts messages and latencies and prints one summary; `faults` mode prints
//! every message and every connection event it can see as a JSON line, for the fault
//! scenarios to read.

use std::io::Write;
use std::time::Duration;

use kvindex_zmtp::{Event, Limits, SubListener};
use serde_json::json;

use crate::stats::{cpu_time, Tally};

/// Bounds shared by the candidates (libzmq gets the ones it has an option for).
pub struct Bounds {
    pub max_message: usize,
    pub heartbeat: Duration,
    pub idle: Duration,
    pub handshake: Duration,
}

impl Bounds {
    pub fn fault_tests() -> Bounds {
        Bounds {
            max_message: 16 << 20,
            heartbeat: Duration::from_secs(1),
            idle: Duration::from_secs(3),
            handshake: Duration::from_secs(3),
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            max_frame_size: self.max_message,
            max_message_size: self.max_message,
            heartbeat_interval: self.heartbeat,
            idle_timeout: self.idle,
            handshake_timeout: self.handshake,
            ..Limits::default()
        }
    }
}

pub struct Run {
    pub publishers: usize,
    pub expected_each: u64,
    pub faults: bool,
    pub bounds: Bounds,
}

fn emit(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}").unwrap();
    out.flush().unwrap();
}

/// `kv@007` → 7.
fn publisher_index(topic: &[u8]) -> usize {
    std::str::from_utf8(topic.get(3..).unwrap_or_default()).ok().and_then(|s| s.parse().ok()).unwrap_or(usize::MAX)
}

fn sent_ns(payload: &[u8]) -> u64 {
    payload.get(..8).map_or(0, |b| u64::from_be_bytes(b.try_into().unwrap()))
}

fn seq(frame: &[u8]) -> u64 {
    frame.get(..8).map_or(u64::MAX, |b| u64::from_be_bytes(b.try_into().unwrap()))
}

/// How long a fan-in run waits for more after its last message (or for the first one).
const QUIET: Duration = Duration::from_secs(3);
const FIRST: Duration = Duration::from_secs(60);

/// Ours on a 2-worker multi-thread runtime (as the server runs it) or, with `one_thread`, on a
/// current-thread runtime (as the `zeromq` crate's candidate runs).
pub fn own(run: Run, one_thread: bool) {
    let rt = if one_thread {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    };
    // The consumer is a task on the runtime, as in the server (a `block_on` consumer would be
    // woken across threads for every message).
    let consumer = async move {
        let mut sub = SubListener::bind("tcp://127.0.0.1:0", &[b"kv@"], run.bounds.limits()).await.unwrap();
        emit(json!({"ready": sub.endpoint()}));
        let cpu0 = cpu_time();
        let mut tally = Tally::new(run.publishers);
        let expected = run.expected_each * run.publishers as u64;
        loop {
            let wait = if tally.first.is_some() { QUIET } else { FIRST };
            let wait = if run.faults { Duration::from_secs(3600) } else { wait };
            let Ok(Some(event)) = tokio::time::timeout(wait, sub.recv()).await else { break };
            match event {
                Event::Message(m) if m.frames.len() == 3 => {
                    if run.faults {
                        emit(json!({"msg": String::from_utf8_lossy(&m.frames[0]), "seq": seq(&m.frames[1]),
                            "conn": m.conn.0, "peer": m.peer.to_string()}));
                        continue;
                    }
                    tally.record(publisher_index(&m.frames[0]), sent_ns(&m.frames[2]));
                    if tally.received() == expected {
                        break;
                    }
                }
                Event::Message(_) => {}
                Event::Connected { conn, peer, .. } if run.faults => {
                    emit(json!({"ev": "connected", "conn": conn.0, "peer": peer.to_string()}))
                }
                Event::Disconnected { conn, reason, .. } if run.faults => {
                    emit(json!({"ev": "disconnected", "conn": conn.0, "reason": reason.label()}))
                }
                Event::Rejected { reason, .. } if run.faults => {
                    emit(json!({"ev": "rejected", "reason": reason.label()}))
                }
                _ => {}
            }
        }
        emit(json!({"summary": tally.summary(run.expected_each, cpu_time() - cpu0)}));
    };
    rt.block_on(async { tokio::spawn(consumer).await.unwrap() });
}

fn libzmq_socket(ctx: &zmq::Context, bounds: &Bounds) -> zmq::Socket {
    let sock = ctx.socket(zmq::SUB).unwrap();
    sock.set_rcvhwm(100_000).unwrap();
    sock.set_maxmsgsize(bounds.max_message as i64).unwrap();
    sock.set_heartbeat_ivl(bounds.heartbeat.as_millis() as i32).unwrap();
    sock.set_heartbeat_timeout(bounds.idle.as_millis() as i32).unwrap();
    sock.set_handshake_ivl(bounds.handshake.as_millis() as i32).unwrap();
    sock.set_subscribe(b"kv@").unwrap();
    sock
}

/// libzmq's monitor events, printed as they come (faults mode).
fn libzmq_monitor(ctx: &zmq::Context, sock: &zmq::Socket) {
    sock.monitor("inproc://monitor", zmq::SocketEvent::ALL as i32).unwrap();
    let mon = ctx.socket(zmq::PAIR).unwrap();
    mon.connect("inproc://monitor").unwrap();
    std::thread::spawn(move || loop {
        let Ok(frames) = mon.recv_multipart(0) else { return };
        let event = u16::from_le_bytes([frames[0][0], frames[0][1]]);
        let name = match zmq::SocketEvent::from_raw(event) {
            zmq::SocketEvent::ACCEPTED => "accepted",
            zmq::SocketEvent::DISCONNECTED => "disconnected",
            zmq::SocketEvent::CLOSED => "closed",
            zmq::SocketEvent::HANDSHAKE_SUCCEEDED => "handshake_succeeded",
            zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL => "handshake_failed_protocol",
            zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL => "handshake_failed",
            zmq::SocketEvent::ACCEPT_FAILED => "accept_failed",
            _ => "other",
        };
        emit(json!({"ev": name}));
    });
}

pub fn libzmq(run: Run) {
    let ctx = zmq::Context::new();
    let sock = libzmq_socket(&ctx, &run.bounds);
    if run.faults {
        libzmq_monitor(&ctx, &sock);
    }
    sock.bind("tcp://127.0.0.1:*").unwrap();
    let endpoint = sock.get_last_endpoint().unwrap().unwrap();
    emit(json!({"ready": endpoint}));
    let cpu0 = cpu_time();
    let mut tally = Tally::new(run.publishers);
    let expected = run.expected_each * run.publishers as u64;
    let mut frames: Vec<zmq::Message> = Vec::with_capacity(4);
    loop {
        let wait = if run.faults { -1 } else { (if tally.first.is_some() { QUIET } else { FIRST }).as_millis() as i32 };
        sock.set_rcvtimeo(wait).unwrap();
        frames.clear();
        let mut peer = None;
        loop {
            let mut msg = zmq::Message::new();
            if sock.recv(&mut msg, 0).is_err() {
                emit(json!({"summary": tally.summary(run.expected_each, cpu_time() - cpu0)}));
                return;
            }
            if frames.is_empty() {
                // What the server would need to bind a topic to its source (the IP only).
                peer = msg.gets("Peer-Address").map(str::to_string);
            }
            let more = msg.get_more();
            frames.push(msg);
            if !more {
                break;
            }
        }
        if frames.len() != 3 {
            continue;
        }
        if run.faults {
            emit(
                json!({"msg": String::from_utf8_lossy(&frames[0]), "seq": seq(&frames[1]), "conn": null, "peer": peer}),
            );
            continue;
        }
        tally.record(publisher_index(&frames[0]), sent_ns(&frames[2]));
        if tally.received() == expected {
            break;
        }
    }
    emit(json!({"summary": tally.summary(run.expected_each, cpu_time() - cpu0)}));
}

pub fn zeromq_crate(run: Run) {
    use zeromq::{Socket, SocketRecv};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut sub = zeromq::SubSocket::new();
        sub.subscribe("kv@").await.unwrap();
        let endpoint = sub.bind("tcp://127.0.0.1:0").await.unwrap();
        emit(json!({"ready": endpoint.to_string()}));
        let cpu0 = cpu_time();
        let mut tally = Tally::new(run.publishers);
        let expected = run.expected_each * run.publishers as u64;
        loop {
            let wait = if run.faults {
                Duration::from_secs(3600)
            } else if tally.first.is_some() {
                QUIET
            } else {
                FIRST
            };
            let Ok(Ok(msg)) = tokio::time::timeout(wait, sub.recv()).await else { break };
            let frames = msg.into_vec();
            if frames.len() != 3 {
                continue;
            }
            if run.faults {
                emit(json!({"msg": String::from_utf8_lossy(&frames[0]), "seq": seq(&frames[1]), "conn": null, "peer": null}));
                continue;
            }
            tally.record(publisher_index(&frames[0]), sent_ns(&frames[2]));
            if tally.received() == expected {
                break;
            }
        }
        emit(json!({"summary": tally.summary(run.expected_each, cpu_time() - cpu0)}));
    });
}
