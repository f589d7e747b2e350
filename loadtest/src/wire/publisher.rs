//! One pod's event publisher: numbers each step's batch, keeps the replay window, sends
//! `[topic, seq u64 BE, payload]` on a PUB socket that binds or dials, and applies the fault
//! knobs (drop, pause, restart).
//!
//! Like vLLM's publisher thread it runs beside the engine. The engine waits only until its batch
//! is numbered and queued on the socket (the PUB never blocks: a subscriber whose queue is full
//! loses the message), so a step's events are out before its tokens reach clients. Faults
//! model what a subscriber sees from a real engine:
//! * **drop N**: the next N batches are numbered and buffered but not sent, as when PUB's
//!   high-water mark drops them; a subscriber sees a seq gap that replay can fill;
//! * **pause**: batches are held (numbered when sent), as when the publisher thread stalls;
//! * **restart**: a new socket and seq back to 0 with an empty replay window, as when vLLM's
//!   process restarts (no `AllBlocksCleared` is sent). Only the publisher restarts: the engine
//!   keeps its cache, so a subscriber that drops the pod's entries on the seq reset (as it
//!   should) under-reports until new stores arrive.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

use super::encode::{encode_batch, WireVersion};
use super::replay::serve_replay;
use super::replay_buffer::ReplayBuffer;
use crate::engine::KvEvent;

/// Where the PUB socket goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PubEndpoint {
    /// Per-pod PUB, bound here (`--zmq-bind-base-port`).
    Bind(String),
    /// Dial a central SUB (`--zmq-connect`).
    Connect(String),
}

#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// `kv@127.0.0.1:<http port>@<model>`.
    pub topic: String,
    pub endpoint: PubEndpoint,
    pub replay_endpoint: Option<String>,
    /// Replay window in batches (vLLM's `buffer_steps`, default 10 000).
    pub buffer_steps: usize,
    pub wire: WireVersion,
    pub data_parallel_rank: u32,
}

/// Counters of what the publisher did, for the admin endpoint and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PublisherStats {
    /// The seq the next batch will get.
    pub next_seq: u64,
    pub sent: u64,
    pub dropped: u64,
    pub held: u64,
    pub restarts: u64,
    pub paused: bool,
    pub drop_pending: u64,
    pub connected: bool,
}

enum Command {
    /// The ack fires once the batch is sent, dropped or held.
    Publish(Vec<KvEvent>, oneshot::Sender<()>),
    Drop(u64, oneshot::Sender<()>),
    Pause(oneshot::Sender<()>),
    Resume(oneshot::Sender<()>),
    Restart(oneshot::Sender<Result<(), String>>),
}

/// Cheap to clone; every pod component holds one.
#[derive(Clone)]
pub struct Publisher {
    commands: mpsc::UnboundedSender<Command>,
    stats: Arc<Mutex<PublisherStats>>,
    /// Bound endpoints (port 0 resolved); `None` for a dialing PUB.
    pub bound_endpoint: Option<String>,
    pub bound_replay_endpoint: Option<String>,
}

impl Publisher {
    /// Binds (or starts dialing) the PUB socket and the replay ROUTER, then runs the
    /// publisher task. Fails when an endpoint cannot be bound.
    pub async fn start(config: PublisherConfig) -> Result<Publisher, String> {
        let buffer = Arc::new(Mutex::new(ReplayBuffer::new(config.buffer_steps)));
        let topic = Bytes::from(config.topic.clone().into_bytes());
        let bound_replay_endpoint = match &config.replay_endpoint {
            Some(endpoint) => Some(
                serve_replay(endpoint, buffer.clone(), topic.clone(), config.wire)
                    .await
                    .map_err(|e| format!("cannot bind replay ROUTER {endpoint}: {e}"))?,
            ),
            None => None,
        };
        let (socket, bound_endpoint) = open(&config.endpoint).await?;
        let stats = Arc::new(Mutex::new(PublisherStats::default()));
        let (commands, receiver) = mpsc::unbounded_channel();
        let task = PublisherTask {
            config,
            topic,
            buffer,
            stats: stats.clone(),
            socket,
            bound: bound_endpoint.clone(),
            next_seq: 0,
            drop_pending: 0,
            paused: false,
            held: VecDeque::new(),
        };
        tokio::spawn(task.run(receiver));
        Ok(Publisher { commands, stats, bound_endpoint, bound_replay_endpoint })
    }

