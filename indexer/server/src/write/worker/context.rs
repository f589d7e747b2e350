//! What the apply workers use of the service, and nothing else: the index handle (index,
//! credits, source status, clock), the pods' registry they read, the lanes and readiness they
//! report to, the central SUB's connections, the restored snapshot records their streams take,
//! the pod owners their tables share, the recorder, the replays they start, and the few
//! settings they read. Built once from the service's state ([`WorkerContext::of`]) and shared
//! by every worker, so a worker cannot reach the rest of the configuration or the service.

use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard};

use kvindex::sequencer::SequencerConfig;
use kvindex::KvIndex;

use crate::config::{Config, SglangCheckConfig};
use crate::index_handle::IndexHandle;
use crate::persist::dump::recorder::Recorder;
use crate::persist::snapshot::restored::Restored;
use crate::pods::registry::Registry;
use crate::protocols::StreamKey;
use crate::queue::Queues;
use crate::readiness::Readiness;
use crate::status::SourceStatus;
use crate::write::context::ServiceState;
use crate::write::replay::{self, Replays};
use crate::write::sources::connections::CentralConnections;
use crate::write::table::{PodOwners, TableConfig};
use crate::write::transport::Source;

/// The settings an apply worker reads, taken from the configuration once.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Each worker's stream table: its share of the caps, naming and sequencer knobs.
    pub table: TableConfig,
    /// The engine of a pod whose entry names none.
    pub default_engine: kvindex::wire::Engine,
    /// The SGLang page-hash check of a pod whose entry sets none of it.
    pub sglang_check: SglangCheckConfig,
    /// The index's canonical block, in tokens (named when an engine's cannot be indexed).
    pub block_size: usize,
    /// How far behind its engine a source may be and still be credited (0: no bound).
    pub max_source_staleness_ms: u64,
}

impl WorkerSettings {
    pub fn of(c: &Config) -> WorkerSettings {
        WorkerSettings {
            table: TableConfig {
                topic_filter: c.topic_filter.clone(),
                dp_naming_topic: c.dp_naming_topic,
                max_streams: c.max_sources.div_ceil(c.apply_workers),
                block_size: c.block_size,
                max_streams_per_address: c.max_sources_per_address.div_ceil(c.apply_workers),
                sequencer: SequencerConfig {
                    replay: false,
                    stale_after_ms: c.stale_after_ms,
                    replay_timeout_ms: c.replay_timeout_ms,
                    replay_queue_timeout_ms: c.replay_queue_timeout_ms,
                    replay_cooldown_ms: c.replay_cooldown_ms,
                    max_pending: c.max_pending,
                },
            },
            default_engine: c.default_engine,
            sglang_check: c.sglang_check,
            block_size: c.block_size,
            max_source_staleness_ms: c.max_source_staleness_ms,
        }
    }
}

/// What every apply worker shares (see the module doc).
pub struct WorkerContext {
    settings: WorkerSettings,
    index: IndexHandle,
    /// The pods' registry (written by the pods' lifecycle, read here).
    registry: Arc<RwLock<Registry>>,
    queues: Arc<Queues>,
    readiness: Arc<Readiness>,
    central: Arc<CentralConnections>,
    restored: Arc<Restored>,
    /// Which stream owns each pod id, for every worker's stream table.
    pod_owners: Arc<PodOwners>,
    recorder: Option<Arc<Recorder>>,
    replays: Arc<Replays>,
    /// The runtime the service's tasks run on (apply workers are threads and spawn onto it).
    runtime: tokio::runtime::Handle,
}

impl WorkerContext {
    /// The workers' part of the service's `state` (on the current runtime, which their
    /// replays are spawned onto).
    pub fn of(state: &ServiceState) -> WorkerContext {
        let shared = state.shared();
        WorkerContext {
            settings: WorkerSettings::of(state.config()),
            index: shared.index.clone(),
            registry: shared.registry.clone(),
            queues: shared.queues.clone(),
            readiness: shared.readiness.clone(),
            central: shared.central.clone(),
            restored: state.restored_records(),
            pod_owners: Arc::default(),
            recorder: state.recorder(),
            replays: Arc::new(Replays::new(state.config(), shared.queues.clone())),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    pub fn settings(&self) -> &WorkerSettings {
        &self.settings
    }

    /// The index and what lives beside it (credits, source status, clock).
    pub fn index_handle(&self) -> &IndexHandle {
        &self.index
    }

    pub fn index(&self) -> &KvIndex {
        self.index.index()
    }

    /// Ends `pod`'s speculative credit, counting the credits dropped under `reason`.
    pub fn end_speculation(&self, pod: &str, reason: &'static str) {
        self.index.end_speculation(pod, reason)
    }

    /// Milliseconds since the service started: the sequencers' clock.
    pub fn now_ms(&self) -> u64 {
        self.index.now_ms()
    }

    pub fn status(&self) -> &SourceStatus {
        self.index.status()
    }

    pub fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read()
    }

    pub fn queues(&self) -> &Queues {
        &self.queues
    }

    pub fn readiness(&self) -> &Readiness {
        &self.readiness
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
        self.central.connected(source)
    }

    /// Starts replay `id` of `stream` from `from` against `endpoint` on the service's runtime,
    /// its replies going to `worker`'s lane.
    pub fn start_replay(&self, worker: usize, stream: StreamKey, id: u64, from: u64, endpoint: String) {
        self.runtime.spawn(replay::run(self.replays.clone(), worker, stream, id, from, endpoint));
    }
}
