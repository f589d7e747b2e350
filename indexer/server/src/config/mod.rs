//! `kvindex serve` configuration: TOML file, then env vars and flags on top (flag > env > file >
//! default). Every key is documented in docs/CONFIG.md. Validation errors name the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use serde::Deserialize;

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
}

fn one() -> u32 {
    1
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicMapEntry {
    pub topic_id: String,
    pub pod: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayEntry {
    pub pod: String,
    pub endpoint: String,
}

/// The TOML file. Every field optional; defaults live in [`Config::default`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    grpc_addr: Option<String>,
    http_addr: Option<String>,
    block_size: Option<i64>,
    hash_seed: Option<String>,
    vllm_version: Option<String>,
    hash_algo: Option<String>,
    hash_check_every: Option<i64>,
    tokenizer_models_dir: Option<String>,
    tokenizer_endpoint: Option<String>,
    #[serde(default)]
    tokenizer_models: Vec<String>,
    dp_naming: Option<String>,
    zmq_bind: Option<String>,
    topic_filter: Option<String>,
    shards: Option<i64>,
    max_entries: Option<i64>,
    queue_capacity: Option<i64>,
    apply_workers: Option<i64>,
    stale_after_ms: Option<i64>,
    replay_timeout_ms: Option<i64>,
    replay_cooldown_ms: Option<i64>,
    max_concurrent_replays: Option<i64>,
    max_pending: Option<i64>,
    max_tokens: Option<i64>,
    max_message_bytes: Option<i64>,
    pods_file: Option<PathBuf>,
    pods_file_poll_ms: Option<i64>,
    #[serde(default)]
    tier_weights: BTreeMap<String, f64>,
    #[serde(default)]
    pods: Vec<PodConfig>,
    #[serde(default)]
    topic_map: Vec<TopicMapEntry>,
    #[serde(default)]
    replay: Vec<ReplayEntry>,
}

/// The watched pods file: `[[pods]]` entries only.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodsFile {
    #[serde(default)]
    pub pods: Vec<PodConfig>,
}