    /// Hands over one step's events and waits until they are on the socket (or dropped or held
    /// by a fault). Empty steps publish nothing, as in vLLM.
    pub async fn publish(&self, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        let (ack, done) = oneshot::channel();
        if self.commands.send(Command::Publish(events, ack)).is_ok() {
            let _ = done.await;
        }
    }

    /// Each knob returns once the publisher applied it.
    pub async fn drop_next(&self, batches: u64) {
        self.command(|ack| Command::Drop(batches, ack)).await
    }

    pub async fn pause(&self) {
        self.command(Command::Pause).await
    }

    /// Returns once every held batch went out.
    pub async fn resume(&self) {
        self.command(Command::Resume).await
    }

    async fn command(&self, make: impl FnOnce(oneshot::Sender<()>) -> Command) {
        let (ack, done) = oneshot::channel();
        if self.commands.send(make(ack)).is_ok() {
            let _ = done.await;
        }
    }

    pub async fn restart(&self) -> Result<(), String> {
        let (reply, done) = oneshot::channel();
        self.commands.send(Command::Restart(reply)).map_err(|_| "publisher stopped".to_string())?;
        done.await.map_err(|_| "publisher stopped".to_string())?
    }

    pub fn stats(&self) -> PublisherStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }
}

/// Who waits for a command to take effect.
enum Ack {
    Done(oneshot::Sender<()>),
    Restarted(oneshot::Sender<Result<(), String>>, Result<(), String>),
}

impl Ack {
    fn fire(self) {
        match self {
            Ack::Done(sender) => {
                let _ = sender.send(());
            }
            Ack::Restarted(sender, result) => {
                let _ = sender.send(result);
            }
        }
    }
}

/// The socket, or its dial in progress (zeromq's `connect` retries until the peer is up).
enum PubSocketState {
    Ready(PubSocket),
    Dialing(oneshot::Receiver<PubSocket>),
}

