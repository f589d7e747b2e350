//! The bounded queues between the sockets and the apply workers: one lane per worker, sharded
//! by source so that a stream's messages stay in order.
//!
//! A live message waits for room in its lane instead of being dropped (read-side
//! backpressure): the task that read it stops reading that socket, TCP pushes back on the
//! publisher, and a publisher past its own high-water mark drops what it cannot send, which
//! shows here as a seq gap that is replayed from the publisher's buffer. What the server has
//! read, it applies. Waiters get room in the order they asked (a fair semaphore), so every
//! socket of a saturated worker keeps its share.
//!
//! Replay output has a bounded part of the lane of its own that the worker serves first: a
//! replay completes a gap, and behind a full live lane its batches would wait past the replay
//! timeout, which is how a burst of gaps used to become pod clears. Control work (a
//! connection's open and close, a registration's initial sync, a removal, a snapshot, stop)
//! queues behind the live messages before it, so it sees them applied, and takes no room: each
//! is bounded by what caused it (a connection, a registration, a snapshot). A lane whose worker
//! is gone refuses everything, so no sender waits for ever.

pub mod captures;

use std::collections::VecDeque;
use std::hash::Hasher;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::{Semaphore, TryAcquireError};

use crate::protocols::Work;
use crate::telemetry as m;

pub struct Queues {
    lanes: Vec<Arc<Lane>>,
    capacity: usize,
    depth: Arc<AtomicI64>,
    /// Held for a whole capture of the workers' streams (`queue::captures`): one at a time.
    pub(super) captures: tokio::sync::Mutex<()>,
}

/// One worker's lane.
struct Lane {
    inner: Mutex<Inner>,
    ready: Condvar,
    /// Room for live messages (`queue_capacity`).
    live_room: Semaphore,
    /// Room for replay output (`queue_capacity` too, apart).
    replay_room: Semaphore,
    /// The largest lag of the worker's sources at its last tick, µs (see `write::worker::lag`).
    lag_us: AtomicU64,
}

#[derive(Default)]
struct Inner {
    /// Live messages and control work, in order.
    live: VecDeque<Work>,
    /// Replay output, served first.
    replay: VecDeque<Work>,
    /// The worker is gone: nothing is queued any more.
    closed: bool,
}

/// Where a piece of work queues, and the room it holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Live,
    Replay,
    Control,
}

fn kind(work: &Work) -> Kind {
    match work {
        Work::Live { .. } => Kind::Live,
        Work::Replay { .. } => Kind::Replay,
        _ => Kind::Control,
    }
}

impl Lane {
    fn room(&self, kind: Kind) -> Option<&Semaphore> {
        match kind {
            Kind::Live => Some(&self.live_room),
            Kind::Replay => Some(&self.replay_room),
            Kind::Control => None,
        }
    }

    /// Queues `work` (its room, if it needs any, is already taken). False if the lane is closed.
    fn push(&self, work: Work, kind: Kind) -> bool {
        let mut inner = self.inner.lock();
        if inner.closed {
            return false;
        }
        match kind {
            Kind::Replay => inner.replay.push_back(work),
            Kind::Live | Kind::Control => inner.live.push_back(work),
        }
        drop(inner);
        self.ready.notify_one();
        true
    }
}

impl Queues {
    /// `workers` lanes of `capacity` live messages (and as many replay messages) each, and
    /// the worker ends of them.
    pub fn new(workers: usize, capacity: usize) -> (Queues, Vec<Receiver>) {
        let depth = Arc::new(AtomicI64::new(0));
        let lanes: Vec<Arc<Lane>> = (0..workers)
            .map(|_| {
                Arc::new(Lane {
                    inner: Mutex::new(Inner::default()),
                    ready: Condvar::new(),
                    live_room: Semaphore::new(capacity),
                    replay_room: Semaphore::new(capacity),
                    lag_us: AtomicU64::new(0),
                })
            })
            .collect();
        let receivers = lanes.iter().map(|lane| Receiver { lane: lane.clone(), depth: depth.clone() }).collect();
        metrics::gauge!(m::QUEUE_CAPACITY).set((capacity * workers) as f64);
        (Queues { lanes, capacity, depth, captures: tokio::sync::Mutex::new(()) }, receivers)
    }

    pub fn workers(&self) -> usize {
        self.lanes.len()
    }

