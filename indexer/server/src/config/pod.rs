//! Pods and the entries that name them: `[[pods]]` (config file, pods file, registration API,
//! `--pod`), `[[topic_map]]`, `[[replay]]` and `[tier_weights]`, each with its flag syntax, and
//! the rules every ZeroMQ endpoint must follow.

use std::path::Path;

use kvindex::wire::Engine;
use serde::{Deserialize, Deserializer};

use super::error::{ConfigError, Origin};

/// A pod the indexer knows by configuration, the pods file or the registration API.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodConfig {
    /// Pod id as the router names the endpoint (e.g. `10.0.0.7:8000`).
    pub id: String,
    pub model: String,
    /// Engine PUB endpoint to dial (per-pod mode). Absent for central-mode pods.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Engine replay ROUTER endpoint.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Id in the topic `kv@<id>@<model>` when it differs from `id` (central mode).
    #[serde(default)]
    pub topic_id: Option<String>,
    /// Data-parallel ranks behind this pod (per-pod mode dials endpoint port + rank).
    #[serde(default = "one")]
    pub dp_size: u32,
    /// The engine family that publishes this pod's events (`vllm`, `sglang`, `trtllm`): its
    /// streams are decoded by that engine's rules. Absent: the server's `default_engine`.
    #[serde(default, deserialize_with = "engine_name")]
    pub engine: Option<Engine>,
    /// SGLang's `--page-size` for this pod (tokens per page; SGLang's default 1 when absent):
    /// which stores are whole pages, and how small pages make canonical blocks.
    #[serde(default)]
    pub page_size: Option<u32>,
}

/// Reads an engine by the name `kvindex decode --engine` takes.
pub fn engine_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Engine>, D::Error> {
    let name = String::deserialize(d)?;
    name.parse().map(Some).map_err(serde::de::Error::custom)
}

fn one() -> u32 {
    1
}

impl PodConfig {
    /// `--pod <pod-id>,<model>,<pub-endpoint>[,<replay-endpoint>][,engine=<engine>]`.
    pub fn from_flag(v: &str) -> Result<PodConfig, String> {
        let mut parts: Vec<&str> = v.split(',').collect();
        let mut engine = None;
        if let Some(name) = parts.last().and_then(|p| p.strip_prefix("engine=")) {
            engine = Some(name.parse::<Engine>().map_err(|e| e.to_string())?);
            parts.pop();
        }
        if !(3..=4).contains(&parts.len()) || parts.iter().any(|p| p.is_empty()) {
            return Err("expected <pod-id>,<model>,<pub-endpoint>[,<replay-endpoint>]".into());
        }
        Ok(PodConfig {
            id: parts[0].to_string(),
            model: parts[1].to_string(),
            endpoint: Some(parts[2].to_string()),
            replay_endpoint: parts.get(3).map(|s| s.to_string()),
            topic_id: None,
            dp_size: 1,
            engine,
            page_size: None,
        })
    }

    /// Checks one pod (from any origin; `key` is where it sits, e.g. `pods[0]`) and normalizes
    /// its endpoints.
    pub fn validate(mut self, key: &str, origin: &Origin) -> Result<PodConfig, ConfigError> {
        let err = |field: &str, message: String| ConfigError::new(format!("{key}.{field}"), origin.clone(), message);
        if self.id.is_empty() {
            return Err(err("id", "must not be empty".into()));
        }
        if self.model.is_empty() {
            return Err(err("model", "must not be empty".into()));
        }
        for (field, value) in
            [("id", Some(&self.id)), ("model", Some(&self.model)), ("topic_id", self.topic_id.as_ref())]
        {
            if let Some(v) = value {
                name(v).map_err(|m| err(field, m))?;
            }
        }
        if let Some(e) = &self.endpoint {
            self.endpoint = Some(endpoint(e).map_err(|m| err("endpoint", m))?);
        }
        if let Some(e) = &self.replay_endpoint {
            self.replay_endpoint = Some(endpoint(e).map_err(|m| err("replay_endpoint", m))?);
        }
        if self.topic_id.as_deref() == Some("") {
            self.topic_id = None;
        }
        if self.page_size.is_some_and(|p| !(1..=MAX_PAGE_SIZE).contains(&p)) {
            return Err(err("page_size", format!("must be between 1 and {MAX_PAGE_SIZE}")));
        }
        if !(1..=MAX_DP_SIZE).contains(&self.dp_size) {
            return Err(err("dp_size", format!("must be between 1 and {MAX_DP_SIZE}, got {}", self.dp_size)));
        }
        if let (Some(pub_ep), Some(replay)) = (&self.endpoint, &self.replay_endpoint) {
            if let Some((p, q)) = rank_ports_overlap(pub_ep, replay, self.dp_size) {
                let n = self.dp_size;
                return Err(err(
                    "replay_endpoint",
                    format!(
                        "PUB port {p} and replay port {q} on one host are less than dp_size = {n} apart: every rank offsets both by its rank, so one rank's PUB would be another's replay ROUTER (give ports at least {n} apart, e.g. PUB 5557 and replay 6557)"
                    ),
                ));
            }
        }
        Ok(self)
    }
}

