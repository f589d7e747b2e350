//! Pods and the entries that name them: `[[pods]]` (config file, pods file, registration API,
//! `--pod`), `[[topic_map]]`, `[[replay]]` and `[tier_weights]`, each with its flag syntax, and
//! the rules every ZeroMQ endpoint must follow.

use std::fmt::Display;
use std::path::Path;
use std::str::FromStr;

use kvindex::sglang::{EventFormat, SglangRelease};
use kvindex::wire::Engine;
use serde::{Deserialize, Deserializer};

use super::error::{ConfigError, ValueOrigin};

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
    /// The SGLang release this pod runs (`0.5.23`), whose rules the sampled page-hash
    /// cross-check follows. Absent: the server's `sglang_release`. SGLang pods only.
    #[serde(default, deserialize_with = "parsed")]
    pub sglang_release: Option<SglangRelease>,
    /// This pod's `kv_events_config.format` (`default`, `dynamo`), for the same check. Absent:
    /// the server's `sglang_event_format`. SGLang pods only.
    #[serde(default, deserialize_with = "parsed")]
    pub sglang_event_format: Option<EventFormat>,
    /// The engine runs EAGLE/MTP speculative decoding: it drops the last block of every cache
    /// hit, so this pod is credited one engine block less.
    #[serde(default)]
    pub eagle: bool,
    /// The engine's context-parallel world size (vLLM's decode times prefill context
    /// parallelism): its cache hits come in blocks that many times its block size.
    #[serde(default = "one")]
    pub context_parallel: u32,
}