/// Flags (each also an env var). Unset flags fall back to the file, then to defaults.
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, env = "KVINDEX_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address (port 0 = any free port; the bound address is printed).
    #[arg(long, env = "KVINDEX_GRPC_ADDR")]
    pub grpc_addr: Option<String>,
    /// HTTP admin listen address.
    #[arg(long, env = "KVINDEX_HTTP_ADDR")]
    pub http_addr: Option<String>,
    /// Canonical block size of the index (engines must use a multiple of it).
    #[arg(long, env = "KVINDEX_BLOCK_SIZE")]
    pub block_size: Option<i64>,
    /// The engines' PYTHONHASHSEED (`unset` = not set), for the sampled cross-check of vLLM's
    /// own block hashes. Setting it turns the check on; matching never depends on it.
    #[arg(long, env = "KVINDEX_HASH_SEED")]
    pub hash_seed: Option<String>,
    /// vLLM release of the engines, for the hash cross-check's rules (default 0.33.0).
    #[arg(long, env = "KVINDEX_VLLM_VERSION")]
    pub vllm_version: Option<String>,
    /// The engines' `--prefix-caching-hash-algo` (default sha256_cbor).
    #[arg(long, env = "KVINDEX_HASH_ALGO")]
    pub hash_algo: Option<String>,
    /// Cross-check one in this many stores per pod (default 16; 0 = off).
    #[arg(long, env = "KVINDEX_HASH_CHECK_EVERY")]
    pub hash_check_every: Option<i64>,
    /// In-process tokenizer for llm-d's GetPodScores: `<model>=<dir>` (repeatable).
    #[arg(long = "tokenizer-model", value_name = "MODEL=DIR")]
    pub tokenizer_models: Vec<String>,
    /// In-process tokenizers: every subdirectory holding a tokenizer.json is a model.
    #[arg(long, env = "KVINDEX_TOKENIZER_MODELS_DIR")]
    pub tokenizer_models_dir: Option<String>,
    /// Remote tokenizer for GetPodScores (`http://host:port` of kvindex-tokenizer or llm-d's
    /// sidecar), used when no in-process tokenizer is configured.
    #[arg(long, env = "KVINDEX_TOKENIZER_ENDPOINT")]
    pub tokenizer_endpoint: Option<String>,
    /// Central mode: bind a SUB socket here (e.g. tcp://*:5557) that engines dial.
    #[arg(long, env = "KVINDEX_ZMQ_BIND")]
    pub zmq_bind: Option<String>,
    /// Per-pod mode: `<pod-id>,<model>,<pub-endpoint>[,<replay-endpoint>]` (repeatable).
    #[arg(long = "pod", value_name = "POD")]
    pub pods: Vec<String>,
    /// Replay endpoint of a central-mode pod: `<pod-id>=<replay-endpoint>` (repeatable).
    #[arg(long = "replay", value_name = "POD=ENDPOINT")]
    pub replay: Vec<String>,
    /// Topic id → pod id: `<topic-id>=<pod-id>` (repeatable; default identity).
    #[arg(long = "topic-map", value_name = "TOPIC_ID=POD")]
    pub topic_map: Vec<String>,
    /// How a central-mode DP rank's pod is named: `port-offset` (llm-d: `<addr>:<port+rank>`
    /// from the topic's id, for engines whose ranks share one topic) or `topic` (the topic's id
    /// already names the rank's pod).
    #[arg(long, env = "KVINDEX_DP_NAMING")]
    pub dp_naming: Option<String>,
    /// SUB subscription prefix.
    #[arg(long, env = "KVINDEX_TOPIC_FILTER")]
    pub topic_filter: Option<String>,
    #[arg(long, env = "KVINDEX_SHARDS")]
    pub shards: Option<i64>,
    #[arg(long, env = "KVINDEX_MAX_ENTRIES")]
    pub max_entries: Option<i64>,
    /// Bounded queue between the sockets and the apply workers (messages, per worker).
    #[arg(long, env = "KVINDEX_QUEUE_CAPACITY")]
    pub queue_capacity: Option<i64>,
    #[arg(long, env = "KVINDEX_APPLY_WORKERS")]
    pub apply_workers: Option<i64>,
    #[arg(long, env = "KVINDEX_STALE_AFTER_MS")]
    pub stale_after_ms: Option<i64>,
    #[arg(long, env = "KVINDEX_REPLAY_TIMEOUT_MS")]
    pub replay_timeout_ms: Option<i64>,
    #[arg(long, env = "KVINDEX_REPLAY_COOLDOWN_MS")]
    pub replay_cooldown_ms: Option<i64>,
    #[arg(long, env = "KVINDEX_MAX_CONCURRENT_REPLAYS")]
    pub max_concurrent_replays: Option<i64>,
    #[arg(long, env = "KVINDEX_MAX_PENDING")]
    pub max_pending: Option<i64>,
    /// Largest ScoreTokens prompt, in tokens.
    #[arg(long, env = "KVINDEX_MAX_TOKENS")]
    pub max_tokens: Option<i64>,
    /// Largest gRPC request, in bytes.
    #[arg(long, env = "KVINDEX_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<i64>,
    /// Watched file of `[[pods]]` (reloaded on change).
    #[arg(long, env = "KVINDEX_PODS_FILE")]
    pub pods_file: Option<PathBuf>,
    #[arg(long, env = "KVINDEX_PODS_FILE_POLL_MS")]
    pub pods_file_poll_ms: Option<i64>,
    /// Tier weight `<medium>=<weight>` (repeatable), e.g. `CPU=0.8`.
    #[arg(long = "tier-weight", value_name = "MEDIUM=WEIGHT")]
    pub tier_weights: Vec<String>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub block_size: usize,
    /// The sampled vLLM hash cross-check, when `hash_seed` is set.
    pub hash_check: Option<HashCheckConfig>,
    pub tokenizer_models: Vec<String>,
    pub tokenizer_models_dir: Option<String>,
    pub tokenizer_endpoint: Option<String>,
    /// Central mode: the topic id already names each DP rank's pod (`dp_naming = "topic"`).
    pub dp_naming_topic: bool,
    pub zmq_bind: Option<String>,
    pub topic_filter: String,
    pub shards: usize,
    pub max_entries: u64,
    pub queue_capacity: usize,
    pub apply_workers: usize,
    pub stale_after_ms: u64,
    pub replay_timeout_ms: u64,
    pub replay_cooldown_ms: u64,
    pub max_concurrent_replays: usize,
    pub max_pending: usize,
    pub max_tokens: usize,
    pub max_message_bytes: usize,
    pub pods_file: Option<PathBuf>,
    pub pods_file_poll_ms: u64,
    pub tier_weights: BTreeMap<String, f64>,
    pub pods: Vec<PodConfig>,
    pub topic_map: Vec<TopicMapEntry>,
    pub replay: Vec<ReplayEntry>,
}

