//! Naming: which stream a live message belongs to. The topic names the pod in central mode
//! (through the registry's topic map, resolved once per registry generation and cached); a
//! dialled pod is named by its registration. A DP rank is a stream of its own, named after its
//! rank-0 pod by `dp_naming`; a topic id whose port is not spelled canonically, or that spells
//! a DP suffix itself, names none (it would name another stream's pod). Both drivers of the
//! stream table name streams here, so a replay offline names them as the service did.

use std::collections::HashMap;
use std::sync::Arc;

use kvindex::wire::{dp_pod_id, parse_topic, topic_id_refusal};

use super::fleet::Fleet;
use crate::config::pod;
use crate::protocols::{LiveSocket, StreamKey};

/// Longest topic accepted: `kv@` + an id and a model of [`pod::MAX_NAME_LEN`] each.
pub const MAX_TOPIC_LEN: usize = 2 * pod::MAX_NAME_LEN + 8;

/// Topics cached at most; the cache is emptied when full (a peer inventing topics cannot grow it).
const TOPIC_CACHE_MAX: usize = 100_000;

/// How a stream's messages reach us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Engines publish to our bound SUB; the topic names the pod.
    Central,
    /// We dial the pod's PUB.
    PerPod,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Central => "central",
            Mode::PerPod => "per-pod",
        }
    }
}

/// The stream a message names, before its DP rank is known.
#[derive(Debug, Clone)]
pub struct Name {
    /// Pod id of rank 0.
    pub base: Arc<str>,
    pub model: Arc<str>,
    pub mode: Mode,
    /// A dialled pod's endpoint.
    pub endpoint: Option<Arc<str>>,
}

/// Why a message names no stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unnamed {
    /// Not a message for us (`kvindex_decode_errors_total{reason}`).
    Undecodable { reason: &'static str, what: &'static str },
    /// A name we refuse to make a stream for (`kvindex_sources_refused_total{reason}`).
    Refused { reason: &'static str, why: &'static str },
}

/// Topics seen, resolved once per registry generation: (generation, pod, model).
type TopicCache = HashMap<Vec<u8>, (u64, Arc<str>, Arc<str>)>;

pub struct Naming {
    topics: TopicCache,
    /// Topic prefix accepted (the publisher filters for us; this is the local safety net).
    filter: String,
    /// `dp_naming = "topic"`: a central-mode topic already names the rank's own pod.
    dp_naming_topic: bool,
}

impl Naming {
    pub fn new(filter: String, dp_naming_topic: bool) -> Naming {
        Naming { topics: HashMap::new(), filter, dp_naming_topic }
    }

    /// The stream `topic` names for a message from `origin`.
    pub fn name(&mut self, fleet: &dyn Fleet, origin: &LiveSocket, topic: &[u8]) -> Result<Name, Unnamed> {
        // A dialled SGLang pod is named by its entry, and SGLang's topic is `""` by default.
        let any_topic =
            matches!(origin, LiveSocket::Pod { id, .. } if fleet.engine(id) == kvindex::wire::Engine::Sglang);
        if !any_topic && !topic.starts_with(self.filter.as_bytes()) {
            return Err(Unnamed::Undecodable { reason: "topic_filtered", what: "topic does not match the filter" });
        }
        if topic.len() > MAX_TOPIC_LEN {
            return Err(Unnamed::Refused { reason: "name", why: "topic too long" });
        }
        match origin {
            LiveSocket::Pod { id, model, endpoint } => Ok(Name {
                base: id.clone(),
                model: model.clone(),
                mode: Mode::PerPod,
                endpoint: Some(endpoint.clone()),
            }),
            LiveSocket::Central => {
                let (base, model) = self.central(fleet, topic)?;
                Ok(Name { base, model, mode: Mode::Central, endpoint: None })
            }
        }
    }

    fn central(&mut self, fleet: &dyn Fleet, topic: &[u8]) -> Result<(Arc<str>, Arc<str>), Unnamed> {
        let generation = fleet.generation();
        if let Some((g, base, model)) = self.topics.get(topic) {
            if *g == generation {
                return Ok((base.clone(), model.clone()));
            }
        }
        let Ok(text) = std::str::from_utf8(topic) else {
            return Err(Unnamed::Undecodable { reason: "topic_utf8", what: "topic is not UTF-8" });
        };
        let t = parse_topic(text);
        if t.id.is_empty() {
            return Err(Unnamed::Undecodable { reason: "topic_empty", what: "topic names no pod" });
        }
        if pod::name(t.id).is_err() || pod::name(t.model).is_err() {
            return Err(Unnamed::Refused {
                reason: "name",
                why: "topic id or model too long or with control characters",
            });
        }
        if let Some(why) = topic_id_refusal(t.id) {
            // Another spelling of a port, or a DP suffix, would name another stream's pod.
            return Err(Unnamed::Refused { reason: "name", why });
        }
        let base: Arc<str> = Arc::from(fleet.pod_for_topic(t.id));
        let model: Arc<str> = Arc::from(t.model);
        if self.topics.len() >= TOPIC_CACHE_MAX {
            self.topics.clear();
        }
        self.topics.insert(topic.to_vec(), (generation, base.clone(), model.clone()));
        Ok((base, model))
    }

    /// The pod id of `key`'s stream: its rank-0 pod for rank 0, else the rank's own pod by
    /// `dp_naming` (a central-mode topic may already name the rank's own pod: `topic` keeps it).
    pub fn pod_id(&self, mode: Mode, key: &StreamKey) -> Arc<str> {
        let offset = !(mode == Mode::Central && self.dp_naming_topic);
        let rank = (offset && key.rank > 0).then_some(i64::from(key.rank));
        Arc::from(dp_pod_id(&key.base, rank).as_str())
    }
}
