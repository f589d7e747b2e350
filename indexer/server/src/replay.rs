//! Replay requests: ask an engine's replay ROUTER for every buffered batch from a seq, and hand
//! the replies to the stream's apply worker. Bounded by the replay timeout and by
//! `max_concurrent_replays`; the cooldown after a failure is the sequencer's. The DEALER
//! itself is [`crate::transport::ReplayClient`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{timeout_at, Instant};

use kvindex::wire::{self, ReplayReply};

use crate::apply::{ReplayItem, StreamKey, Work};
use crate::sources::transport_error;
use crate::state::ServiceState;
use crate::telemetry as m;
use crate::transport::TransportError;

/// Runs replay `id` of `stream` from `from` against `endpoint`; always ends with an `End` or
/// a `Failed` item for the worker.
pub async fn run(state: Arc<ServiceState>, worker: usize, stream: StreamKey, id: u64, from: u64, endpoint: String) {
    let deadline = Instant::now() + Duration::from_millis(state.config().replay_timeout_ms);
    if let Err(failure) = fetch(&state, worker, &stream, id, from, &endpoint, deadline).await {
        let item = ReplayItem::Failed { timeout: failure == Failure::Timeout };
        state.queues().send(worker, Work::Replay { stream, id, item }).await;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// No end marker before the deadline.
    Timeout,
    /// No capacity, or the endpoint could not be used.
    Unavailable,
}

async fn fetch(
    state: &ServiceState,
    worker: usize,
    stream: &StreamKey,
    id: u64,
    from: u64,
    endpoint: &str,
    deadline: Instant,
) -> Result<(), Failure> {
    let unavailable = |operation, message: &str| {
        transport_error(&TransportError::new(operation, endpoint, message));
        Failure::Unavailable
    };
    let Ok(Ok(_permit)) = timeout_at(deadline, state.replay_permits().acquire_owned()).await else {
        return Err(unavailable("replay-capacity", "too many concurrent replays"));
    };
    let mut replies = state.replay_client().request(endpoint, from, deadline);
    loop {
        let reply = match timeout_at(deadline, replies.next()).await {
            Ok(reply) => reply,
            // A transport error due at the same deadline (connect, send) says more than the timeout.
            Err(_) => match replies.try_next() {
                Some(Err(e)) => Some(Err(e)),
                _ => {
                    transport_error(&TransportError::new(
                        "replay-incomplete",
                        endpoint,
                        "no end marker before the replay timeout",
                    ));
                    return Err(Failure::Timeout);
                }
            },
        };
        let frames = match reply {
            Some(Ok(frames)) => frames,
            Some(Err(e)) => {
                transport_error(&e);
                return Err(Failure::Unavailable);
            }
            None => return Err(unavailable("replay-recv", "the replay task ended without a reply")),
        };
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
        state.queues().send(worker, Work::Replay { stream: stream.clone(), id, item }).await;
        if end {
            return Ok(());
        }
    }
}
