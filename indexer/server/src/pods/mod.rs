//! The pods' home: which pods exist, who declared each, and their lifecycle. A pod is declared
//! by the operator (config file and `--pod` at start, the watched [`file`]), by Kubernetes
//! [`discovery`], or through the registration API, whose calls pass the control plane's gate
//! ([`auth`], with the operator's admin token); when two declare the same pod id, the
//! [`precedence`] rule decides. The data is the [`registry`]; the [`Pods`] handle
//! ([`lifecycle`]) is what changes it.
//!
//! The server walks its configuration into this module once ([`PodsConfig::of`]), makes the
//! handle ([`Pods::new`]) and starts what declares pods ([`Pods::start`]); the handle goes to
//! whoever registers or reads pods (the APIs, the apply workers). Those two are here, not in
//! `lifecycle.rs`, because they name the declaring parts (file, discovery), which name the
//! handle: written there, the parts and the handle would import each other.

pub mod auth;
pub mod discovery;
pub mod file;
pub mod lifecycle;
pub mod precedence;
pub mod registry;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::config::pod::{PodConfig, ReplayEntry, TopicMapEntry};
use crate::config::Config;
use crate::queue::Queues;
use crate::readiness::Readiness;
use crate::shutdown::ShutdownSignal;
use crate::write::sources::Dialer;

pub use self::lifecycle::Pods;
use self::registry::Registry;

/// Everything of the configuration that is about pods, read from it once.
#[derive(Debug, Clone)]
pub struct PodsConfig {
    /// `[[pods]]` / `--pod`: registered at start with origin `config`.
    pub pods: Vec<PodConfig>,
    pub topic_map: Vec<TopicMapEntry>,
    pub replay: Vec<ReplayEntry>,
    /// The watched pods file, and how often it is checked.
    pub pods_file: Option<PathBuf>,
    pub pods_file_poll: Duration,
    /// Kubernetes discovery, when on.
    pub discovery: Option<kvindex_discovery::WatchConfig>,
    /// Central mode (`zmq_bind`): engines dial us, so discovered pods are not dialled.
    pub central: bool,
    /// The dialled pods' subscription and socket bounds.
    pub topic_filter: String,
    /// The engine of a pod whose entry names none (an SGLang pod is subscribed to every topic).
    pub default_engine: kvindex::wire::Engine,
    pub zmq_limits: kvindex_zmtp::Limits,
    /// The index's canonical block: a registered `page_size` must tile it.
    pub block_size: usize,
}

impl PodsConfig {
    pub fn of(config: &Config) -> PodsConfig {
        PodsConfig {
            pods: config.pods.clone(),
            topic_map: config.topic_map.clone(),
            replay: config.replay.clone(),
            pods_file: config.pods_file.clone(),
            pods_file_poll: Duration::from_millis(config.pods_file_poll_ms),
            discovery: config.discovery.clone(),
            central: config.zmq_bind.is_some(),
            topic_filter: config.topic_filter.clone(),
            default_engine: config.default_engine,
            zmq_limits: config.zmq_limits.clone(),
            block_size: config.block_size,
        }
    }
}

impl Pods {
    /// The registry of `config`'s topic map and replay entries, empty of pods (they come with
    /// [`start`](Pods::start)); registrations hand their work to `queues`.
    pub fn new(config: &PodsConfig, queues: Arc<Queues>, readiness: Arc<Readiness>) -> Pods {
        let dialer =
            Dialer::new(queues.clone(), config.topic_filter.clone(), config.default_engine, config.zmq_limits.clone());
        let registry = Registry::new(&config.topic_map, &config.replay);
        Pods::from_parts(registry, dialer, queues, readiness, config.block_size)
    }

    /// Registers the configured pods, then starts the pods file watcher (returning once its
    /// first content is registered) and discovery; the tasks run until `shutdown`.
    pub async fn start(
        &self,
        config: PodsConfig,
        discovery: Option<kvindex_discovery::Client>,
        shutdown: &ShutdownSignal,
    ) -> Vec<JoinHandle<()>> {
        for pod in config.pods {
            if let Err(e) = self.register(pod, "config", true).await {
                tracing::error!(error = %e, "configured pod rejected");
            }
        }
        let mut tasks = Vec::new();
        if let Some(path) = config.pods_file {
            let (loaded, first_load) = tokio::sync::oneshot::channel();
            let watch = file::watch(self.clone(), path, config.pods_file_poll, loaded, shutdown.subscribe());
            tasks.push(tokio::spawn(watch));
            let _ = first_load.await;
        }
        if let (Some(client), Some(watch)) = (discovery, config.discovery) {
            let run = discovery::run(self.clone(), client, watch, config.central, shutdown.subscribe());
            tasks.push(tokio::spawn(run));
        }
        tasks
    }
}
