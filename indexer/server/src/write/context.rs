//! The apply workers' context: the configuration, and the handles they share with the rest of
//! the service (the index and source states, the pods' registry, the queues, readiness, the central
//! SUB's connections), plus what only they use (replay permits, restored snapshot records, the
//! recorder, the runtime). Every other part receives only the handle it uses; this bundle
//! exists for the workers (`write/worker/`), snapshots (`persist/snapshot/`) and replays
//! (`write::replay`), the parts that drive the stream table (`write::table`) live.

use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard};
use tokio::sync::Semaphore;

use kvindex::speculative::SpeculativeCredits;
use kvindex::KvIndex;

use crate::clock::Clock;
use crate::config::Config;
use crate::index_handle::IndexHandle;
use crate::persist::dump::recorder::Recorder;
use crate::persist::snapshot::restored::Restored;
use crate::pods::registry::Registry;
use crate::queue::Queues;
use crate::readiness::Readiness;
use crate::status::SourceStatus;
use crate::write::sources::connections::CentralConnections;
use crate::write::table::PodOwners;
use crate::write::transport::Source;

/// The handles the apply workers share with the rest of the service.
pub struct Shared {
    pub index: IndexHandle,
    /// The pods' registry (written by the pods' lifecycle, read here).
    pub registry: Arc<RwLock<Registry>>,
    pub queues: Arc<Queues>,
    pub readiness: Arc<Readiness>,
    pub central: Arc<CentralConnections>,
}

pub struct ServiceState {
    config: Config,
    shared: Shared,
    replay_permits: Arc<Semaphore>,
    restored: Restored,
    recorder: Option<Arc<Recorder>>,
    /// Which stream owns each pod id, for every worker's stream table.
    pod_owners: Arc<PodOwners>,
    /// The runtime the service's tasks run on (apply workers are threads and spawn onto it).
    runtime: tokio::runtime::Handle,
}

impl ServiceState {
    /// A context of its own for `config`'s `index` and `queues`, sharing nothing (tests, tools).
    pub fn new(config: Config, index: KvIndex, queues: Queues) -> Self {
        let queues = Arc::new(queues);
        let readiness = Arc::new(Readiness::default());
        let shared = Shared {
            index: IndexHandle::new(index, SpeculativeCredits::new(config.speculative.clone()), Clock::start()),
            registry: Arc::new(RwLock::new(Registry::new(&config.topic_map, &config.replay))),
            queues,
            readiness,
            central: Arc::default(),
        };
        ServiceState::with(config, shared, None)
    }

    /// The context of `config` on the service's `shared` handles, recording to `recorder`.
    pub fn with(config: Config, shared: Shared, recorder: Option<Arc<Recorder>>) -> Self {
        ServiceState {
            replay_permits: Arc::new(Semaphore::new(config.max_concurrent_replays)),
            config,
            shared,
            restored: Restored::default(),
            recorder,
            pod_owners: Arc::default(),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn index(&self) -> &KvIndex {
        self.shared.index.index()
    }

    pub fn speculative(&self) -> &SpeculativeCredits {
        self.shared.index.speculative()
    }

    /// Ends `pod`'s speculative credit, counting the credits dropped under `reason`.
    pub fn end_speculation(&self, pod: &str, reason: &'static str) {
        self.shared.index.end_speculation(pod, reason)
    }

    /// Milliseconds since the service started: the sequencers' clock.
    pub fn now_ms(&self) -> u64 {
        self.shared.index.now_ms()
    }

    pub fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.shared.registry.read()
    }

    pub fn queues(&self) -> &Queues {
        &self.shared.queues
    }

    pub fn status(&self) -> &SourceStatus {
        self.shared.index.status()
    }

    pub fn readiness(&self) -> &Readiness {
        &self.shared.readiness
    }

    /// Bounds replays in flight (`max_concurrent_replays`).
    pub fn replay_permits(&self) -> Arc<Semaphore> {
        self.replay_permits.clone()
    }

    /// Snapshot records loaded at start and not yet picked up by their streams.
    pub fn restored(&self) -> &Restored {
        &self.restored
    }

    /// Which stream owns each pod id (shared by every worker's stream table).
    pub fn pod_owners(&self) -> Arc<PodOwners> {
        self.pod_owners.clone()
    }

    /// The dump being recorded (`kvindex record`), if any.
    pub fn recorder(&self) -> Option<&Recorder> {
        self.recorder.as_deref()
    }

    /// Whether `source` holds a live connection on the central SUB.
    pub fn central_source_connected(&self, source: &Source) -> bool {
        self.shared.central.connected(source)
    }

    /// Runs `task` on the service's runtime (from an apply worker's thread, say).
    pub fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(task);
    }
}
