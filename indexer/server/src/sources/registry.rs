//! The registry of sources: known pods (config file, watched pods file, registration API), the
//! topic-id → pod-id map, and replay endpoints. Registration starts per-pod dialers;
//! unregistration stops them and clears the pod.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use tokio::sync::watch;

use crate::apply::{StreamKey, Work};
use crate::config::pod::parse_pods_file;
use crate::config::{offset_endpoint, ConfigError, Origin, PodConfig, ReplayEntry, TopicMapEntry};
use crate::state::ServiceState;
use crate::telemetry as m;

pub struct RegisteredPod {
    pub cfg: PodConfig,
    pub origin: &'static str,
    stop: Option<tokio::sync::watch::Sender<bool>>,
}

#[derive(Default)]
pub struct Registry {
    pods: BTreeMap<String, RegisteredPod>,
    /// `[[topic_map]]` / `--topic-map`.
    static_topics: HashMap<String, String>,
    /// `[[replay]]` / `--replay`.
    static_replay: HashMap<String, String>,
    /// Effective topic id → pod id (static entries, then pods' `topic_id`).
    topics: HashMap<String, String>,
    /// Bumped on every change, so workers can cache what they derive from the registry.
    generation: u64,
}

/// One line of the topic mapping, for `/debug/sources`.
#[derive(Debug, Clone, Serialize)]
pub struct TopicMapping {
    pub topic_id: String,
    pub pod: String,
    pub from: &'static str,
}

/// A registered pod, for `/debug/sources`.
#[derive(Debug, Clone, Serialize)]
pub struct PodView {
    pub pod: String,
    pub model: String,
    pub endpoint: Option<String>,
    pub replay_endpoint: Option<String>,
    pub topic_id: Option<String>,
    pub dp_size: u32,
    pub origin: &'static str,
}

impl Registry {
    pub fn new(topic_map: &[TopicMapEntry], replay: &[ReplayEntry]) -> Self {
        let mut r = Registry {
            static_topics: topic_map.iter().map(|t| (t.topic_id.clone(), t.pod.clone())).collect(),
            static_replay: replay.iter().map(|r| (r.pod.clone(), r.endpoint.clone())).collect(),
            ..Default::default()
        };
        r.rebuild();
        r
    }

    fn rebuild(&mut self) {
        let mut topics = self.static_topics.clone();
        for (id, p) in &self.pods {
            if let Some(t) = &p.cfg.topic_id {
                topics.entry(t.clone()).or_insert_with(|| id.clone());
            }
        }
        self.topics = topics;
        self.generation += 1;
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The pod id a topic id stands for (identity unless mapped).
    pub fn pod_for_topic<'a>(&'a self, topic_id: &'a str) -> &'a str {
        self.topics.get(topic_id).map_or(topic_id, String::as_str)
    }

    /// The replay endpoint of rank `rank` of pod `base`: an entry for the DP pod id itself,
    /// else the base pod's endpoint offset by the rank (vLLM's port rule).
    pub fn replay_endpoint(&self, base: &str, rank: u32) -> Option<String> {
        if rank > 0 {
            let dp = kvindex::wire::dp_pod_id(base, Some(i64::from(rank)));
            if let Some(e) = self.static_replay.get(&dp) {
                return Some(e.clone());
            }
            if let Some(e) = self.pods.get(&dp).and_then(|p| p.cfg.replay_endpoint.clone()) {
                return Some(e);
            }
        }
        let e = self
            .pods
            .get(base)
            .and_then(|p| p.cfg.replay_endpoint.clone())
            .or_else(|| self.static_replay.get(base).cloned())?;
        Some(offset_endpoint(&e, rank))
    }

    pub fn topic_mappings(&self) -> Vec<TopicMapping> {
        let mut v: Vec<TopicMapping> = self
            .topics
            .iter()
            .map(|(t, p)| TopicMapping {
                topic_id: t.clone(),
                pod: p.clone(),
                from: if self.static_topics.contains_key(t) { "topic_map" } else { "pod.topic_id" },
            })
            .collect();
        v.sort_by(|a, b| a.topic_id.cmp(&b.topic_id));
        v
    }

    pub fn pods(&self) -> Vec<PodView> {
        self.pods
            .iter()
            .map(|(id, p)| PodView {
                pod: id.clone(),
                model: p.cfg.model.clone(),
                endpoint: p.cfg.endpoint.clone(),
                replay_endpoint: p.cfg.replay_endpoint.clone(),
                topic_id: p.cfg.topic_id.clone(),
                dp_size: p.cfg.dp_size,
                origin: p.origin,
            })
            .collect()
    }

    /// Where a registered pod came from (config, pods_file, grpc, http).
    pub fn origin_of(&self, pod: &str) -> Option<&'static str> {
        self.pods.get(pod).map(|p| p.origin)
    }