/// What the engines run, for recomputing their block hashes.
#[derive(Debug, Clone)]
pub struct HashCheckConfig {
    pub hasher: kvindex::vllm_hash::VllmHashConfig,
    pub every: u32,
}

/// A configuration error naming the key at fault.
#[derive(Debug, thiserror::Error)]
#[error("config error: {key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

fn err(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError { key: key.to_string(), message: message.into() }
}

fn int_in(key: &str, v: i64, lo: i64, hi: i64) -> Result<i64, ConfigError> {
    if v < lo || v > hi {
        return Err(err(key, format!("must be between {lo} and {hi}, got {v}")));
    }
    Ok(v)
}

fn addr(key: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse().map_err(|e| err(key, format!("not a host:port socket address ({v:?}): {e}")))
}

/// Checks a ZeroMQ endpoint and rewrites `tcp://*:p` to `tcp://0.0.0.0:p` (the zeromq crate
/// does not accept `*` as a host).
pub fn endpoint(key: &str, v: &str) -> Result<String, ConfigError> {
    let rest = v
        .strip_prefix("tcp://")
        .ok_or_else(|| err(key, format!("endpoint must be tcp://host:port, got {v:?}")))?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| err(key, format!("endpoint has no port: {v:?}")))?;
    port.parse::<u16>().map_err(|_| err(key, format!("endpoint port is not a number: {v:?}")))?;
    if host.is_empty() {
        return Err(err(key, format!("endpoint has no host: {v:?}")));
    }
    let host = if host == "*" { "0.0.0.0" } else { host };
    Ok(format!("tcp://{host}:{port}"))
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

/// `<pod-id>,<model>,<pub-endpoint>[,<replay-endpoint>]`.
pub fn parse_pod_flag(v: &str) -> Result<PodConfig, ConfigError> {
    let parts: Vec<&str> = v.split(',').collect();
    if !(3..=4).contains(&parts.len()) || parts.iter().any(|p| p.is_empty()) {
        return Err(err("pod", format!("expected <pod-id>,<model>,<pub-endpoint>[,<replay-endpoint>], got {v:?}")));
    }
    Ok(PodConfig {
        id: parts[0].to_string(),
        model: parts[1].to_string(),
        endpoint: Some(parts[2].to_string()),
        replay_endpoint: parts.get(3).map(|s| s.to_string()),
        topic_id: None,
        dp_size: 1,
    })
}

fn parse_pair(key: &str, v: &str) -> Result<(String, String), ConfigError> {
    match v.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
        _ => Err(err(key, format!("expected <a>=<b>, got {v:?}"))),
    }
}

/// Validates one pod (from any origin); normalizes its endpoints.
pub fn validate_pod(key: &str, mut p: PodConfig) -> Result<PodConfig, ConfigError> {
    if p.id.is_empty() {
        return Err(err(&format!("{key}.id"), "must not be empty"));
    }
    if p.model.is_empty() {
        return Err(err(&format!("{key}.model"), "must not be empty"));
    }
    if let Some(e) = &p.endpoint {
        p.endpoint = Some(endpoint(&format!("{key}.endpoint"), e)?);
    }
    if let Some(e) = &p.replay_endpoint {
        p.replay_endpoint = Some(endpoint(&format!("{key}.replay_endpoint"), e)?);
    }
    if p.topic_id.as_deref() == Some("") {
        p.topic_id = None;
    }
    int_in(&format!("{key}.dp_size"), i64::from(p.dp_size), 1, 1024)?;
    Ok(p)
}

