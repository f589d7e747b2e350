//! Central mode reads every publisher's messages through one task, and a live message waits
//! for room in its worker's queue (`apply::Queues`). Were that task to wait itself, one full
//! worker would stop the reading of every socket, the other workers' sources too. So each
//! worker gets a door: a bounded channel (`queue_capacity` messages) drained into its queue by
//! a task of its own, which is the one that waits. The central task waits only when a door is
//! full as well; every message behind a door keeps its lease on the central SUB's byte budget,
//! so a door is bounded in bytes by `zmq_max_bytes_in_flight` too.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::apply::Work;
use crate::state::ServiceState;

pub struct Doors {
    doors: Vec<mpsc::Sender<Work>>,
}

impl Doors {
    /// A door per worker, each with its task (they end when the doors are dropped, or when
    /// their worker is gone).
    pub fn open(state: &Arc<ServiceState>) -> Doors {
        let capacity = state.queues().capacity_per_worker();
        let doors = (0..state.queues().workers())
            .map(|worker| {
                let (tx, mut rx) = mpsc::channel::<Work>(capacity);
                let state = state.clone();
                tokio::spawn(async move {
                    while let Some(work) = rx.recv().await {
                        if !state.queues().send(worker, work).await {
                            return;
                        }
                    }
                });
                tx
            })
            .collect();
        Doors { doors }
    }

    /// Hands `work` to `worker`'s door, in order with everything sent to it before; waits only
    /// while the door is full. False when the worker is gone.
    pub async fn send(&self, worker: usize, work: Work) -> bool {
        self.doors[worker].send(work).await.is_ok()
    }
}