    pub fn capacity_per_worker(&self) -> usize {
        self.capacity
    }

    /// Messages waiting, over all lanes.
    pub fn depth(&self) -> i64 {
        self.depth.load(Ordering::Relaxed)
    }

    /// Sets `kvindex_queue_depth` to the messages waiting now (called periodically: apply
    /// worker 0's tick).
    pub fn publish_depth(&self) {
        metrics::gauge!(m::QUEUE_DEPTH).set(self.depth().max(0) as f64);
    }

    /// The largest source lag any worker reported at its last tick.
    pub fn max_lag(&self) -> Duration {
        let us = self.lanes.iter().map(|l| l.lag_us.load(Ordering::Relaxed)).max().unwrap_or(0);
        Duration::from_micros(us)
    }

    /// The worker that owns the source named by `key` (topic or pod id).
    pub fn worker_for(&self, key: &[u8]) -> usize {
        let mut h = rustc_hash::FxHasher::default();
        h.write(key);
        (h.finish() % self.lanes.len() as u64) as usize
    }

    /// Hands `work` to `worker`, waiting (asynchronously) for room if it needs room and there
    /// is none: a live message waits for the worker to take one (its caller stops reading its
    /// socket meanwhile), replay output likewise apart; control work never waits. Returns
    /// false when the worker is gone (the server is stopping): the work is dropped.
    pub async fn send(&self, worker: usize, work: Work) -> bool {
        let lane = &self.lanes[worker];
        let kind = kind(&work);
        if let Some(room) = lane.room(kind) {
            match room.try_acquire() {
                Ok(permit) => permit.forget(),
                Err(TryAcquireError::Closed) => return false,
                Err(TryAcquireError::NoPermits) => {
                    if kind == Kind::Live {
                        metrics::counter!(m::QUEUE_FULL).increment(1);
                    }
                    match room.acquire().await {
                        Ok(permit) => permit.forget(),
                        Err(_) => return false,
                    }
                }
            }
        }
        self.depth.fetch_add(1, Ordering::Relaxed);
        if lane.push(work, kind) {
            true
        } else {
            self.depth.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }
}

/// A worker's end of its lane. Dropping it closes the lane: what is queued is dropped (so a
/// sender waiting for an answer hears the worker is gone) and senders waiting for room give up.
pub struct Receiver {
    lane: Arc<Lane>,
    depth: Arc<AtomicI64>,
}

impl Receiver {
    /// The next piece of work, replay output first; waits up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Work, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lane.inner.lock();
        loop {
            let next = match inner.replay.pop_front() {
                Some(work) => Some(work),
                None => inner.live.pop_front(),
            };
            if let Some(work) = next {
                drop(inner);
                self.depth.fetch_sub(1, Ordering::Relaxed);
                if let Some(room) = self.lane.room(kind(&work)) {
                    room.add_permits(1);
                }
                return Ok(work);
            }
            if inner.closed {
                return Err(RecvTimeoutError::Disconnected);
            }
            if self.lane.ready.wait_until(&mut inner, deadline).timed_out() {
                return Err(RecvTimeoutError::Timeout);
            }
        }
    }