impl Config {
    /// Parses the file named by `--config` (if any) and applies the flags on top.
    pub fn load(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| err("config", format!("cannot read {}: {e}", path.display())))?;
                toml::from_str::<FileConfig>(&text).map_err(|e| err("config", format!("{}: {e}", path.display())))?
            }
            None => FileConfig::default(),
        };
        Self::merge(args, file)
    }

    pub fn merge(a: &ServeArgs, f: FileConfig) -> Result<Config, ConfigError> {
        let s = |flag: &Option<String>, file: Option<String>, d: &str| flag.clone().or(file).unwrap_or_else(|| d.to_string());
        let i = |key: &str, flag: Option<i64>, file: Option<i64>, d: i64, lo: i64, hi: i64| {
            int_in(key, flag.or(file).unwrap_or(d), lo, hi)
        };
        let grpc_addr = addr("grpc_addr", &s(&a.grpc_addr, f.grpc_addr, "127.0.0.1:50051"))?;
        let http_addr = addr("http_addr", &s(&a.http_addr, f.http_addr, "127.0.0.1:9090"))?;
        let zmq_bind = match a.zmq_bind.clone().or(f.zmq_bind) {
            Some(e) if !e.is_empty() => Some(endpoint("zmq_bind", &e)?),
            _ => None,
        };
        let mut pods = Vec::new();
        for (n, p) in f.pods.into_iter().enumerate() {
            pods.push(validate_pod(&format!("pods[{n}]"), p)?);
        }
        for v in &a.pods {
            pods.push(validate_pod("pod", parse_pod_flag(v)?)?);
        }
        let mut seen = std::collections::HashSet::new();
        for p in &pods {
            if !seen.insert(p.id.clone()) {
                return Err(err("pods", format!("pod {:?} is configured twice", p.id)));
            }
        }
        let mut topic_map = f.topic_map;
        for v in &a.topic_map {
            let (topic_id, pod) = parse_pair("topic-map", v)?;
            topic_map.push(TopicMapEntry { topic_id, pod });
        }
        for (n, t) in topic_map.iter().enumerate() {
            if t.topic_id.is_empty() || t.pod.is_empty() {
                return Err(err(&format!("topic_map[{n}]"), "topic_id and pod must not be empty"));
            }
        }
        let mut replay = f.replay;
        for v in &a.replay {
            let (pod, endpoint) = parse_pair("replay", v)?;
            replay.push(ReplayEntry { pod, endpoint });
        }
        for (n, r) in replay.iter_mut().enumerate() {
            if r.pod.is_empty() {
                return Err(err(&format!("replay[{n}].pod"), "must not be empty"));
            }
            r.endpoint = endpoint(&format!("replay[{n}].endpoint"), &r.endpoint)?;
        }
        let mut tier_weights = f.tier_weights;
        for v in &a.tier_weights {
            let (medium, w) = parse_pair("tier-weight", v)?;
            let w: f64 = w.parse().map_err(|_| err("tier-weight", format!("weight is not a number: {v:?}")))?;
            tier_weights.insert(medium, w);
        }
        for (medium, w) in &tier_weights {
            if !w.is_finite() || *w < 0.0 {
                return Err(err(&format!("tier_weights.{medium}"), "must be a finite number >= 0"));
            }
        }
        let hash_seed = s(&a.hash_seed, f.hash_seed, "");
        let vllm_version = s(&a.vllm_version, f.vllm_version, "0.33.0");
        let hash_algo = s(&a.hash_algo, f.hash_algo, "sha256_cbor");
        let every = i("hash_check_every", a.hash_check_every, f.hash_check_every, 16, 0, i64::from(u32::MAX))? as u32;
        let hash_check = if hash_seed.is_empty() || every == 0 {
            None
        } else {
            let hasher = kvindex::vllm_hash::VllmHashConfig {
                version: vllm_version.parse().map_err(|e| err("vllm_version", format!("{e}")))?,
                algo: hash_algo.parse().map_err(|e| err("hash_algo", format!("{e}")))?,
                pythonhashseed: (hash_seed != "unset").then(|| hash_seed.clone()),
            };
            kvindex::vllm_hash::BlockHasher::new(&hasher).map_err(|e| err("hash_seed", format!("{e}")))?;
            Some(HashCheckConfig { hasher, every })
        };
        let mut tokenizer_models = f.tokenizer_models;
        tokenizer_models.extend(a.tokenizer_models.iter().cloned());
        for v in &tokenizer_models {
            parse_pair("tokenizer_models", v)?;
        }
        let tokenizer_endpoint = a.tokenizer_endpoint.clone().or(f.tokenizer_endpoint).filter(|e| !e.is_empty());
        if let Some(e) = &tokenizer_endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(err("tokenizer_endpoint", format!("must be http://host:port, got {e:?}")));
            }
        }
        let dp_naming_topic = match s(&a.dp_naming, f.dp_naming, "port-offset").as_str() {
            "port-offset" => false,
            "topic" => true,
            other => return Err(err("dp_naming", format!("must be \"port-offset\" or \"topic\", got {other:?}"))),
        };
        let config = Config {
            dp_naming_topic,
            grpc_addr,
            http_addr,
            block_size: i("block_size", a.block_size, f.block_size, 16, 1, 1 << 16)? as usize,
            hash_check,
            tokenizer_models,
            tokenizer_models_dir: a.tokenizer_models_dir.clone().or(f.tokenizer_models_dir).filter(|d| !d.is_empty()),
            tokenizer_endpoint,
            zmq_bind,
            topic_filter: s(&a.topic_filter, f.topic_filter, "kv@"),
            shards: i("shards", a.shards, f.shards, 64, 1, 1 << 16)? as usize,
            max_entries: i("max_entries", a.max_entries, f.max_entries, 50_000_000, 1, i64::MAX)? as u64,
            queue_capacity: i("queue_capacity", a.queue_capacity, f.queue_capacity, 65_536, 1, 1 << 24)? as usize,
            apply_workers: i("apply_workers", a.apply_workers, f.apply_workers, 1, 1, 256)? as usize,
            stale_after_ms: i("stale_after_ms", a.stale_after_ms, f.stale_after_ms, 30_000, 1, i64::MAX)? as u64,
            replay_timeout_ms: i("replay_timeout_ms", a.replay_timeout_ms, f.replay_timeout_ms, 5_000, 1, i64::MAX)? as u64,
            replay_cooldown_ms: i("replay_cooldown_ms", a.replay_cooldown_ms, f.replay_cooldown_ms, 5_000, 0, i64::MAX)?
                as u64,
            max_concurrent_replays: i(
                "max_concurrent_replays",
                a.max_concurrent_replays,
                f.max_concurrent_replays,
                8,
                1,
                4096,
            )? as usize,
            max_pending: i("max_pending", a.max_pending, f.max_pending, 100_000, 1, 1 << 24)? as usize,
            max_tokens: i("max_tokens", a.max_tokens, f.max_tokens, 262_144, 1, 1 << 28)? as usize,
            max_message_bytes: i("max_message_bytes", a.max_message_bytes, f.max_message_bytes, 4 << 20, 1024, 1 << 30)?
                as usize,
            pods_file: a.pods_file.clone().or(f.pods_file),
            pods_file_poll_ms: i("pods_file_poll_ms", a.pods_file_poll_ms, f.pods_file_poll_ms, 1_000, 10, i64::MAX)?
                as u64,
            tier_weights,
            pods,
            topic_map,
            replay,
        };
        if config.topic_filter.len() > 254 {
            return Err(err("topic_filter", "must be at most 254 bytes (one ZMTP short frame)"));
        }
        if config.zmq_bind.is_none() && config.pods.iter().all(|p| p.endpoint.is_none()) && config.pods_file.is_none() {
            tracing::warn!("no zmq_bind, no per-pod endpoints and no pods_file: pods can only come from the registration API");
        }
        Ok(config)
    }
}

