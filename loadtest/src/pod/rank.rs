//! One engine (a data-parallel rank of a pod) on the wall clock: the pure [`Engine`] stepped
//! by a task, its events handed to its [`Publisher`], its request updates streamed back to
//! HTTP handlers.
//!
//! Simulated time is wall time since the pod started, multiplied by `time_scale` (1 = real
//! time; 10 = ten simulated seconds per wall second). A step of simulated duration `d` keeps
//! the task busy for `d / time_scale` of wall time before its tokens and events are released,
//! so wall-clock TTFTs measured by a client follow the timing model.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::submission::{RequestEvent, SubmitError};
use crate::engine::{Engine, EngineStats, NewRequest, RejectReason, RequestId, RequestUpdate};
use crate::wire::Publisher;

enum PodCommand {
    Submit {
        request: NewRequest,
        arrived: Instant,
        reply: oneshot::Sender<Result<mpsc::UnboundedReceiver<RequestEvent>, RejectReason>>,
    },
    ResetPrefixCache {
        reply: oneshot::Sender<bool>,
    },
}

/// The handle to one running engine. Cheap to clone.
#[derive(Clone)]
pub struct Rank {
    commands: mpsc::UnboundedSender<PodCommand>,
    stats: Arc<Mutex<EngineStats>>,
    /// The data-parallel rank (0 without data parallelism).
    pub rank: u32,
    pub publisher: Publisher,
}

impl Rank {
    /// Starts the engine task. `label` names it in logs.
    pub fn start(engine: Engine, rank: u32, label: String, publisher: Publisher, time_scale: f64) -> Rank {
        let stats = Arc::new(Mutex::new(engine.stats()));
        let (commands, receiver) = mpsc::unbounded_channel();
        let runner = Runner {
            engine,
            publisher: publisher.clone(),
            stats: stats.clone(),
            started: Instant::now(),
            time_scale: if time_scale.is_finite() && time_scale > 0.0 { time_scale } else { 1.0 },
            streams: HashMap::new(),
            label,
            flush_events: false,
        };
        tokio::spawn(runner.run(receiver));
        Rank { commands, stats, rank, publisher }
    }

    /// Queues a request; the receiver yields its events until `Finished`.
    pub async fn submit(&self, request: NewRequest) -> Result<mpsc::UnboundedReceiver<RequestEvent>, SubmitError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(PodCommand::Submit { request, arrived: Instant::now(), reply })
            .map_err(|_| SubmitError::Stopped)?;
        answer.await.map_err(|_| SubmitError::Stopped)?.map_err(SubmitError::Rejected)
    }

    /// Whether the cache was reset (refused while requests hold blocks).
    pub async fn reset_prefix_cache(&self) -> Result<bool, SubmitError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(PodCommand::ResetPrefixCache { reply }).map_err(|_| SubmitError::Stopped)?;
        answer.await.map_err(|_| SubmitError::Stopped)
    }

    pub fn stats(&self) -> EngineStats {
        match self.stats.lock() {
            Ok(stats) => *stats,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }
}

struct Runner {
    engine: Engine,
    publisher: Publisher,
    stats: Arc<Mutex<EngineStats>>,
    started: Instant,
    time_scale: f64,
    streams: HashMap<RequestId, mpsc::UnboundedSender<RequestEvent>>,
    /// The pod id and rank, for logs.
    label: String,
    /// A reset queued `AllBlocksCleared`: run a step even when idle so it goes out.
    flush_events: bool,
}

impl Runner {
    fn sim_time(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.started).as_secs_f64() * self.time_scale
    }

    fn handle(&mut self, command: PodCommand) {
        match command {
            PodCommand::Submit { request, arrived, reply } => {
                let now = self.sim_time(arrived);
                let result = self.engine.submit(request, now).map(|id| {
                    let (sender, receiver) = mpsc::unbounded_channel();
                    self.streams.insert(id, sender);
                    receiver
                });
                let _ = reply.send(result);
            }
            PodCommand::ResetPrefixCache { reply } => {
                let reset = self.engine.reset_prefix_cache();
                self.flush_events |= reset;
                tracing::info!(pod = %self.label, reset, "reset_prefix_cache");
                let _ = reply.send(reset);
            }
        }
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<PodCommand>) {
        loop {
            if !self.engine.has_work() && !self.flush_events {
                match commands.recv().await {
                    Some(command) => self.handle(command),
                    None => return,
                }
            }
            while let Ok(command) = commands.try_recv() {
                self.handle(command);
            }
            self.publish_stats();
            let step_start = Instant::now();
            let now = self.sim_time(step_start);
            let outcome = self.engine.step(now);
            self.flush_events = false;
            // Load as of this step (its admissions running) while it computes.
            self.publish_stats();
            if outcome.duration > 0.0 {
                let wall = Duration::from_secs_f64(outcome.duration / self.time_scale);
                tokio::time::sleep_until((step_start + wall).into()).await;
            } else if outcome.scheduled == 0 && self.engine.has_work() {
                // Nothing could run (cannot happen with validated requests); avoid spinning.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            self.publisher.publish(outcome.events).await;
            for update in outcome.updates {
                self.deliver(update);
            }
        }
    }

    fn publish_stats(&self) {
        if let Ok(mut stats) = self.stats.lock() {
            *stats = self.engine.stats();
        }
    }

    fn deliver(&mut self, update: RequestUpdate) {
        let (id, event) = match update {
            RequestUpdate::Scheduled { id, cached_tokens } => (id, RequestEvent::Scheduled { cached_tokens }),
            RequestUpdate::Token { id, token, .. } => (id, RequestEvent::Token(token)),
            RequestUpdate::Finished { id, summary } => {
                if let Some(stream) = self.streams.remove(&id) {
                    let _ = stream.send(RequestEvent::Finished(summary));
                }
                return;
            }
        };
        if let Some(stream) = self.streams.get(&id) {
            // A client that went away keeps its request running (vLLM would abort it; the
            // cache effects are what matter here).
            let _ = stream.send(event);
        }
    }
}