    fn ids_with_origin(&self, origin: &str) -> Vec<String> {
        self.pods.iter().filter(|(_, p)| p.origin == origin).map(|(id, _)| id.clone()).collect()
    }

    /// Stops every per-pod dialer (the server is shutting down).
    pub(crate) fn stop_dialers(&mut self) {
        for pod in self.pods.values_mut() {
            if let Some(stop) = pod.stop.take() {
                let _ = stop.send(true);
            }
        }
    }
}

/// Adds or replaces a pod. A changed endpoint or model restarts its dialer and clears it.
/// `origin` (config, pods_file, grpc, http) labels metrics and logs.
pub async fn register(
    state: &Arc<ServiceState>,
    cfg: PodConfig,
    origin: &'static str,
    startup: bool,
) -> Result<(), ConfigError> {
    let cfg = match cfg.validate("pod", &Origin::Request(origin)) {
        Ok(c) => c,
        Err(e) => {
            metrics::counter!(m::CONFIG_ERRORS, "source" => origin).increment(1);
            return Err(e);
        }
    };
    let old = {
        let mut reg = state.registry_mut();
        if let Some(existing) = reg.pods.get_mut(&cfg.id) {
            let same_source = existing.cfg.endpoint == cfg.endpoint
                && existing.cfg.model == cfg.model
                && existing.cfg.dp_size == cfg.dp_size;
            if same_source {
                existing.cfg = cfg.clone();
                existing.origin = origin;
                reg.rebuild(); // also bumps the generation: the replay endpoint may have changed
                metrics::counter!(m::REGISTRATIONS, "op" => "update", "origin" => origin).increment(1);
                tracing::info!(pod = %cfg.id, origin, "pod registration updated");
                return Ok(());
            }
        }
        reg.pods.remove(&cfg.id)
    };
    if let Some(old) = old {
        if let Some(stop) = old.stop {
            let _ = stop.send(true);
        }
        remove_everywhere(state, &cfg.id).await;
    }
    let stop = cfg.endpoint.as_ref().map(|_| watch::channel(false));
    {
        let mut reg = state.registry_mut();
        reg.pods.insert(
            cfg.id.clone(),
            RegisteredPod { cfg: cfg.clone(), origin, stop: stop.as_ref().map(|(tx, _)| tx.clone()) },
        );
        reg.rebuild();
    }
    metrics::counter!(m::REGISTRATIONS, "op" => "register", "origin" => origin).increment(1);
    tracing::info!(pod = %cfg.id, model = %cfg.model, endpoint = ?cfg.endpoint, replay = ?cfg.replay_endpoint, topic_id = ?cfg.topic_id, origin, "pod registered");
    if let (Some(endpoint), Some((_, rx))) = (&cfg.endpoint, stop) {
        let id: Arc<str> = Arc::from(cfg.id.as_str());
        let model: Arc<str> = Arc::from(cfg.model.as_str());
        for rank in 0..cfg.dp_size {
            let ep: Arc<str> = Arc::from(offset_endpoint(endpoint, rank).as_str());
            if cfg.replay_endpoint.is_some() {
                let stream = StreamKey { base: id.clone(), rank };
                if startup {
                    state.readiness().sync_started();
                }
                let worker = state.queues().worker_for(id.as_bytes());
                let sync = Work::InitialSync { stream, model: model.clone(), endpoint: ep.clone(), startup };
                state.queues().send(worker, sync).await;
            }
            tokio::spawn(super::dial_pod(state.clone(), id.clone(), model.clone(), ep, rx.clone()));
        }
    }
    Ok(())
}