/// Reads a value by its `FromStr` (an SGLang release, an event format).
pub fn parsed<'de, D: Deserializer<'de>, T: FromStr<Err: Display>>(d: D) -> Result<Option<T>, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map(Some).map_err(serde::de::Error::custom)
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
    /// `--pod <pod-id>,<model>,<pub-endpoint>[,<replay-endpoint>][,<option>=<value>]...`, the
    /// options being `engine`, `page_size`, `sglang_release`, `sglang_event_format`, `eagle`
    /// and `context_parallel`.
    pub fn from_flag(v: &str) -> Result<PodConfig, String> {
        let mut parts: Vec<&str> = v.split(',').collect();
        let mut pod = PodConfig {
            id: String::new(),
            model: String::new(),
            endpoint: None,
            replay_endpoint: None,
            topic_id: None,
            dp_size: 1,
            engine: None,
            page_size: None,
            sglang_release: None,
            sglang_event_format: None,
            eagle: false,
            context_parallel: 1,
        };
        // Options follow the endpoints (which never hold a `=`), in any order.
        while let Some((key, value)) = parts.last().and_then(|p| p.split_once('=')) {
            let bad = |e: &dyn Display| format!("{key}: {e}");
            match key {
                "engine" => pod.engine = Some(value.parse::<Engine>().map_err(|e| bad(&e))?),
                "page_size" => pod.page_size = Some(value.parse::<u32>().map_err(|e| bad(&e))?),
                "sglang_release" => {
                    pod.sglang_release = Some(value.parse().map_err(|e: kvindex::sglang::release::BadRelease| bad(&e))?)
                }
                "sglang_event_format" => pod.sglang_event_format = Some(value.parse().map_err(|e: String| bad(&e))?),
                "eagle" => pod.eagle = value.parse().map_err(|e| bad(&e))?,
                "context_parallel" => pod.context_parallel = value.parse().map_err(|e| bad(&e))?,
                _ => {
                    return Err(format!(
                        "unknown option {key:?} (expected engine, page_size, sglang_release, sglang_event_format, eagle or context_parallel)"
                    ))
                }
            }
            parts.pop();
        }
        if !(3..=4).contains(&parts.len()) || parts.iter().any(|p| p.is_empty()) {
            return Err("expected <pod-id>,<model>,<pub-endpoint>[,<replay-endpoint>][,<option>=<value>]...".into());
        }
        pod.id = parts[0].to_string();
        pod.model = parts[1].to_string();
        pod.endpoint = Some(parts[2].to_string());
        pod.replay_endpoint = parts.get(3).map(|s| s.to_string());
        Ok(pod)
    }

    /// Checks one pod (from any origin; `key` is where it sits, e.g. `pods[0]`) and normalizes
    /// its endpoints.
    pub fn validate(mut self, key: &str, origin: &ValueOrigin) -> Result<PodConfig, ConfigError> {
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
        if let Some(engine) = self.engine.filter(|&e| e != Engine::Sglang) {
            for (field, set) in [
                ("sglang_release", self.sglang_release.is_some()),
                ("sglang_event_format", self.sglang_event_format.is_some()),
            ] {
                if set {
                    return Err(err(field, format!("is for engine = \"sglang\" pods, this one's engine is {engine}")));
                }
            }
        }
        if let Err(e) = self.rules().validate() {
            return Err(err("context_parallel", e.replace("context_parallel ", "")));
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

    /// What the operator declares about the engine's cache hits, for the index.
    pub fn rules(&self) -> kvindex::PodRules {
        kvindex::PodRules { eagle: self.eagle, context_parallel: self.context_parallel }
    }

    /// Checks the pod's page size against the index's canonical block (`block_size` tokens):
    /// pages smaller than a block must divide it (they are rewritten into blocks), larger ones
    /// must be a multiple of it (each spans whole blocks). Anything else could never be keyed.
    pub fn check_page_size(&self, block_size: usize) -> Result<(), String> {
        let Some(page) = self.page_size.map(|p| p as usize) else { return Ok(()) };
        if page == 0 || block_size == 0 || (!page.is_multiple_of(block_size) && !block_size.is_multiple_of(page)) {
            return Err(format!("must divide block_size ({block_size}) or be a multiple of it, got {page}"));
        }
        Ok(())
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
    let origin = ValueOrigin::File(path.to_path_buf());
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
            PodConfig { dp_size, ..PodConfig::from_flag(&flag).unwrap() }
                .validate("pods[0]", &ValueOrigin::Request("http"))
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
        assert!(other_host.validate("pods[0]", &ValueOrigin::Request("http")).is_ok());
    }

    #[test]
    fn sglang_options_of_a_pod_flag_in_any_order() {
        let p = PodConfig::from_flag(
            "a,m,tcp://h:1,tcp://h:2,sglang_event_format=dynamo,engine=sglang,page_size=16,sglang_release=0.5.22",
        )
        .unwrap();
        assert_eq!(p.replay_endpoint.as_deref(), Some("tcp://h:2"));
        assert_eq!((p.engine, p.page_size), (Some(Engine::Sglang), Some(16)));
        assert_eq!(
            (p.sglang_release, p.sglang_event_format),
            (Some(SglangRelease::new(0, 5, 22)), Some(EventFormat::Dynamo))
        );
        assert!(PodConfig::from_flag("a,m,tcp://h:1,sglang_release=new").unwrap_err().starts_with("sglang_release:"));
        assert!(PodConfig::from_flag("a,m,tcp://h:1,sglang_event_format=x").unwrap_err().contains("unknown SGLang"));
        assert!(PodConfig::from_flag("a,m,tcp://h:1,colour=red").unwrap_err().contains("unknown option \"colour\""));
        // The release is SGLang's: refused on a pod that names another engine.
        let vllm = PodConfig::from_flag("a,m,tcp://h:1,engine=vllm,sglang_release=0.5.22").unwrap();
        let e = vllm.validate("pods[0]", &ValueOrigin::Request("grpc")).unwrap_err();
        assert_eq!(e.key, "pods[0].sglang_release");
        // Without an engine it may be the default engine's: accepted.
        assert!(PodConfig::from_flag("a,m,tcp://h:1,sglang_release=0.5.22")
            .unwrap()
            .validate("p", &ValueOrigin::Default)
            .is_ok());
        let text = "[[pods]]\nid = \"a\"\nmodel = \"m\"\nengine = \"sglang\"\nsglang_release = \"0.5.19\"\nsglang_event_format = \"default\"\n";
        let pods = parse_pods_file(Path::new("/p.toml"), text).unwrap();
        assert_eq!(pods[0].sglang_release, Some(SglangRelease::new(0, 5, 19)));
        let bad = text.replace("0.5.19", "latest");
        assert!(parse_pods_file(Path::new("/p.toml"), &bad).unwrap_err().to_string().contains("not an SGLang version"));
    }

    #[test]
    fn eagle_and_context_parallel_from_every_origin_and_checked() {
        let p = PodConfig::from_flag("a,m,tcp://h:1,eagle=true,context_parallel=4").unwrap();
        assert_eq!(p.rules(), kvindex::PodRules { eagle: true, context_parallel: 4 });
        assert_eq!(PodConfig::from_flag("a,m,tcp://h:1").unwrap().rules(), kvindex::PodRules::default());
        assert!(PodConfig::from_flag("a,m,tcp://h:1,eagle=yes").unwrap_err().starts_with("eagle:"));
        assert!(PodConfig::from_flag("a,m,tcp://h:1,context_parallel=x").unwrap_err().starts_with("context_parallel:"));
        for bad in [0, 65] {
            let p = PodConfig { context_parallel: bad, ..PodConfig::from_flag("a,m,tcp://h:1").unwrap() };
            let e = p.validate("pods[1]", &ValueOrigin::Request("grpc")).unwrap_err();
            assert_eq!(e.key, "pods[1].context_parallel");
            assert!(e.to_string().contains("must be between 1 and 64, got"), "{e}");
        }
        let text = "[[pods]]\nid = \"a\"\nmodel = \"m\"\neagle = true\ncontext_parallel = 2\n";
        let pods = parse_pods_file(Path::new("/p.toml"), text).unwrap();
        assert_eq!(pods[0].rules(), kvindex::PodRules { eagle: true, context_parallel: 2 });
        let bad = text.replace("context_parallel = 2", "context_parallel = 100");
        assert!(parse_pods_file(Path::new("/p.toml"), &bad)
            .unwrap_err()
            .to_string()
            .contains("pods[0].context_parallel"));
    }

    #[test]
    fn page_sizes_must_tile_the_canonical_block() {
        let with = |p: u32| PodConfig { page_size: Some(p), ..PodConfig::from_flag("a,m,tcp://h:1").unwrap() };
        for ok in [1, 2, 8, 16, 32, 64] {
            assert!(with(ok).check_page_size(16).is_ok(), "{ok}");
        }
        for bad in [0, 3, 24, 40] {
            assert!(with(bad).check_page_size(16).unwrap_err().contains("block_size (16)"), "{bad}");
        }
    }

    #[test]
    fn pod_errors_name_the_field_and_origin() {
        let p = PodConfig { dp_size: 0, ..PodConfig::from_flag("a,m,tcp://h:1").unwrap() };
        let e = p.validate("pods[2]", &ValueOrigin::Request("http")).unwrap_err();
        assert_eq!((e.key.as_str(), e.origin), ("pods[2].dp_size", ValueOrigin::Request("http")));
        let e = parse_pods_file(Path::new("/p.toml"), "[[pods]]\nid = \"a\"\nmodel = \"\"\n").unwrap_err();
        assert_eq!(e.to_string(), "config error: pods[0].model (file /p.toml): must not be empty");
    }
}