async fn open(endpoint: &PubEndpoint) -> Result<(PubSocketState, Option<String>), String> {
    match endpoint {
        PubEndpoint::Bind(endpoint) => {
            let mut socket = PubSocket::new();
            let bound = socket.bind(endpoint).await.map_err(|e| format!("cannot bind PUB {endpoint}: {e}"))?;
            Ok((PubSocketState::Ready(socket), Some(bound.to_string())))
        }
        PubEndpoint::Connect(endpoint) => {
            let (ready, dialing) = oneshot::channel();
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                let mut socket = PubSocket::new();
                loop {
                    match socket.connect(&endpoint).await {
                        Ok(()) => break,
                        Err(error) => {
                            tracing::warn!(%endpoint, %error, "PUB connect failed; retrying");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
                let _ = ready.send(socket);
            });
            Ok((PubSocketState::Dialing(dialing), None))
        }
    }
}

struct PublisherTask {
    config: PublisherConfig,
    topic: Bytes,
    buffer: Arc<Mutex<ReplayBuffer>>,
    stats: Arc<Mutex<PublisherStats>>,
    socket: PubSocketState,
    /// The bound PUB endpoint, reused on restart (so an OS-assigned port stays the same).
    bound: Option<String>,
    next_seq: u64,
    drop_pending: u64,
    paused: bool,
    held: VecDeque<Vec<KvEvent>>,
}

impl PublisherTask {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            // While dialing, wait for either the socket or a command.
            let command = match &mut self.socket {
                PubSocketState::Dialing(pending) => {
                    tokio::select! {
                        socket = pending => {
                            match socket {
                                Ok(socket) => {
                                    self.socket = PubSocketState::Ready(socket);
                                    tracing::info!(topic = %self.config.topic, "PUB connected");
                                }
                                Err(_) => tracing::warn!(topic = %self.config.topic, "PUB dial abandoned"),
                            }
                            self.update_stats();
                            continue;
                        }
                        command = commands.recv() => command,
                    }
                }
                PubSocketState::Ready(_) => commands.recv().await,
            };
            let Some(command) = command else { break };
            let ack = match command {
                Command::Publish(events, ack) if self.paused => {
                    self.held.push_back(events);
                    Ack::Done(ack)
                }
                Command::Publish(events, ack) => {
                    self.send(events).await;
                    Ack::Done(ack)
                }
                Command::Drop(batches, ack) => {
                    self.drop_pending = self.drop_pending.saturating_add(batches);
                    Ack::Done(ack)
                }
                Command::Pause(ack) => {
                    self.paused = true;
                    Ack::Done(ack)
                }
                Command::Resume(ack) => {
                    self.paused = false;
                    while let Some(events) = self.held.pop_front() {
                        self.send(events).await;
                    }
                    Ack::Done(ack)
                }
                Command::Restart(reply) => {
                    let result = self.restart().await;
                    Ack::Restarted(reply, result)
                }
            };
            // Stats first: whoever waits on the ack must see the command's effect.
            self.update_stats();
            ack.fire();
        }
    }

    async fn send(&mut self, events: Vec<KvEvent>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let payload = Bytes::from(encode_batch(self.config.wire, ts, &events, self.config.data_parallel_rank));
        if let Ok(mut buffer) = self.buffer.lock() {
            buffer.push(seq, payload.clone());
        }
        if self.drop_pending > 0 {
            self.drop_pending -= 1;
            self.bump(|s| s.dropped += 1);
            return;
        }
        let PubSocketState::Ready(socket) = &mut self.socket else {
            self.bump(|s| s.dropped += 1); // no peer yet: PUB drops, as libzmq does
            return;
        };
        let frames = vec![self.topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
        let Ok(message) = ZmqMessage::try_from(frames) else {
            return;
        };
        match socket.send(message).await {
            Ok(()) => self.bump(|s| s.sent += 1),
            Err(error) => {
                tracing::warn!(topic = %self.config.topic, %error, "PUB send failed");
                self.bump(|s| s.dropped += 1);
            }
        }
    }

    async fn restart(&mut self) -> Result<(), String> {
        let old = std::mem::replace(&mut self.socket, PubSocketState::Dialing(oneshot::channel().1));
        if let PubSocketState::Ready(socket) = old {
            let _ = socket.close().await;
        }
        // Rebind the same endpoint (the OS port when it was 0), retrying while it is released.
        let endpoint = match (&self.config.endpoint, &self.bound) {
            (PubEndpoint::Bind(_), Some(bound)) => PubEndpoint::Bind(bound.clone()),
            (other, _) => other.clone(),
        };
        let mut last_error = String::new();
        for _ in 0..50 {
            match open(&endpoint).await {
                Ok((socket, bound)) => {
                    self.socket = socket;
                    self.bound = bound.or(self.bound.take());
                    self.next_seq = 0;
                    self.held.clear();
                    if let Ok(mut buffer) = self.buffer.lock() {
                        buffer.clear();
                    }
                    self.bump(|s| s.restarts += 1);
                    tracing::info!(topic = %self.config.topic, "publisher restarted (seq back to 0)");
                    return Ok(());
                }
                Err(error) => {
                    last_error = error;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        Err(last_error)
    }

    fn bump(&self, change: impl FnOnce(&mut PublisherStats)) {
        if let Ok(mut stats) = self.stats.lock() {
            change(&mut stats);
        }
    }

    fn update_stats(&self) {
        let connected = matches!(self.socket, PubSocketState::Ready(_));
        let (next_seq, held, paused, drop_pending) =
            (self.next_seq, self.held.len() as u64, self.paused, self.drop_pending);
        self.bump(|s| {
            s.next_seq = next_seq;
            s.held = held;
            s.paused = paused;
            s.drop_pending = drop_pending;
            s.connected = connected;
        });
    }
}