/// The PUB and replay ports of `tcp://` endpoints on the same host when the ranks' ports
/// collide: rank r uses port + r for both (vLLM's and SGLang's `offset_endpoint_port`), so
/// `dp_size` ranks need the two ports at least `dp_size` apart (with the usual `replay = pub +
/// 1`, rank 1's PUB is rank 0's replay ROUTER, which SGLang's rank 1 fails to bind).
fn rank_ports_overlap(pub_ep: &str, replay: &str, dp_size: u32) -> Option<(u32, u32)> {
    let split = |e: &str| -> Option<(String, u32)> {
        let (head, port) = e.strip_prefix("tcp://")?.rsplit_once(':')?;
        Some((head.to_string(), port.parse().ok().filter(|&p| p != 0)?))
    };
    let ((pub_host, p), (replay_host, q)) = (split(pub_ep)?, split(replay)?);
    (pub_host == replay_host && p.abs_diff(q) < dp_size).then_some((p, q))
}

/// Largest SGLang page size accepted (its `--page-size`; the index's block is at most this too).
pub const MAX_PAGE_SIZE: u32 = 65_536;

/// Most data-parallel ranks behind one pod: each one is a dialer (per-pod mode) and a stream.
pub const MAX_DP_SIZE: u32 = 128;

/// Longest pod id, model name or topic id, in bytes (vLLM's are host:port and a model path).
pub const MAX_NAME_LEN: usize = 256;

/// Checks a peer- or operator-supplied name: bounded, no control characters (a newline or an
/// ANSI escape in a pod id would forge log lines and metric labels).
pub fn name(v: &str) -> Result<(), String> {
    if v.len() > MAX_NAME_LEN {
        return Err(format!("must be at most {MAX_NAME_LEN} bytes, got {}", v.len()));
    }
    if v.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// `[[topic_map]]`: the `<id>` of topic `kv@<id>@<model>` → the pod id scores use.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicMapEntry {
    pub topic_id: String,
    pub pod: String,
}

impl TopicMapEntry {
    /// `--topic-map <topic-id>=<pod>`.
    pub fn from_flag(v: &str) -> Result<Self, String> {
        let (topic_id, pod) = pair(v)?;
        Ok(TopicMapEntry { topic_id, pod })
    }
}

/// `[[replay]]`: the replay ROUTER of a central-mode pod.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayEntry {
    pub pod: String,
    pub endpoint: String,
}

impl ReplayEntry {
    /// `--replay <pod>=<endpoint>`.
    pub fn from_flag(v: &str) -> Result<Self, String> {
        let (pod, endpoint) = pair(v)?;
        Ok(ReplayEntry { pod, endpoint })
    }
}

/// One entry of `[tier_weights]`: the weight of a block held in tier `medium`.
#[derive(Debug, Clone, PartialEq)]
pub struct TierWeight {
    pub medium: String,
    pub weight: f64,
}

impl TierWeight {
    /// `--tier-weight <medium>=<weight>`.
    pub fn from_flag(v: &str) -> Result<Self, String> {
        let (medium, weight) = pair(v)?;
        let weight = weight.parse().map_err(|_| format!("weight is not a number: {weight:?}"))?;
        Ok(TierWeight { medium, weight })
    }

    /// The file's `[tier_weights]` table (`MEDIUM = weight`), in key order.
    pub(super) fn table<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<TierWeight>, D::Error> {
        let table = std::collections::BTreeMap::<String, f64>::deserialize(d)?;
        Ok(table.into_iter().map(|(medium, weight)| TierWeight { medium, weight }).collect())
    }
}

/// `<a>=<b>`, both non-empty.
pub fn pair(v: &str) -> Result<(String, String), String> {
    match v.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
        _ => Err("expected <a>=<b>".into()),
    }
}

