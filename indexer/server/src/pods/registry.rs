//! The registry's data: the known pods (config file, `--pod`, pods file, discovery,
//! registration API) with where each came from, the topic-id → pod-id map and the replay
//! endpoints. Plain data behind the [`super::Pods`] handle's lock; what changes it (and starts
//! or stops dialers) is the pods' lifecycle in `pods/mod.rs`.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::config::pod::{offset_endpoint, PodConfig, ReplayEntry, TopicMapEntry};
use crate::shutdown::ShutdownSignal;

pub struct RegisteredPod {
    pub cfg: PodConfig,
    pub origin: &'static str,
    /// Stops the pod's dialers (per-pod mode).
    pub(super) stop: Option<ShutdownSignal>,
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
    /// The pod id of every rank of every pod → (the pod, whether it is dialled): a dialled
    /// pod's `dp_size` ranks, a central-mode pod's id.
    rank_ids: HashMap<String, (String, bool)>,
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
    /// The entry's engine (`None`: `default_engine`) and SGLang page size.
    pub engine: Option<&'static str>,
    pub page_size: Option<u32>,
    pub origin: &'static str,
    /// The SGLang release and event format the entry names (absent: the server's defaults).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sglang_release: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sglang_event_format: Option<&'static str>,
    /// The engine's cache-hit rules the entry declares: EAGLE drops a block from every hit,
    /// context parallelism multiplies the unit.
    pub eagle: bool,
    pub context_parallel: u32,
}

/// The pod ids of `cfg`'s ranks: a dialled pod's `dp_size` ranks (DP naming), a central-mode
/// pod's id (its ranks are named by its topic's messages).
fn rank_ids(cfg: &PodConfig) -> impl Iterator<Item = String> + '_ {
    let ranks = if cfg.endpoint.is_some() { cfg.dp_size } else { 1 };
    (0..ranks).map(|r| kvindex::wire::dp_pod_id(&cfg.id, Some(i64::from(r))))
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

    /// Recomputes the topic map after a change, and bumps the generation.
    pub(super) fn rebuild(&mut self) {
        let mut topics = self.static_topics.clone();
        for (id, p) in &self.pods {
            if let Some(t) = &p.cfg.topic_id {
                topics.entry(t.clone()).or_insert_with(|| id.clone());
            }
        }
        self.topics = topics;
        self.rank_ids = HashMap::new();
        for (id, p) in &self.pods {
            for rank_id in rank_ids(&p.cfg) {
                self.rank_ids.entry(rank_id).or_insert_with(|| (id.clone(), p.cfg.endpoint.is_some()));
            }
        }
        self.generation += 1;
    }

    /// The registered pod one of whose ranks is named `pod`, and whether it is dialled.
    pub fn pod_of_rank_id(&self, pod: &str) -> Option<(String, bool)> {
        self.rank_ids.get(pod).cloned()
    }

    /// Why `cfg` cannot be registered beside the other pods, if it cannot: one of its ranks
    /// would be named as one of another pod's (vLLM at `h:8000` with two DP ranks names its
    /// rank 1 `h:8001`, which another engine at `h:8001` names too), and two engines would feed
    /// one pod.
    pub fn rank_id_collision(&self, cfg: &PodConfig) -> Option<String> {
        rank_ids(cfg).enumerate().find_map(|(rank, rank_id)| {
            let (other, _) = self.rank_ids.get(&rank_id).filter(|(other, _)| *other != cfg.id)?;
            let whose = if rank == 0 { "its id".to_string() } else { format!("its DP rank {rank}'s pod id") };
            Some(format!(
                "pod {:?}: {whose} {rank_id:?} is already a pod id of registered pod {other:?} (DP rank r of \
                 a pod at host:port is named host:port+r): two engines would feed one pod; give one of them \
                 another id (or port), or unregister {other:?} first",
                cfg.id
            ))
        })
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
                engine: p.cfg.engine.map(|e| e.as_str()),
                page_size: p.cfg.page_size,
                origin: p.origin,
                sglang_release: p.cfg.sglang_release.map(|r| r.to_string()),
                sglang_event_format: p.cfg.sglang_event_format.map(|f| f.as_str()),
                eagle: p.cfg.eagle,
                context_parallel: p.cfg.context_parallel,
            })
            .collect()
    }

    /// Where a registered pod came from (config, pods_file, discovery, grpc, http).
    /// The engine `pod`'s entry names, if it is registered and names one.
    pub fn engine_of(&self, pod: &str) -> Option<kvindex::wire::Engine> {
        self.pods.get(pod).and_then(|p| p.cfg.engine)
    }

    pub fn origin_of(&self, pod: &str) -> Option<&'static str> {
        self.pods.get(pod).map(|p| p.origin)
    }

    /// The registered pod `pod`.
    pub fn get(&self, pod: &str) -> Option<&RegisteredPod> {
        self.pods.get(pod)
    }

    pub(super) fn get_mut(&mut self, pod: &str) -> Option<&mut RegisteredPod> {
        self.pods.get_mut(pod)
    }

    pub(super) fn insert(&mut self, pod: RegisteredPod) {
        self.pods.insert(pod.cfg.id.clone(), pod);
    }

    pub(super) fn remove(&mut self, pod: &str) -> Option<RegisteredPod> {
        self.pods.remove(pod)
    }

    pub(super) fn ids_with_origin(&self, origin: &str) -> Vec<String> {
        self.pods.iter().filter(|(_, p)| p.origin == origin).map(|(id, _)| id.clone()).collect()
    }

    /// Stops every per-pod dialer (the server is shutting down).
    pub(super) fn stop_dialers(&mut self) {
        for pod in self.pods.values_mut() {
            if let Some(stop) = pod.stop.take() {
                stop.trigger();
            }
        }
    }
}
