//! The service's state: the configuration, and the handles the service's parts share (the
//! index and source states, the pods' registry, the queues, readiness, the central SUB's
//! connections), plus the restored snapshot records and the recorder. Every part receives
//! only the handle it uses; this bundle exists for the snapshots (`persist/snapshot/`), which
//! fill the restored records and capture through the queues, and as what the apply workers'
//! narrow context is built from, once (`write::worker::context::WorkerContext::of`).

use std::sync::Arc;

use parking_lot::RwLock;

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
use crate::write::sources::connections::CentralConnections;

/// The handles the service's parts share.
pub struct Shared {
    pub index: IndexHandle,
    /// The pods' registry (written by the pods' lifecycle, read by the workers).
    pub registry: Arc<RwLock<Registry>>,
    pub queues: Arc<Queues>,
    pub readiness: Arc<Readiness>,
    pub central: Arc<CentralConnections>,
}

pub struct ServiceState {
    config: Config,
    shared: Shared,
    restored: Arc<Restored>,
    recorder: Option<Arc<Recorder>>,
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
        ServiceState { config, shared, restored: Arc::default(), recorder }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The handles the service's parts share.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    pub fn index(&self) -> &KvIndex {
        self.shared.index.index()
    }

    pub fn queues(&self) -> &Queues {
        &self.shared.queues
    }

    /// Snapshot records loaded at start and not yet picked up by their streams.
    pub fn restored(&self) -> &Restored {
        &self.restored
    }

    /// The restored records, for whoever hands them to the streams (the apply workers).
    pub fn restored_records(&self) -> Arc<Restored> {
        self.restored.clone()
    }

    /// The dump being recorded (`kvindex record`), if any.
    pub fn recorder(&self) -> Option<Arc<Recorder>> {
        self.recorder.clone()
    }
}
