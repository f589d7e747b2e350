//! The bounded queues between the sockets and the apply workers: one per worker, sharded by
//! source so that a stream's messages stay in order. A socket never waits: a full queue drops
//! the live message and counts it, and the seq gap it leaves is replayed. Replay output and
//! control work wait for room instead.

use std::hash::Hasher;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::Duration;

use super::work::Work;
use crate::telemetry as m;

pub struct Queues {
    senders: Vec<SyncSender<Work>>,
    capacity: usize,
    depth: AtomicI64,
    dropped: AtomicU64,
}

impl Queues {
    /// `workers` queues of `capacity` messages each, and their receiving ends.
    pub fn new(workers: usize, capacity: usize) -> (Queues, Vec<Receiver<Work>>) {
        let (senders, receivers) = (0..workers).map(|_| sync_channel(capacity)).unzip();
        metrics::gauge!(m::QUEUE_CAPACITY).set((capacity * workers) as f64);
        (Queues { senders, capacity, depth: AtomicI64::new(0), dropped: AtomicU64::new(0) }, receivers)
    }

    pub fn workers(&self) -> usize {
        self.senders.len()
    }

    pub fn capacity_per_worker(&self) -> usize {
        self.capacity
    }

    /// Messages waiting, over all queues.
    pub fn depth(&self) -> i64 {
        self.depth.load(Ordering::Relaxed)
    }

    /// Live messages dropped because their queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The worker that owns the source named by `key` (topic or pod id).
    pub fn worker_for(&self, key: &[u8]) -> usize {
        let mut h = rustc_hash::FxHasher::default();
        h.write(key);
        (h.finish() % self.senders.len() as u64) as usize
    }

    /// Called by a worker for every item it takes.
    pub(super) fn took_one(&self) {
        self.depth.fetch_sub(1, Ordering::Relaxed);
    }

    /// Hands a live message to its worker without ever blocking the socket. A full queue
    /// drops the message, counts it, and the resulting seq gap triggers a replay.
    pub fn offer_live(&self, worker: usize, work: Work) {
        match self.senders[worker].try_send(work) {
            Ok(()) => {
                self.depth.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                metrics::counter!(m::QUEUE_DROPPED).increment(1);
                if n.is_power_of_two() {
                    tracing::warn!(
                        dropped_total = n,
                        worker,
                        "apply queue full: live message dropped (the seq gap will be replayed)"
                    );
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Hands replay output or control work to a worker, waiting (asynchronously) for room.
    /// Returns false when the worker is gone (the server is stopping).
    pub async fn send(&self, worker: usize, mut work: Work) -> bool {
        loop {
            match self.senders[worker].try_send(work) {
                Ok(()) => {
                    self.depth.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Err(TrySendError::Full(w)) => {
                    work = w;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(TrySendError::Disconnected(_)) => return false,
            }
        }
    }
}
