//! Central mode reads every publisher's messages through one task, and a live message waits
//! for room in its worker's queue (`crate::queue::Queues`). Were that task to wait itself, one full
//! worker would stop the reading of every socket, the other workers' sources too. So each
//! worker gets a relay: a bounded channel (`queue_capacity` messages) drained into its queue by
//! a task of its own, which is the one that waits. The central task waits only when a relay is
//! full as well; every message behind a relay keeps its lease on the central SUB's byte budget,
//! so a relay is bounded in bytes by `zmq_max_bytes_in_flight` too.

//!
//! Generic over what it carries and where it forwards it, so that it names nothing else of the
//! service (the caller passes the queue's `send`).

use std::future::Future;

use tokio::sync::mpsc;

pub struct Relays<W> {
    relays: Vec<mpsc::Sender<W>>,
}

impl<W: Send + 'static> Relays<W> {
    /// `workers` relays of `capacity` messages, each with a task that hands what comes through
    /// to `forward(worker, message)` (they end when the relays are dropped, or when `forward`
    /// says the worker is gone).
    pub fn open<F, Fut>(workers: usize, capacity: usize, forward: F) -> Relays<W>
    where
        F: Fn(usize, W) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = bool> + Send,
    {
        let relays = (0..workers)
            .map(|worker| {
                let (tx, mut rx) = mpsc::channel::<W>(capacity);
                let forward = forward.clone();
                tokio::spawn(async move {
                    while let Some(work) = rx.recv().await {
                        if !forward(worker, work).await {
                            return;
                        }
                    }
                });
                tx
            })
            .collect();
        Relays { relays }
    }

    /// Hands `work` to `worker`'s relay, in order with everything sent to it before; waits only
    /// while the relay is full. False when the worker is gone.
    pub async fn send(&self, worker: usize, work: W) -> bool {
        self.relays[worker].send(work).await.is_ok()
    }
}