    /// The worker's largest source lag now (read by [`Queues::max_lag`]).
    pub fn set_lag(&self, lag: Duration) {
        self.lane.lag_us.store(lag.as_micros().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    /// When the oldest live message waiting in this lane was received at its socket: every
    /// message behind it waits at least as long (one FIFO per worker), so its age is the
    /// worker's share of every source's lag.
    pub fn oldest_live(&self) -> Option<Instant> {
        self.lane.inner.lock().live.iter().find_map(|w| match w {
            Work::Live { at, .. } => Some(*at),
            _ => None,
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let dropped = {
            let mut inner = self.lane.inner.lock();
            inner.closed = true;
            let n = inner.live.len() + inner.replay.len();
            // Dropped outside the lock: a piece of work may answer a waiting task as it goes.
            (std::mem::take(&mut inner.live), std::mem::take(&mut inner.replay), n)
        };
        self.depth.fetch_sub(dropped.2 as i64, Ordering::Relaxed);
        self.lane.live_room.close();
        self.lane.replay_room.close();
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use kvindex_zmtp::Budget;

    use super::*;
    use crate::protocols::{LiveSocket, ReplayItem, StreamKey};
    use crate::write::transport::{ConnId, Peer};

    fn live(n: u64) -> Work {
        Work::Live {
            origin: LiveSocket::Central,
            conn: ConnId(n),
            peer: Arc::new(Peer::Tcp("127.0.0.1:1".parse().unwrap())),
            frames: vec![Bytes::from_static(b"kv@p@m")],
            lease: Budget::new(1 << 20).lease(),
            at: Instant::now(),
        }
    }

    fn replay(id: u64) -> Work {
        Work::Replay { stream: StreamKey { base: Arc::from("p"), rank: 0 }, id, item: ReplayItem::End }
    }

    fn conn_of(work: &Work) -> Option<u64> {
        match work {
            Work::Live { conn, .. } => Some(conn.0),
            _ => None,
        }
    }

    const NOW: Duration = Duration::from_millis(0);

    #[tokio::test]
    async fn a_live_message_waits_for_room_and_goes_in_when_the_worker_takes_one() {
        let (queues, mut rx) = Queues::new(1, 2);
        let (queues, rx) = (Arc::new(queues), rx.remove(0));
        assert!(queues.send(0, live(1)).await);
        assert!(queues.send(0, live(2)).await);
        let q = queues.clone();
        let third = tokio::spawn(async move { q.send(0, live(3)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!third.is_finished(), "the lane is full: the third waits, it is not dropped");
        assert_eq!(queues.depth(), 2);
        assert_eq!(conn_of(&rx.recv_timeout(NOW).unwrap()), Some(1));
        assert!(tokio::time::timeout(Duration::from_secs(5), third).await.unwrap().unwrap());
        assert_eq!(conn_of(&rx.recv_timeout(NOW).unwrap()), Some(2));
        assert_eq!(conn_of(&rx.recv_timeout(NOW).unwrap()), Some(3), "in order");
        assert!(matches!(rx.recv_timeout(NOW), Err(RecvTimeoutError::Timeout)));
        assert_eq!(queues.depth(), 0);
    }

    #[tokio::test]
    async fn replay_output_is_served_first_and_has_room_of_its_own() {
        let (queues, mut rx) = Queues::new(1, 1);
        let rx = rx.remove(0);
        assert!(queues.send(0, live(1)).await);
        // The live room is spent; a replay's message and control work still go in at once.
        assert!(queues.send(0, replay(7)).await);
        assert!(queues.send(0, Work::Stop).await);
        assert!(matches!(rx.recv_timeout(NOW).unwrap(), Work::Replay { id: 7, .. }));
        assert_eq!(conn_of(&rx.recv_timeout(NOW).unwrap()), Some(1));
        assert!(matches!(rx.recv_timeout(NOW).unwrap(), Work::Stop), "control work behind the live messages before it");
    }

    #[tokio::test]
    async fn a_closed_lane_refuses_and_releases_every_waiter() {
        let (queues, mut rx) = Queues::new(1, 1);
        let (queues, rx) = (Arc::new(queues), rx.remove(0));
        assert!(queues.send(0, live(1)).await);
        let (answer, answered) = tokio::sync::oneshot::channel();
        assert!(queues.send(0, Work::RemovePod { pod: "p".into(), done: answer }).await);
        let q = queues.clone();
        let waiting = tokio::spawn(async move { q.send(0, live(2)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(rx);
        assert!(!tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap());
        assert!(answered.await.is_err(), "queued work is dropped: its sender hears the worker is gone");
        assert!(!queues.send(0, Work::Stop).await);
        assert_eq!(queues.depth(), 0);
    }

    #[tokio::test]
    async fn the_oldest_live_message_dates_the_lane() {
        let (queues, mut rx) = Queues::new(1, 4);
        let rx = rx.remove(0);
        assert_eq!(rx.oldest_live(), None);
        assert!(queues.send(0, Work::Stop).await);
        let first = live(1);
        let at = match &first {
            Work::Live { at, .. } => *at,
            _ => unreachable!(),
        };
        assert!(queues.send(0, first).await);
        assert!(queues.send(0, live(2)).await);
        assert_eq!(rx.oldest_live(), Some(at), "control work does not date the lane");
        rx.recv_timeout(NOW).unwrap();
        rx.recv_timeout(NOW).unwrap();
        assert!(rx.oldest_live().is_some_and(|t| t >= at));
        rx.recv_timeout(NOW).unwrap();
        assert_eq!(rx.oldest_live(), None);
    }
}
