//! The state the service's parts share: the configuration, the index, the registry of pods,
//! the apply queues, the sources' status, readiness and the replay permits. Owned by one
//! [`ServiceState`] behind an `Arc`; every part goes through its methods.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use tokio::sync::Semaphore;

use kvindex::speculative::SpeculativeCredits;
use kvindex::KvIndex;

use crate::apply::Queues;
use crate::config::Config;
use crate::dump::recorder::Recorder;
use crate::snapshot::Restored;
use crate::sources::registry::Registry;
use crate::status::SourceStatus;
use crate::transport::Source;

pub struct ServiceState {
    config: Config,
    index: KvIndex,
    /// RecordRoute's predictions, kept apart from the index (never in `matched_blocks`).
    speculative: SpeculativeCredits,
    start: Instant,
    registry: RwLock<Registry>,
    queues: Queues,
    status: SourceStatus,
    readiness: Readiness,
    replay_permits: Arc<Semaphore>,
    restored: Restored,
    recorder: Option<Arc<Recorder>>,
    /// Live connections on the central SUB per source address: a topic bound to a source
    /// moves to another only once its source has none.
    central_sources: parking_lot::Mutex<HashMap<Source, usize>>,
    /// The runtime the service's tasks run on (apply workers are threads and spawn onto it).
    runtime: tokio::runtime::Handle,
    /// One byte budget for every dialled pod together (`zmq_max_bytes_in_flight`), beside each
    /// dialler's own share: a thousand registered pods cannot hold a thousand shares.
    dialer_budget: kvindex_zmtp::Budget,
}

impl ServiceState {
    pub fn new(config: Config, index: KvIndex, queues: Queues) -> Self {
        ServiceState {
            registry: RwLock::new(Registry::new(&config.topic_map, &config.replay)),
            replay_permits: Arc::new(Semaphore::new(config.max_concurrent_replays)),
            speculative: SpeculativeCredits::new(config.speculative.clone()),
            central_sources: parking_lot::Mutex::new(HashMap::new()),
            dialer_budget: kvindex_zmtp::Budget::new(config.zmq_limits.max_bytes_in_flight),
            config,
            index,
            start: Instant::now(),
            queues,
            status: SourceStatus::default(),
            readiness: Readiness::default(),
            restored: Restored::default(),
            recorder: None,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The byte budget all dialled pods share.
    pub fn dialer_budget(&self) -> &kvindex_zmtp::Budget {
        &self.dialer_budget
    }

    pub fn index(&self) -> &KvIndex {
        &self.index
    }

    pub fn speculative(&self) -> &SpeculativeCredits {
        &self.speculative
    }

    /// Ends `pod`'s speculative credit (its blocks were cleared, its source degraded, or it
    /// was removed), counting the credits dropped under `reason`.
    pub fn end_speculation(&self, pod: &str, reason: &'static str) {
        let dropped = self.speculative.clear_pod(pod);
        if dropped > 0 {
            metrics::counter!(crate::telemetry::SPECULATIVE_CLEARED, "reason" => reason).increment(dropped as u64);
        }
    }

    /// Milliseconds since the service started: the sequencers' clock.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read()
    }

    pub(crate) fn registry_mut(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write()
    }

    pub fn queues(&self) -> &Queues {
        &self.queues
    }

    pub fn status(&self) -> &SourceStatus {
        &self.status
    }

    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// Bounds replays in flight (`max_concurrent_replays`).
    pub fn replay_permits(&self) -> Arc<Semaphore> {
        self.replay_permits.clone()
    }

    /// Snapshot records loaded at start and not yet picked up by their streams.
    pub fn restored(&self) -> &Restored {
        &self.restored
    }

    /// The dump being recorded (`kvindex record`), if any.
    pub fn recorder(&self) -> Option<&Recorder> {
        self.recorder.as_deref()
    }

    pub(crate) fn set_recorder(&mut self, recorder: Arc<Recorder>) {
        self.recorder = Some(recorder);
    }

    /// A connection from `source` to the central SUB opened (`true`) or closed.
    pub(crate) fn central_connection(&self, source: Source, opened: bool) {
        let mut sources = self.central_sources.lock();
        let n = sources.entry(source).or_insert(0);
        if opened {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                sources.remove(&source);
            }
        }
    }

    /// Whether `source` holds a live connection on the central SUB.
    pub fn central_source_connected(&self, source: &Source) -> bool {
        self.central_sources.lock().contains_key(source)
    }

    /// Runs `task` on the service's runtime (from an apply worker's thread, say).
    pub fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(task);
    }
}

/// `/readyz`: the servers are listening and every start-up replay is done (or failed).
#[derive(Default)]
pub struct Readiness {
    listening: AtomicBool,
    initial_syncs: AtomicUsize,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.listening.load(Ordering::Acquire) && self.initial_syncs.load(Ordering::Acquire) == 0
    }

    /// Start-up replays not finished yet.
    pub fn outstanding(&self) -> usize {
        self.initial_syncs.load(Ordering::Acquire)
    }

    pub(crate) fn set_listening(&self) {
        self.listening.store(true, Ordering::Release);
    }

    pub(crate) fn sync_started(&self) {
        self.initial_syncs.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn sync_finished(&self) {
        self.initial_syncs.fetch_sub(1, Ordering::AcqRel);
    }
}
