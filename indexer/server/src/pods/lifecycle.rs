//! The [`Pods`] handle and the pods' lifecycle: a registration starts the pod's dialers and
//! its start-up syncs, a re-registration that moves the pod (or names another engine or page
//! size) restarts them and clears what it held, an unregistration stops them and clears everything the pod held. Whatever declares a
//! pod (the configuration, the pods file, discovery, the API) goes through here.

use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard};

use crate::config::error::{ConfigError, ValueOrigin};
use crate::config::pod::{offset_endpoint, PodConfig};
use crate::protocols::{StreamKey, Work};
use crate::queue::Queues;
use crate::readiness::Readiness;
use crate::shutdown::{Shutdown, ShutdownSignal};
use crate::telemetry as m;
use crate::write::sources::Dialer;

use super::precedence;
use super::registry::{RegisteredPod, Registry};

/// An API change refused by the precedence rule: the pod is the operator's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod:?} is configured by the operator ({origin}); the API cannot replace or remove it")]
pub struct OperatorPod {
    pub pod: String,
    /// Who configured it (config, pods_file, discovery).
    pub origin: &'static str,
}

/// The handle on the pods: cheap to clone, shared by every part that registers or reads them.
#[derive(Clone)]
pub struct Pods {
    inner: Arc<Inner>,
}

struct Inner {
    /// Shared with the apply workers, which only read it (`Pods::shared_registry`).
    registry: Arc<RwLock<Registry>>,
    queues: Arc<Queues>,
    readiness: Arc<Readiness>,
    dialer: Dialer,
    /// The index's canonical block (a pod's `page_size` must tile it).
    block_size: usize,
}

impl Pods {
    /// The handle on `registry`, whose registrations hand their work to `queues` and dial
    /// with `dialer`.
    pub(super) fn from_parts(
        registry: Registry,
        dialer: Dialer,
        queues: Arc<Queues>,
        readiness: Arc<Readiness>,
        block_size: usize,
    ) -> Pods {
        Pods {
            inner: Arc::new(Inner { registry: Arc::new(RwLock::new(registry)), queues, readiness, dialer, block_size }),
        }
    }