/// Removes a pod: stops its dialer, drops its streams and everything it holds.
pub async fn unregister(state: &Arc<ServiceState>, pod: &str, origin: &'static str) -> bool {
    let old = {
        let mut reg = state.registry_mut();
        let old = reg.pods.remove(pod);
        reg.rebuild();
        old
    };
    let registered = old.is_some();
    if let Some(stop) = old.and_then(|o| o.stop) {
        let _ = stop.send(true);
    }
    let held = remove_everywhere(state, pod).await;
    metrics::counter!(m::REGISTRATIONS, "op" => "unregister", "origin" => origin).increment(1);
    tracing::info!(pod, origin, registered, held, "pod unregistered and cleared");
    registered || held
}

async fn remove_everywhere(state: &Arc<ServiceState>, pod: &str) -> bool {
    let mut any = false;
    for worker in 0..state.queues().workers() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        state.queues().send(worker, Work::RemovePod { pod: pod.to_string(), done: tx }).await;
        any |= rx.await.unwrap_or(false);
    }
    any
}

/// Registers the configured pods at start-up.
pub async fn register_static(state: &Arc<ServiceState>) {
    for p in state.config().pods.clone() {
        if let Err(e) = register(state, p, "config", true).await {
            tracing::error!(error = %e, "configured pod rejected");
        }
    }
}

/// Polls the pods file's mtime and applies its content on change: new and changed pods are
/// registered, pods that disappeared are unregistered. A bad file is counted and ignored
/// (the previous content stays in force). Runs until `stop` is set.
pub async fn watch_pods_file(
    state: Arc<ServiceState>,
    path: PathBuf,
    startup_done: tokio::sync::oneshot::Sender<()>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last: Option<(SystemTime, u64)> = None;
    let mut startup_done = Some(startup_done);
    let period = Duration::from_millis(state.config().pods_file_poll_ms);
    loop {
        let stamp = std::fs::metadata(&path).ok().map(|md| (md.modified().unwrap_or(SystemTime::UNIX_EPOCH), md.len()));
        if stamp != last {
            last = stamp;
            match std::fs::read_to_string(&path) {
                Ok(text) => match parse_pods_file(&path, &text) {
                    Ok(pods) => apply_pods_file(&state, pods, startup_done.is_some()).await,
                    Err(e) => {
                        metrics::counter!(m::CONFIG_ERRORS, "source" => "pods_file").increment(1);
                        tracing::error!(path = %path.display(), error = %e, "pods file rejected; previous content kept");
                    }
                },
                Err(e) => {
                    metrics::counter!(m::CONFIG_ERRORS, "source" => "pods_file").increment(1);
                    tracing::warn!(path = %path.display(), error = %e, "pods file unreadable");
                }
            }
        }
        if let Some(tx) = startup_done.take() {
            let _ = tx.send(());
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

async fn apply_pods_file(state: &Arc<ServiceState>, pods: Vec<PodConfig>, startup: bool) {
    let wanted: HashMap<String, PodConfig> = pods.into_iter().map(|p| (p.id.clone(), p)).collect();
    let current = state.registry().ids_with_origin("pods_file");
    for id in current {
        if !wanted.contains_key(&id) {
            unregister(state, &id, "pods_file").await;
        }
    }
    for (_, p) in wanted {
        let unchanged = state.registry().pods.get(&p.id).is_some_and(|r| r.cfg == p && r.origin == "pods_file");
        if !unchanged {
            if let Err(e) = register(state, p, "pods_file", startup).await {
                tracing::error!(error = %e, "pods file entry rejected");
            }
        }
    }
}
