//! The replay client: a DEALER that asks an engine's ROUTER for every buffered batch from a
//! seq, and hands the replies to the stream's worker. Bounded by a timeout and by a limit on
//! concurrent replays; the cooldown after a failure is the sequencer's. Runs on
//! `Shared::zmq_runtime` (the `zeromq` crate's fair queue loses wake-ups on a multi-threaded
//! runtime); a panic inside the crate (`todo!()` on unexpected peer input) is a failed replay.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{timeout_at, Instant};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use kvindex::wire::{self, ReplayReply};

use super::metrics as m;
use super::{ReplayItem, Shared, StreamKey, Work};

/// Runs replay `id` of `stream` from `from` against `endpoint`; always ends with an `End` or
/// a `Failed` item for the worker (a panic inside the zeromq crate counts as a failure).
pub async fn run(shared: Arc<Shared>, worker: usize, stream: StreamKey, id: u64, from: u64, endpoint: String) {
    let deadline = Instant::now() + Duration::from_millis(shared.config.replay_timeout_ms);
    let task = tokio::spawn(fetch(shared.clone(), worker, stream.clone(), id, from, endpoint.clone(), deadline));
    let failure = match task.await {
        Ok(Ok(())) => return,
        Ok(Err(timeout)) => timeout,
        Err(e) => {
            metrics::counter!(m::ZMQ_ERRORS, "operation" => "replay-recv").increment(1);
            tracing::error!(endpoint, error = %e, "replay task failed");
            false
        }
    };
    shared.send_work(worker, Work::Replay { stream, id, item: ReplayItem::Failed { timeout: failure } }).await;
}

fn zmq_error(op: &'static str, endpoint: &str, error: &dyn std::fmt::Display) {
    metrics::counter!(m::ZMQ_ERRORS, "operation" => op).increment(1);
    tracing::warn!(operation = op, endpoint, error = %error, "replay error");
}

/// `Err(true)`: timed out while receiving; `Err(false)`: unavailable.
async fn fetch(
    shared: Arc<Shared>,
    worker: usize,
    stream: StreamKey,
    id: u64,
    from: u64,
    endpoint: String,
    deadline: Instant,
) -> Result<(), bool> {
    let Ok(Ok(_permit)) = timeout_at(deadline, shared.replay_permits.clone().acquire_owned()).await else {
        zmq_error("replay-capacity", &endpoint, &"too many concurrent replays");
        return Err(false);
    };
    let mut sock = DealerSocket::new();
    match timeout_at(deadline, sock.connect(&endpoint)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            zmq_error("replay-connect", &endpoint, &e);
            return Err(false);
        }
        Err(_) => {
            zmq_error("replay-connect", &endpoint, &"connect timed out");
            return Err(false);
        }
    }
    let request: ZmqMessage = vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())]
        .try_into()
        .expect("two frames");
    match timeout_at(deadline, sock.send(request)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            zmq_error("replay-send", &endpoint, &e);
            return Err(false);
        }
        Err(_) => {
            zmq_error("replay-send", &endpoint, &"send timed out");
            return Err(false);
        }
    }
    loop {
        let msg = match timeout_at(deadline, sock.recv()).await {
            Ok(Ok(msg)) => msg,
            Ok(Err(e)) => {
                zmq_error("replay-recv", &endpoint, &e);
                return Err(false);
            }
            Err(_) => {
                zmq_error("replay-incomplete", &endpoint, &"no end marker before the replay timeout");
                return Err(true);
            }
        };
        let frames = msg.into_vec();
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
        let item = match wire::parse_replay(&refs) {
            Ok(ReplayReply::End { .. }) => ReplayItem::End,
            Ok(ReplayReply::Message(raw)) => {
                ReplayItem::Message { seq: raw.seq, payload: frames[frames.len() - 1].clone() }
            }
            Err(e) => {
                metrics::counter!(m::DECODE_ERRORS, "reason" => e.reason()).increment(1);
                continue;
            }
        };
        let end = matches!(item, ReplayItem::End);
        shared.send_work(worker, Work::Replay { stream: stream.clone(), id, item }).await;
        if end {
            return Ok(());
        }
    }
}
