//! A ZeroMQ PUB for the overload phase that queues like vLLM's: libzmq's PUB keeps up to
//! `SNDHWM` messages per subscriber (vLLM sets 100,000) and drops only past that, while the
//! `zeromq` crate's PUB drops once its ~128 KiB write buffer is full. Under overload that
//! difference decides where the backlog waits (in the engine, as in production, or nowhere),
//! so this phase publishes through this minimal ZMTP 3.0 PUB instead: a bound TCP listener, the
//! NULL handshake, and per subscriber an outbox of at most `hwm` message seqs written in order
//! as fast as TCP takes them. The messages themselves are built when written (from the seq),
//! so 64 pods × 100,000 queued messages cost 800 KB each, not gigabytes.
//!
//! It publishes every message to every subscriber (the SUB filters by topic again, and every
//! topic here matches the server's filter); what a subscriber sends after its greeting
//! (READY, subscriptions) is read and ignored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Builds message `seq`'s frames when it is written.
pub type Frames = Arc<dyn Fn(u64) -> Vec<Bytes> + Send + Sync>;

pub struct HwmPub {
    subscribers: Mutex<Vec<mpsc::Sender<u64>>>,
    /// Messages dropped because a subscriber's outbox held `hwm` already.
    pub dropped: AtomicU64,
}

impl HwmPub {
    /// Binds `127.0.0.1:0`; returns the publisher and its `tcp://` endpoint. Accepts for as
    /// long as the runtime runs.
    pub async fn bind(hwm: usize, frames: Frames) -> (Arc<HwmPub>, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the PUB");
        let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
        let publisher = Arc::new(HwmPub { subscribers: Mutex::new(Vec::new()), dropped: AtomicU64::new(0) });
        let accepting = publisher.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (tx, rx) = mpsc::channel(hwm);
                accepting.subscribers.lock().unwrap().push(tx);
                tokio::spawn(serve(stream, rx, frames.clone()));
            }
        });
        (publisher, endpoint)
    }

    /// Queues message `seq` for every subscriber; a full outbox drops it (as libzmq's PUB does
    /// at its high-water mark).
    pub fn publish(&self, seq: u64) {
        let mut subscribers = self.subscribers.lock().unwrap();
        subscribers.retain(|tx| match tx.try_send(seq) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }
}

/// The PUB's side of the handshake, then every queued message, in order.
async fn serve(stream: TcpStream, mut outbox: mpsc::Receiver<u64>, frames: Frames) {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let mut hello = greeting().to_vec();
    hello.extend(ready());
    if wr.write_all(&hello).await.is_err() {
        return;
    }
    // Whatever the subscriber sends (greeting, READY, subscriptions) is read and dropped, so
    // that it never blocks on us.
    tokio::spawn(async move {
        let mut sink = vec![0u8; 4096];
        while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    let mut seqs = Vec::with_capacity(256);
    let mut out = Vec::with_capacity(1 << 20);
    while outbox.recv_many(&mut seqs, 256).await > 0 {
        out.clear();
        for seq in seqs.drain(..) {
            let parts = frames(seq);
            for (i, part) in parts.iter().enumerate() {
                encode_frame(&mut out, i + 1 < parts.len(), part);
            }
        }
        if wr.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// ZMTP 3.0, NULL mechanism, not as-server.
fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// The READY command with `Socket-Type: PUB`.
fn ready() -> Vec<u8> {
    let mut body = vec![5u8];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&3u32.to_be_bytes());
    body.extend_from_slice(b"PUB");
    let mut frame = vec![0x04, body.len() as u8];
    frame.extend(body);
    frame
}

fn encode_frame(out: &mut Vec<u8>, more: bool, body: &[u8]) {
    let more = if more { 0x01 } else { 0 };
    if body.len() > 255 {
        out.push(more | 0x02);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(more);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}
