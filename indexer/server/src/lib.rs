//! The service shell around the pure core: ZeroMQ sources, replay client, apply workers,
//! gRPC, HTTP admin, metrics. All I/O and clocks live here; every decision about sequencing
//! is made by [`kvindex::sequencer::Sequencer`].
//!
//! ```text
//! SUB sockets ──try_send──▶ bounded queue (per worker) ──▶ apply worker thread:
//!   (central / per-pod)        full → dropped, counted;      decode → Sequencer → KvIndex
//!                              the seq gap triggers replay   ▲
//! replay DEALER task ──send (waits)──────────────────────────┘
//! ```

pub mod config;
pub mod grpc;
pub mod http;
pub mod llmd;
pub mod metrics;
pub mod registry;
pub mod replay;
pub mod serve;
pub mod worker;
pub mod zmq;
pub mod zmtp;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::RwLock;
use serde::Serialize;

use kvindex::sequencer::SourceState;
use kvindex::KvIndex;

use self::config::Config;
use self::registry::Registry;

/// One sequenced stream: a source (topic id mapped to a pod, or a dialled pod) and a DP rank.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    /// Pod id of rank 0.
    pub base: Arc<str>,
    pub rank: u32,
}

/// Where a live message came from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// The central SUB socket: the topic names the pod.
    Central,
    /// A dialled pod's SUB socket.
    Pod { id: Arc<str>, model: Arc<str>, endpoint: Arc<str> },
}

/// What a replay DEALER got.
#[derive(Debug)]
pub enum ReplayItem {
    Message { seq: u64, payload: Bytes },
    End,
    Failed { timeout: bool },
}

/// Work for an apply worker.
pub enum Work {
    /// A live message; `conn` identifies the TCP connection it came on (a new one for the same
    /// stream means the publisher reconnected, possibly as a new process).
    Live { origin: Origin, conn: u64, frames: Vec<Bytes>, at: Instant },
    Replay { stream: StreamKey, id: u64, item: ReplayItem },
    /// Start a replay from 0 before any live message (per-pod sources with a replay socket).
    InitialSync { stream: StreamKey, model: Arc<str>, endpoint: Arc<str>, startup: bool },
    /// Drop every stream of this pod and everything it holds; answer when done.
    RemovePod { pod: String, done: tokio::sync::oneshot::Sender<bool> },
}

/// What `/debug/sources` shows per stream (refreshed by the worker on every tick).
#[derive(Debug, Clone, Serialize)]
pub struct StreamDebug {
    pub pod: String,
    pub base_pod: String,
    pub dp_rank: u32,
    pub mode: &'static str,
    pub topic: Option<String>,
    pub topic_id: Option<String>,
    pub model: String,
    pub endpoint: Option<String>,
    pub replay_endpoint: Option<String>,
    pub state: &'static str,
    pub last_seq: Option<u64>,
    pub last_live_seq: Option<u64>,
    pub last_event_age_ms: Option<u64>,
    pub gaps: u64,
    pub duplicates: u64,
    pub restarts: u64,
    pub malformed: u64,
    pub clears: u64,
    pub replays_started: u64,
    pub replays_filled: u64,
    pub replays_failed: u64,
    pub replay_in_flight: Option<u64>,
    pub pending: usize,
}

/// State shared by sockets, workers and servers.
pub struct Shared {
    pub config: Config,
    pub index: KvIndex,
    pub start: Instant,
    pub registry: RwLock<Registry>,
    /// Source state per (DP-resolved) pod id, for ScoreTokens answers.
    pub pod_states: RwLock<BTreeMap<String, SourceState>>,
    pub debug: RwLock<BTreeMap<StreamKey, StreamDebug>>,
    pub queues: Vec<SyncSender<Work>>,
    pub queue_depth: AtomicI64,
    pub queue_dropped: AtomicU64,
    pub replay_permits: Arc<tokio::sync::Semaphore>,
    /// The single-threaded runtime the `zeromq` crate's replay DEALERs run on (see `service::replay`).
    pub zmq_runtime: tokio::runtime::Handle,
    pub initial_syncs: AtomicUsize,
    pub listening: AtomicBool,
    pub state_counts: [AtomicI64; 5],
}

impl Shared {
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn ready(&self) -> bool {
        self.listening.load(Ordering::Acquire) && self.initial_syncs.load(Ordering::Acquire) == 0
    }

    pub fn worker_for(&self, key: &[u8]) -> usize {
        use std::hash::Hasher;
        let mut h = rustc_hash::FxHasher::default();
        h.write(key);
        (h.finish() % self.queues.len() as u64) as usize
    }

    /// Hands a live message to its worker without ever blocking the socket. A full queue
    /// drops the message, counts it, and the resulting seq gap triggers a replay.
    pub fn offer_live(&self, worker: usize, work: Work) {
        match self.queues[worker].try_send(work) {
            Ok(()) => {
                self.queue_depth.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) => {
                let n = self.queue_dropped.fetch_add(1, Ordering::Relaxed) + 1;
                ::metrics::counter!(metrics::QUEUE_DROPPED).increment(1);
                if n.is_power_of_two() {
                    tracing::warn!(dropped_total = n, worker, "apply queue full: live message dropped (the seq gap will be replayed)");
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Hands replay output or control work to a worker, waiting (asynchronously) for room.
    pub async fn send_work(&self, worker: usize, mut work: Work) {
        loop {
            match self.queues[worker].try_send(work) {
                Ok(()) => {
                    self.queue_depth.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(TrySendError::Full(w)) => {
                    work = w;
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }

    fn count_state(&self, state: SourceState, delta: i64) {
        let i = SourceState::ALL.iter().position(|s| *s == state).unwrap_or(0);
        let v = self.state_counts[i].fetch_add(delta, Ordering::Relaxed) + delta;
        ::metrics::gauge!(metrics::SOURCES, "state" => state.label()).set(v as f64);
    }
}