    /// The registry, read.
    pub fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.inner.registry.read()
    }

    /// The registry itself, for the apply workers: they read it, and need nothing else of
    /// the pods.
    pub fn shared_registry(&self) -> Arc<RwLock<Registry>> {
        self.inner.registry.clone()
    }

    pub(crate) fn readiness(&self) -> &Readiness {
        &self.inner.readiness
    }

    /// Refuses an API change to a pod the operator configured (config file, `--pod`, pods
    /// file, Kubernetes discovery): the precedence rule, for `api` (`http`, `grpc`).
    pub fn may_change(&self, api: &'static str, pod: &str) -> Result<(), OperatorPod> {
        let origin = self.registry().origin_of(pod);
        if precedence::may_replace(api, origin) {
            return Ok(());
        }
        let origin = origin.unwrap_or_default();
        metrics::counter!(m::CONTROL_DENIED, "api" => api, "reason" => "operator_pod").increment(1);
        tracing::warn!(api, pod = %crate::write::transport::escape(pod), origin, "API change to an operator-configured pod refused");
        Err(OperatorPod { pod: pod.to_string(), origin })
    }

    /// Adds or replaces a pod. A changed endpoint, model, DP size, engine, page size, EAGLE or
    /// context parallelism restarts its dialer and clears it.
    /// `origin` (config, pods_file, discovery, grpc, http) labels metrics and logs.
    pub async fn register(&self, cfg: PodConfig, origin: &'static str, startup: bool) -> Result<(), ConfigError> {
        let checked = cfg.validate("pod", &ValueOrigin::Request(origin)).and_then(|c| {
            c.check_page_size(self.inner.block_size)
                .map_err(|m| ConfigError::new("pod.page_size", ValueOrigin::Request(origin), m))?;
            Ok(c)
        });
        let cfg = match checked {
            Ok(c) => c,
            Err(e) => {
                metrics::counter!(m::CONFIG_ERRORS, "source" => origin).increment(1);
                return Err(e);
            }
        };
        let old = {
            let mut reg = self.inner.registry.write();
            if let Some(message) = reg.rank_id_collision(&cfg) {
                metrics::counter!(m::CONFIG_ERRORS, "source" => origin).increment(1);
                return Err(ConfigError::new("pod.id", ValueOrigin::Request(origin), message));
            }
            if let Some(existing) = reg.get_mut(&cfg.id) {
                // The engine and its page size decide how the stream is read and keyed: a change
                // restarts the dialers and clears what was keyed by the old rules.
                // So do the rules of its cache hits (EAGLE, context parallelism): an engine takes
                // them at start, so the blocks the index holds were cached under the old ones.
                let same_source = existing.cfg.endpoint == cfg.endpoint
                    && existing.cfg.model == cfg.model
                    && existing.cfg.dp_size == cfg.dp_size
                    && existing.cfg.engine == cfg.engine
                    && existing.cfg.page_size == cfg.page_size
                    && existing.cfg.rules() == cfg.rules();
                if same_source {
                    existing.cfg = cfg.clone();
                    existing.origin = origin;
                    reg.rebuild(); // also bumps the generation: the replay endpoint may have changed
                    metrics::counter!(m::REGISTRATIONS, "op" => "update", "origin" => origin).increment(1);
                    tracing::info!(pod = %cfg.id, origin, "pod registration updated");
                    return Ok(());
                }
            }
            reg.remove(&cfg.id)
        };
        if let Some(old) = old {
            if let Some(stop) = old.stop {
                stop.trigger();
            }
            self.remove_everywhere(&cfg.id).await;
        }
        let stop = cfg.endpoint.as_ref().map(|_| ShutdownSignal::new());
        let dialers: Option<Shutdown> = {
            let mut reg = self.inner.registry.write();
            let (signal, handle) = stop.unzip();
            reg.insert(RegisteredPod { cfg: cfg.clone(), origin, stop: signal });
            reg.rebuild();
            handle
        };
        metrics::counter!(m::REGISTRATIONS, "op" => "register", "origin" => origin).increment(1);
        tracing::info!(pod = %cfg.id, model = %cfg.model, endpoint = ?cfg.endpoint, replay = ?cfg.replay_endpoint, topic_id = ?cfg.topic_id, origin, "pod registered");
        if let (Some(endpoint), Some(stop)) = (&cfg.endpoint, dialers) {
            let queues = &self.inner.queues;
            let id: Arc<str> = Arc::from(cfg.id.as_str());
            let model: Arc<str> = Arc::from(cfg.model.as_str());
            for rank in 0..cfg.dp_size {
                let ep: Arc<str> = Arc::from(offset_endpoint(endpoint, rank).as_str());
                if cfg.replay_endpoint.is_some() {
                    let stream = StreamKey { base: id.clone(), rank };
                    if startup {
                        self.readiness().sync_started();
                    }
                    let worker = queues.worker_for(id.as_bytes());
                    let sync = Work::InitialSync { stream, model: model.clone(), endpoint: ep.clone(), startup };
                    queues.send(worker, sync).await;
                }
                tokio::spawn(self.inner.dialer.clone().dial(id.clone(), model.clone(), ep, cfg.engine, stop.clone()));
            }
        }
        Ok(())
    }

    /// Removes a pod: stops its dialer, drops its streams and everything it holds.
    pub async fn unregister(&self, pod: &str, origin: &'static str) -> bool {
        let old = {
            let mut reg = self.inner.registry.write();
            let old = reg.remove(pod);
            reg.rebuild();
            old
        };
        let registered = old.is_some();
        if let Some(stop) = old.and_then(|o| o.stop) {
            stop.trigger();
        }
        let held = self.remove_everywhere(pod).await;
        metrics::counter!(m::REGISTRATIONS, "op" => "unregister", "origin" => origin).increment(1);
        tracing::info!(pod, origin, registered, held, "pod unregistered and cleared");
        registered || held
    }

    async fn remove_everywhere(&self, pod: &str) -> bool {
        let queues = &self.inner.queues;
        let mut any = false;
        for worker in 0..queues.workers() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            queues.send(worker, Work::RemovePod { pod: pod.to_string(), done: tx }).await;
            any |= rx.await.unwrap_or(false);
        }
        any
    }

    /// Stops every per-pod dialer (the server is shutting down).
    pub fn stop_dialers(&self) {
        self.inner.registry.write().stop_dialers();
    }
}