/// Checks a ZeroMQ endpoint (`tcp://host:port` or `ipc://path`, as the ZeroMQ stack parses
/// them) and rewrites `tcp://*:p` to `tcp://0.0.0.0:p` (`*` is ZeroMQ's "every interface").
pub fn endpoint(v: &str) -> Result<String, String> {
    match kvindex_zmtp::Endpoint::parse(v) {
        Ok(kvindex_zmtp::Endpoint::Tcp { host, port }) => {
            let host = if host == "*" { "0.0.0.0" } else { host.as_str() };
            Ok(format!("tcp://{host}:{port}"))
        }
        Ok(kvindex_zmtp::Endpoint::Ipc(_)) => Ok(v.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// vLLM's `offset_endpoint_port`: a tcp endpoint's port + rank (port 0 stays 0).
pub fn offset_endpoint(ep: &str, rank: u32) -> String {
    if rank == 0 {
        return ep.to_string();
    }
    if let Some((head, port)) = ep.rsplit_once(':') {
        if let Ok(p) = port.parse::<u32>() {
            if p != 0 && p + rank <= 65535 {
                return format!("{head}:{}", p + rank);
            }
        }
    }
    ep.to_string()
}

/// The watched pods file: `[[pods]]` entries only.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodsFile {
    #[serde(default)]
    pods: Vec<PodConfig>,
}

/// Parses and checks the watched pods file at `path`.
pub fn parse_pods_file(path: &Path, text: &str) -> Result<Vec<PodConfig>, ConfigError> {
    let origin = Origin::File(path.to_path_buf());
    let file: PodsFile = toml::from_str(text).map_err(|e| ConfigError::new("pods", origin.clone(), e.to_string()))?;
    file.pods.into_iter().enumerate().map(|(n, p)| p.validate(&format!("pods[{n}]"), &origin)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(offset_endpoint("tcp://10.0.0.7:5557", 2), "tcp://10.0.0.7:5559");
        assert_eq!(offset_endpoint("tcp://10.0.0.7:0", 2), "tcp://10.0.0.7:0");
        assert_eq!(endpoint("tcp://*:5557").unwrap(), "tcp://0.0.0.0:5557");
        assert!(endpoint("udp://x:1").is_err());
        assert!(endpoint("tcp://:1").is_err());
        let p = PodConfig::from_flag("10.0.0.7:8000,Qwen/Qwen3,tcp://10.0.0.7:5557,tcp://10.0.0.7:5558").unwrap();
        assert_eq!(p.replay_endpoint.as_deref(), Some("tcp://10.0.0.7:5558"));
        assert!(PodConfig::from_flag("a,m").is_err());
        let p = PodConfig::from_flag("a,m,tcp://h:1,engine=sglang").unwrap();
        assert_eq!((p.engine, p.replay_endpoint), (Some(Engine::Sglang), None));
        assert!(PodConfig::from_flag("a,m,tcp://h:1,engine=tgi").is_err());
    }

    #[test]
    fn dp_ranks_ports_must_not_collide() {
        let pod = |pub_port: u32, replay_port: u32, dp_size: u32| {
            let flag = format!("a,m,tcp://10.0.0.7:{pub_port},tcp://10.0.0.7:{replay_port}");
            PodConfig { dp_size, ..PodConfig::from_flag(&flag).unwrap() }.validate("pods[0]", &Origin::Request("http"))
        };
        assert!(pod(5557, 5558, 1).is_ok(), "one rank: replay = pub + 1 is SGLang's and vLLM's usual pair");
        let e = pod(5557, 5558, 2).unwrap_err();
        assert_eq!(e.key, "pods[0].replay_endpoint");
        assert!(e.to_string().contains("PUB port 5557 and replay port 5558"), "{e}");
        assert!(pod(5558, 5557, 2).is_err());
        assert!(pod(5557, 5557, 1).is_err(), "one port cannot be both");
        assert!(pod(5557, 5559, 2).is_ok());
        assert!(pod(5557, 6557, 128).is_ok());
        let other_host =
            PodConfig { dp_size: 2, ..PodConfig::from_flag("a,m,tcp://10.0.0.7:5557,tcp://10.0.0.8:5558").unwrap() };
        assert!(other_host.validate("pods[0]", &Origin::Request("http")).is_ok());
    }

    #[test]
    fn pod_errors_name_the_field_and_origin() {
        let p = PodConfig { dp_size: 0, ..PodConfig::from_flag("a,m,tcp://h:1").unwrap() };
        let e = p.validate("pods[2]", &Origin::Request("http")).unwrap_err();
        assert_eq!((e.key.as_str(), e.origin), ("pods[2].dp_size", Origin::Request("http")));
        let e = parse_pods_file(Path::new("/p.toml"), "[[pods]]\nid = \"a\"\nmodel = \"\"\n").unwrap_err();
        assert_eq!(e.to_string(), "config error: pods[0].model (file /p.toml): must not be empty");
    }
}