/// Parses the watched pods file.
pub fn parse_pods_file(text: &str) -> Result<Vec<PodConfig>, ConfigError> {
    let file: PodsFile = toml::from_str(text).map_err(|e| err("pods_file", e.to_string()))?;
    file.pods.into_iter().enumerate().map(|(n, p)| validate_pod(&format!("pods_file.pods[{n}]"), p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_seed_turns_the_vllm_hash_check_on() {
        let off = Config::merge(&ServeArgs::default(), FileConfig::default()).unwrap();
        assert!(off.hash_check.is_none());
        let a = ServeArgs { hash_seed: Some("0".into()), ..Default::default() };
        let on = Config::merge(&a, FileConfig::default()).unwrap().hash_check.unwrap();
        assert_eq!(on.every, 16);
        assert_eq!(on.hasher.pythonhashseed.as_deref(), Some("0"));
        let a = ServeArgs { hash_seed: Some("0".into()), hash_algo: Some("md5".into()), ..Default::default() };
        assert_eq!(Config::merge(&a, FileConfig::default()).unwrap_err().key, "hash_algo");
        let a = ServeArgs { hash_seed: Some("unset".into()), vllm_version: Some("0.20.0".into()), ..Default::default() };
        assert_eq!(Config::merge(&a, FileConfig::default()).unwrap_err().key, "hash_seed", "random NONE_HASH before 0.29");
        let a = ServeArgs { tokenizer_endpoint: Some("unix:/x".into()), ..Default::default() };
        assert_eq!(Config::merge(&a, FileConfig::default()).unwrap_err().key, "tokenizer_endpoint");
    }

    #[test]
    fn errors_name_the_key() {
        let a = ServeArgs { block_size: Some(0), ..Default::default() };
        let e = Config::merge(&a, FileConfig::default()).unwrap_err();
        assert_eq!(e.key, "block_size");
        let a = ServeArgs { pods: vec!["p,m".into()], ..Default::default() };
        assert_eq!(Config::merge(&a, FileConfig::default()).unwrap_err().key, "pod");
        let f: FileConfig = toml::from_str("grpc_addr = \"nope\"").unwrap();
        assert_eq!(Config::merge(&ServeArgs::default(), f).unwrap_err().key, "grpc_addr");
        let f: FileConfig = toml::from_str("[[pods]]\nid = \"a\"\nmodel = \"m\"\nendpoint = \"udp://x\"").unwrap();
        assert_eq!(Config::merge(&ServeArgs::default(), f).unwrap_err().key, "pods[0].endpoint");
        assert!(toml::from_str::<FileConfig>("bogus_key = 1").unwrap_err().to_string().contains("bogus_key"));
    }

    #[test]
    fn flags_override_file() {
        let f: FileConfig = toml::from_str("block_size = 32\nzmq_bind = \"tcp://*:5557\"\n[tier_weights]\nCPU = 0.5").unwrap();
        let a = ServeArgs { block_size: Some(64), tier_weights: vec!["CPU=0.25".into()], ..Default::default() };
        let c = Config::merge(&a, f).unwrap();
        assert_eq!(c.block_size, 64);
        assert_eq!(c.zmq_bind.as_deref(), Some("tcp://0.0.0.0:5557"));
        assert_eq!(c.tier_weights["CPU"], 0.25);
    }

    #[test]
    fn example_config_is_valid() {
        let f: FileConfig = toml::from_str(include_str!("../../../docs/kvindex.example.toml")).unwrap();
        let c = Config::merge(&ServeArgs::default(), f).unwrap();
        assert_eq!(c.zmq_bind.as_deref(), Some("tcp://0.0.0.0:5557"));
        assert_eq!(c.pods.len(), 1);
        assert_eq!(c.replay[0].endpoint, "tcp://10.0.0.7:5558");
    }

    #[test]
    fn endpoints() {
        assert_eq!(offset_endpoint("tcp://10.0.0.7:5557", 2), "tcp://10.0.0.7:5559");
        assert_eq!(offset_endpoint("tcp://10.0.0.7:0", 2), "tcp://10.0.0.7:0");
        let p = parse_pod_flag("10.0.0.7:8000,Qwen/Qwen3,tcp://10.0.0.7:5557,tcp://10.0.0.7:5558").unwrap();
        assert_eq!(p.replay_endpoint.as_deref(), Some("tcp://10.0.0.7:5558"));
    }
}
