//! The publishers: libzmq PUB sockets (as vLLM's are, pyzmq being libzmq), the same for every
//! subscriber under test, in a child process of their own. XPUB (wire-identical to PUB for the
//! subscriber) only so that sending starts once every subscription has arrived.
//!
//! Each message is vLLM's shape `[topic, seq_be8, payload]`; the payload starts with the send
//! time (UNIX ns) for the latency figures. Pacing is per round (one message per publisher),
//! so the aggregate rate holds without a sleep per message.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::stats::unix_ns;

pub struct Load {
    pub endpoint: String,
    pub publishers: usize,
    pub messages_each: u64,
    /// Aggregate messages per second; 0 = as fast as possible.
    pub rate: u64,
    pub payload: usize,
}

/// XPUB sockets connected to `endpoint`, returned once each has its subscription. With
/// `distinct_sources`, publisher i dials from 127.0.0.(10+i), as engines on their own pods do
/// (libzmq's `tcp://source;destination` form).
pub fn connect(ctx: &zmq::Context, endpoint: &str, n: usize, distinct_sources: bool) -> Vec<zmq::Socket> {
    let socks: Vec<zmq::Socket> = (0..n)
        .map(|i| {
            let s = ctx.socket(zmq::XPUB).unwrap();
            s.set_xpub_verbose(true).unwrap();
            s.set_sndhwm(100_000).unwrap(); // vLLM's default hwm
            s.set_linger(3000).unwrap();
            if distinct_sources {
                let dest = endpoint.trim_start_matches("tcp://");
                s.connect(&format!("tcp://127.0.0.{}:0;{dest}", 10 + i)).unwrap();
            } else {
                s.connect(endpoint).unwrap();
            }
            s
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    for s in &socks {
        s.set_rcvtimeo(deadline.saturating_duration_since(Instant::now()).as_millis().max(1) as i32).unwrap();
        s.recv_bytes(0).expect("a subscription within 60 s");
    }
    socks
}

pub fn topic(i: usize) -> Vec<u8> {
    format!("kv@{i:03}").into_bytes()
}

pub fn send(sock: &zmq::Socket, topic: &[u8], seq: u64, payload: &mut [u8]) {
    payload[..8].copy_from_slice(&unix_ns().to_be_bytes());
    sock.send(topic, zmq::SNDMORE).unwrap();
    sock.send(&seq.to_be_bytes()[..], zmq::SNDMORE).unwrap();
    sock.send(&payload[..], 0).unwrap();
}

pub fn run(load: Load) {
    let ctx = zmq::Context::new();
    let socks = connect(&ctx, &load.endpoint, load.publishers, true);
    let topics: Vec<Vec<u8>> = (0..load.publishers).map(topic).collect();
    let mut payload = vec![0x5au8; load.payload.max(8)];
    println!("{}", json!({"subscribed": load.publishers}));
    std::io::stdout().flush().unwrap();
    let start = Instant::now();
    for round in 0..load.messages_each {
        if load.rate > 0 {
            let due = start + Duration::from_secs_f64((round * load.publishers as u64) as f64 / load.rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        for (sock, topic) in socks.iter().zip(&topics) {
            send(sock, topic, round, &mut payload);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!("{}", json!({"sent": load.messages_each * load.publishers as u64, "elapsed_s": elapsed}));
    std::io::stdout().flush().unwrap();
    // Stay until killed: closing would race the last messages out of the queues.
    std::thread::sleep(Duration::from_secs(3600));
}
