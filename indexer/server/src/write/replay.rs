//! Replay requests: ask an engine's replay ROUTER for every buffered batch from a seq, and hand
//! the replies to the stream's apply worker. At most `max_concurrent_replays` run at once; the
//! others wait for a slot (up to `replay_queue_timeout_ms`), so a burst of gaps is served in
//! turn rather than refused and cleared. A replay that began is bounded by the replay timeout
//! and by the ZeroMQ limits (a ROUTER declaring a huge frame is
//! refused on the header, counted, and the replay fails: the sequencer then drops or degrades
//! the pod, never guesses). The cooldown after a failure is the sequencer's. The DEALER is
//! [`crate::write::transport::Dealer`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::time::{timeout_at, Instant};

use kvindex::wire::{self, ReplayReply};

use crate::config::Config;
use crate::protocols::{ReplayItem, StreamKey, Work};
use crate::queue::Queues;
use crate::telemetry as m;
use crate::write::transport::{Dealer, Limits, TransportError, ZmtpError};

/// What a replay uses of the service: the slots, the workers' lanes its replies go to, and the
/// replay settings. Made once and shared by every replay.
pub struct Replays {
    /// Bounds replays in flight (`max_concurrent_replays`).
    permits: Semaphore,
    queues: Arc<Queues>,
    /// How long a replay may wait for a slot (`replay_queue_timeout_ms`).
    queue_timeout: Duration,
    /// How long a replay that began may take (`replay_timeout_ms`).
    timeout: Duration,
    /// The DEALER's bounds: a source's share of the byte budget (a reply holds its bytes until
    /// the worker takes it; replay output is served first, so the queue holds little of it).
    limits: Limits,
}

impl Replays {
    pub fn new(config: &Config, queues: Arc<Queues>) -> Replays {
        let mut limits = config.zmq_limits.clone();
        limits.max_bytes_in_flight = limits.max_bytes_in_flight_per_source;
        Replays {
            permits: Semaphore::new(config.max_concurrent_replays),
            queues,
            queue_timeout: Duration::from_millis(config.replay_queue_timeout_ms),
            timeout: Duration::from_millis(config.replay_timeout_ms),
            limits,
        }
    }
}

/// Runs replay `id` of `stream` from `from` against `endpoint`; always ends with an `End` or
/// a `Failed` item for the worker.
pub async fn run(replays: Arc<Replays>, worker: usize, stream: StreamKey, id: u64, from: u64, endpoint: String) {
    let queued_until = Instant::now() + replays.queue_timeout;
    let Ok(Ok(_permit)) = timeout_at(queued_until, replays.permits.acquire()).await else {
        TransportError::new("replay", "capacity", &endpoint, "no replay slot within replay_queue_timeout_ms").record();
        let item = ReplayItem::Failed { timeout: true };
        replays.queues.send(worker, Work::Replay { stream, id, item }).await;
        return;
    };
    // Begun: the sequencer's replay timeout counts from here, as does ours.
    replays.queues.send(worker, Work::Replay { stream: stream.clone(), id, item: ReplayItem::Begun }).await;
    let deadline = Instant::now() + replays.timeout;
    if let Err(failure) = fetch(&replays, worker, &stream, id, from, &endpoint, deadline).await {
        let item = ReplayItem::Failed { timeout: failure == Failure::Timeout };
        replays.queues.send(worker, Work::Replay { stream, id, item }).await;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// No end marker before the deadline.
    Timeout,
    /// The endpoint could not be used, or the peer broke the protocol or a bound.
    Unavailable,
}

fn failed(operation: &'static str, endpoint: &str, error: &ZmtpError) -> Failure {
    TransportError::from_zmtp(operation, endpoint, error).record();
    match error {
        ZmtpError::Deadline { .. } => Failure::Timeout,
        _ => Failure::Unavailable,
    }
}

async fn fetch(
    replays: &Replays,
    worker: usize,
    stream: &StreamKey,
    id: u64,
    from: u64,
    endpoint: &str,
    deadline: Instant,
) -> Result<(), Failure> {
    // A source's share of the budget bounds what one replay queues.
    let request = [Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())];
    let mut dealer = Dealer::request(endpoint, &request, &replays.limits, deadline)
        .await
        .map_err(|e| failed("replay", endpoint, &e))?;
    loop {
        let reply = dealer.recv().await.map_err(|e| failed("replay", endpoint, &e))?;
        let (frames, lease) = (reply.frames, reply.lease);
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
        let item = match wire::parse_replay(&refs) {
            Ok(ReplayReply::End { .. }) => ReplayItem::End,
            Ok(ReplayReply::Message(raw)) => {
                ReplayItem::Message { seq: raw.seq, payload: frames[frames.len() - 1].clone(), lease }
            }
            Err(e) => {
                metrics::counter!(m::DECODE_ERRORS, "reason" => e.reason()).increment(1);
                continue;
            }
        };
        let end = matches!(item, ReplayItem::End);
        replays.queues.send(worker, Work::Replay { stream: stream.clone(), id, item }).await;
        if end {
            return Ok(());
        }
    }
}
