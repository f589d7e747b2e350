//! `kvindex serve` configuration, declared once: every field of [`Settings`] is a command-line
//! flag, an environment variable and a key of the TOML file (`--config`). Layered flag > env >
//! file > default, then validated into the runtime [`Config`]; every error names the key and
//! where its value came from ([`ConfigError`]). docs/CONFIG.md lists every key
//! (tests/it/config_docs.rs holds it to this file).

pub mod admin_token;
pub mod admission;
pub mod cidr;
pub mod error;
pub mod http_limits;
pub mod pod;
pub mod reservations;
pub mod retention;
pub mod settings;
pub mod sibling;
pub mod spec;
pub mod tls_files;

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, FromArgMatches};

pub use self::cidr::Cidr;
pub use self::error::{ConfigError, ValueOrigin};
pub use self::pod::{engine_name, offset_endpoint, parsed, PodConfig, ReplayEntry, TierWeight, TopicMapEntry};
use self::settings::defs;
pub use self::settings::{serve_command, ServeArgs, Settings};
use self::spec::{IntSpec, TextSpec};

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The metrics-only listener (`/metrics`, `/debug/*`); `None`: they are on `http_addr`.
    pub metrics_addr: Option<SocketAddr>,
    /// The probes' own listener (`/healthz`, `/readyz`); `None`: none.
    pub probe_addr: Option<SocketAddr>,
    /// TLS (and with a client CA, mTLS) on every API listener; `None`: plain TCP.
    pub tls: Option<tls_files::TlsFiles>,
    /// Connection bounds of each HTTP listener (`http_addr`, `metrics_addr`; `probe_addr` holds
    /// fewer connections, [`http_limits::ConnLimits::for_probes`]).
    pub http_conn_limits: http_limits::ConnLimits,
    /// Bounds on the HTTP request bodies read (registrations).
    pub http_body_limits: http_limits::BodyLimits,
    pub block_size: usize,
    /// The sampled vLLM hash cross-check, when `hash_seed` is set.
    pub hash_check: Option<HashCheckConfig>,
    /// The sampled SGLang page-hash cross-check: its server-wide defaults.
    pub sglang_check: SglangCheckConfig,
    pub tokenizer_models: Vec<String>,
    pub tokenizer_models_dir: Option<String>,
    pub tokenizer_endpoint: Option<String>,
    /// Central mode: the topic id already names each DP rank's pod (`dp_naming = "topic"`).
    pub dp_naming_topic: bool,
    pub zmq_bind: Option<String>,
    /// Central mode: the SUB listens on `zmq_bind`'s port + r for every DP rank r below this.
    pub zmq_bind_dp_size: u32,
    /// The engine of a source no pod entry names one for (`default_engine`).
    pub default_engine: kvindex::wire::Engine,
    pub topic_filter: String,
    /// Bounds of every ZeroMQ socket (the central SUB; dialled pods and replays take the
    /// per-source byte budget as theirs).
    pub zmq_limits: kvindex_zmtp::Limits,
    pub shards: usize,
    pub max_entries: u64,
    pub queue_capacity: usize,
    pub apply_workers: usize,
    pub stale_after_ms: u64,
    /// Sources further behind their engine are not credited (0 = off; `apply::staleness`).
    pub max_source_staleness_ms: u64,
    pub replay_timeout_ms: u64,
    pub replay_queue_timeout_ms: u64,
    pub replay_cooldown_ms: u64,
    pub max_concurrent_replays: usize,
    pub max_pending: usize,
    pub max_tokens: usize,
    pub max_message_bytes: usize,
    /// RecordRoute's table of speculative credits (its block size is `block_size`).
    pub speculative: kvindex::speculative::SpeculativeConfig,
    /// RecordRoute's reservations: the routers' shared in-flight load.
    pub reservations: reservations::ReservationConfig,
    pub pods_file: Option<PathBuf>,
    pub pods_file_poll_ms: u64,
    /// Admission of expensive gRPC calls (ScoreTokens, GetPodScores, RecordRoute).
    pub grpc_admission: admission::AdmissionConfig,
    /// The control plane's bearer token (registration and RecordRoute); `None`: both are
    /// disabled.
    pub admin_token: Option<admin_token::AdminToken>,
    /// Central mode: the address ranges allowed to connect (empty: any).
    pub zmq_allow: Vec<Cidr>,
    /// Where registered endpoints may point (empty: anywhere).
    pub register_allow: Vec<Cidr>,
    pub max_sources: usize,
    pub max_sources_per_address: usize,
    pub tier_weights: BTreeMap<String, f64>,
    /// Bounds on tier names learned from publishers (hardening block).
    pub tier_limits: kvindex::TierLimits,
    /// Warm-restart snapshots (`snapshot_dir`), when enabled.
    pub snapshot_dir: Option<PathBuf>,
    pub snapshot_interval_ms: u64,
    /// The sibling to bootstrap from (`bootstrap_from`), and to compare digests with.
    pub bootstrap_from: Option<sibling::Sibling>,
    pub bootstrap_timeout_ms: u64,
    pub bootstrap_max_bytes: u64,
    /// Serving side of `ExportIndex`.
    pub sibling_export: sibling::ExportLimits,
    /// The periodic digest check (0 = off).
    pub sibling_check_interval_ms: u64,
    /// `kvindex record`: every message the sources deliver is appended to this dump. Not a
    /// `serve` setting: recording holds token ids, so only the `record` command turns it on.
    pub record: Option<RecordConfig>,
    pub pods: Vec<PodConfig>,
    pub topic_map: Vec<TopicMapEntry>,
    pub replay: Vec<ReplayEntry>,
    /// Kubernetes pod discovery (`discovery = "kubernetes"`), when on.
    pub discovery: Option<kvindex_discovery::WatchConfig>,
}

/// Where `kvindex record` writes, and how much it keeps.
#[derive(Debug, Clone)]
pub struct RecordConfig {
    pub path: PathBuf,
    pub retention: retention::Retention,
}

#[derive(Debug, Clone)]
pub struct HashCheckConfig {
    pub hasher: kvindex::vllm_hash::VllmHashConfig,
    pub every: u32,
}

/// The SGLang sources' page-hash cross-check: the release and event format of a source no pod
/// entry names them for, and the sampling (`hash_check_every`, 0 = off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SglangCheckConfig {
    pub release: kvindex::sglang::SglangRelease,
    pub format: kvindex::sglang::EventFormat,
    pub every: u32,
}

impl Config {
    /// Parses `kvindex serve`'s arguments (what follows `serve`), with their env vars and the
    /// file named by `--config`, into a validated configuration.
    pub fn from_args<I, T>(args: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let argv: Vec<OsString> =
            std::iter::once(OsString::from("serve")).chain(args.into_iter().map(Into::into)).collect();
        let matches = serve_command().try_get_matches_from(&argv).map_err(|e| {
            ConfigError::from_clap(&e, &argv, &serve_command())
                .unwrap_or_else(|| ConfigError::new("arguments", ValueOrigin::Default, e.render().to_string()))
        })?;
        Config::from_matches(&matches)
    }

    /// The configuration from parsed `serve` arguments: the file named by `--config` (if any),
    /// with the flags and env vars in `matches` on top.
    pub fn from_matches(matches: &ArgMatches) -> Result<Config, ConfigError> {
        let args = ServeArgs::from_arg_matches(matches)
            .map_err(|e| ConfigError::new("arguments", ValueOrigin::Default, e.to_string()))?;
        let (file, keys) = match &args.config {
            Some(path) => {
                let named_by = Sources { matches, file: None, file_keys: HashSet::new() }.origin("config");
                read_file(path, named_by)?
            }
            None => (Settings::default(), HashSet::new()),
        };
        let sources = Sources { matches, file: args.config.as_deref(), file_keys: keys };
        let mut settings = file;
        let from_file = settings.take_lists();
        settings
            .update_from_arg_matches(matches)
            .map_err(|e| ConfigError::new("arguments", ValueOrigin::Default, e.to_string()))?;
        let from_flags = settings.take_lists();
        Config::validate(settings, from_file, from_flags, &sources)
    }

    /// Checks every setting and applies the defaults, one section of the settings at a time
    /// (the functions below, each named after its section), then the rules that join sections
    /// ([`check_combinations`]). `from_file` and `from_flags` are the list entries of each
    /// layer (flags add to the file's lists).
    fn validate(s: Settings, from_file: Lists, from_flags: Lists, src: &Sources<'_>) -> Result<Config, ConfigError> {
        let ints = Ints { src };
        let zmq_limits = zmq_limits(&s, src, &ints)?;
        let (http_conn_limits, http_body_limits) = http_limits(&s, src, &ints)?;
        let discovery = discovery(&s, src)?;
        let tls = tls_files(&s, src)?;
        let bootstrap_from = sibling(&s, src)?;
        let admin_token = admin_token(&s, src)?;
        let zmq_allow = allowed_ranges("zmq_allow", &from_file.zmq_allow, &from_flags.zmq_allow, src)?;
        let register_allow =
            allowed_ranges("register_allow", &from_file.register_allow, &from_flags.register_allow, src)?;
        let Listeners { grpc_addr, http_addr, metrics_addr, probe_addr } = listeners(&s, src)?;
        let CentralBind { zmq_bind, zmq_bind_dp_size } = central_bind(&s, src, &ints)?;
        let block_size = ints.get(&defs::block_size, s.block_size)? as usize;
        let pods = pods(from_file.pods, from_flags.pods, block_size, src)?;
        let topic_map = topic_map(from_file.topic_map, from_flags.topic_map, src)?;
        let replay = replay(from_file.replay, from_flags.replay, src)?;
        let tier_weights = tier_weights(from_file.tier_weights, from_flags.tier_weights, src)?;
        let HashChecks { hash_check, sglang_check } = hash_checks(&s, src, &ints)?;
        let Tokenizers { tokenizer_models, tokenizer_models_dir, tokenizer_endpoint } =
            tokenizers(&s, from_file.tokenizer_models, from_flags.tokenizer_models, src)?;
        let Topics { dp_naming_topic, default_engine, topic_filter } = topics(&s, src)?;
        let max_tokens = ints.get(&defs::max_tokens, s.max_tokens)?;
        let config = Config {
            grpc_admission: grpc_admission(&s, &ints, max_tokens)?,
            discovery,
            zmq_limits,
            grpc_addr,
            http_addr,
            metrics_addr,
            probe_addr,
            tls,
            http_conn_limits,
            http_body_limits,
            block_size,
            hash_check,
            sglang_check,
            tokenizer_models,
            tokenizer_models_dir,
            tokenizer_endpoint,
            dp_naming_topic,
            zmq_bind,
            zmq_bind_dp_size,
            default_engine,
            topic_filter,
            shards: ints.get(&defs::shards, s.shards)? as usize,
            max_entries: ints.get(&defs::max_entries, s.max_entries)? as u64,
            queue_capacity: ints.get(&defs::queue_capacity, s.queue_capacity)? as usize,
            apply_workers: ints.get(&defs::apply_workers, s.apply_workers)? as usize,
            stale_after_ms: ints.get(&defs::stale_after_ms, s.stale_after_ms)? as u64,
            max_source_staleness_ms: ints.get(&defs::max_source_staleness_ms, s.max_source_staleness_ms)? as u64,
            replay_timeout_ms: ints.get(&defs::replay_timeout_ms, s.replay_timeout_ms)? as u64,
            replay_queue_timeout_ms: ints.get(&defs::replay_queue_timeout_ms, s.replay_queue_timeout_ms)? as u64,
            replay_cooldown_ms: ints.get(&defs::replay_cooldown_ms, s.replay_cooldown_ms)? as u64,
            max_concurrent_replays: ints.get(&defs::max_concurrent_replays, s.max_concurrent_replays)? as usize,
            max_pending: ints.get(&defs::max_pending, s.max_pending)? as usize,
            max_tokens: max_tokens as usize,
            max_message_bytes: ints.get(&defs::max_message_bytes, s.max_message_bytes)? as usize,
            speculative: speculative(&s, &ints, block_size)?,
            reservations: reservations(&s, &ints)?,
            pods_file: s.pods_file.clone(),
            admin_token,
            zmq_allow,
            register_allow,
            max_sources: ints.get(&defs::max_sources, s.max_sources)? as usize,
            max_sources_per_address: ints.get(&defs::max_sources_per_address, s.max_sources_per_address)? as usize,
            pods_file_poll_ms: ints.get(&defs::pods_file_poll_ms, s.pods_file_poll_ms)? as u64,
            tier_weights,
            tier_limits: kvindex::TierLimits {
                max_per_source: ints.get(&defs::max_tiers_per_source, s.max_tiers_per_source)? as usize,
                max_learned: ints.get(&defs::max_learned_tiers, s.max_learned_tiers)? as usize,
            },
            snapshot_dir: s.snapshot_dir.clone().filter(|d| !d.as_os_str().is_empty()),
            snapshot_interval_ms: ints.get(&defs::snapshot_interval, s.snapshot_interval)? as u64 * 1000,
            bootstrap_from,
            bootstrap_timeout_ms: ints.get(&defs::bootstrap_timeout_ms, s.bootstrap_timeout_ms)? as u64,
            bootstrap_max_bytes: ints.get(&defs::bootstrap_max_bytes, s.bootstrap_max_bytes)? as u64,
            sibling_export: sibling_export(&s, &ints)?,
            sibling_check_interval_ms: ints.get(&defs::sibling_check_interval_ms, s.sibling_check_interval_ms)? as u64,
            record: None,
            pods,
            topic_map,
            replay,
        };
        check_combinations(&config, src)?;
        Ok(config)
    }
}

/// The listen addresses of the APIs (`grpc_addr`, `http_addr`) and of the optional metrics and
/// probe listeners (empty: none).
struct Listeners {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    probe_addr: Option<SocketAddr>,
}

fn listeners(s: &Settings, src: &Sources<'_>) -> Result<Listeners, ConfigError> {
    let addr = |spec: &TextSpec, v: Option<&str>| -> Result<SocketAddr, ConfigError> {
        let v = spec.or_default(v);
        v.parse().map_err(|e| src.error(spec.key, format!("not a host:port socket address ({v:?}): {e}")))
    };
    let optional = |spec: &TextSpec, v: &Option<String>| match v.as_deref().filter(|a| !a.is_empty()) {
        Some(a) => addr(spec, Some(a)).map(Some),
        None => Ok(None),
    };
    Ok(Listeners {
        grpc_addr: addr(&defs::grpc_addr, s.grpc_addr.as_deref())?,
        http_addr: addr(&defs::http_addr, s.http_addr.as_deref())?,
        metrics_addr: optional(&defs::metrics_addr, &s.metrics_addr)?,
        probe_addr: optional(&defs::probe_addr, &s.probe_addr)?,
    })
}

/// Kubernetes discovery: the flags, defaults, ranges and checks are kvindex-discovery's (shared
/// with the router). Per-pod mode needs each pod's model; in central mode the topics carry it.
fn discovery(s: &Settings, src: &Sources<'_>) -> Result<Option<kvindex_discovery::WatchConfig>, ConfigError> {
    let central = s.zmq_bind.as_deref().is_some_and(|e| !e.is_empty());
    s.discovery.watch_config(!central).map_err(|e| src.error(e.key, e.message))
}

/// The control plane's bearer token, read from `admin_token_file` now.
fn admin_token(s: &Settings, src: &Sources<'_>) -> Result<Option<admin_token::AdminToken>, ConfigError> {
    let Some(path) = &s.admin_token_file else { return Ok(None) };
    let text = std::fs::read_to_string(path)
        .map_err(|e| src.error("admin_token_file", format!("cannot read {}: {e}", path.display())))?;
    admin_token::AdminToken::parse(&text).map(Some).map_err(|m| src.error("admin_token_file", m))
}

/// A host policy (`zmq_allow`, `register_allow`): the address ranges of both layers.
fn allowed_ranges(key: &str, file: &[String], flags: &[String], src: &Sources<'_>) -> Result<Vec<Cidr>, ConfigError> {
    let mut ranges = Vec::new();
    for (entries, origin) in [(file, src.file_origin()), (flags, src.flag_origin(key))] {
        for cidr in entries {
            ranges.push(Cidr::parse(cidr).map_err(|m| ConfigError::new(key, origin.clone(), m))?);
        }
    }
    Ok(ranges)
}

/// Central mode's SUB: where it binds, and how many DP ranks' ports above it.
struct CentralBind {
    zmq_bind: Option<String>,
    zmq_bind_dp_size: u32,
}

fn central_bind(s: &Settings, src: &Sources<'_>, ints: &Ints<'_>) -> Result<CentralBind, ConfigError> {
    let zmq_bind = match s.zmq_bind.as_deref() {
        Some(e) if !e.is_empty() => Some(pod::endpoint(e).map_err(|m| src.error("zmq_bind", m))?),
        _ => None,
    };
    let zmq_bind_dp_size = ints.get(&defs::zmq_bind_dp_size, s.zmq_bind_dp_size)? as u32;
    if zmq_bind_dp_size > 1 {
        let port = zmq_bind.as_deref().and_then(|e| e.strip_prefix("tcp://")?.rsplit_once(':')?.1.parse::<u32>().ok());
        match port {
            Some(p) if p != 0 && p + zmq_bind_dp_size - 1 <= 65535 => {}
            _ => {
                let why = format!(
                    "{zmq_bind_dp_size} ranks need zmq_bind to be a tcp:// endpoint with a port (not 0) that leaves room for port + {} (got {zmq_bind:?})",
                    zmq_bind_dp_size - 1
                );
                return Err(src.error("zmq_bind_dp_size", why));
            }
        }
    }
    Ok(CentralBind { zmq_bind, zmq_bind_dp_size })
}

/// The `[[pods]]` entries of both layers, each checked against the index's block size, and no
/// pod configured twice.
fn pods(
    file: Vec<PodConfig>,
    flags: Vec<PodConfig>,
    block_size: usize,
    src: &Sources<'_>,
) -> Result<Vec<PodConfig>, ConfigError> {
    let mut pods = Vec::new();
    for (n, p) in file.into_iter().enumerate() {
        let (key, origin) = (format!("pods[{n}]"), src.file_origin());
        let p = p.validate(&key, &origin)?;
        p.check_page_size(block_size).map_err(|m| ConfigError::new(format!("{key}.page_size"), origin, m))?;
        pods.push(p);
    }
    for p in flags {
        let origin = src.flag_origin("pods");
        let p = p.validate("pods", &origin)?;
        p.check_page_size(block_size).map_err(|m| ConfigError::new("pods.page_size", origin, m))?;
        pods.push(p);
    }
    let mut seen = HashSet::new();
    for p in &pods {
        if !seen.insert(p.id.clone()) {
            return Err(src.error("pods", format!("pod {:?} is configured twice", p.id)));
        }
    }
    Ok(pods)
}

fn topic_map(
    file: Vec<TopicMapEntry>,
    flags: Vec<TopicMapEntry>,
    src: &Sources<'_>,
) -> Result<Vec<TopicMapEntry>, ConfigError> {
    let topic_map: Vec<TopicMapEntry> = file.into_iter().chain(flags).collect();
    for (n, t) in topic_map.iter().enumerate() {
        if t.topic_id.is_empty() || t.pod.is_empty() {
            return Err(src.error(&format!("topic_map[{n}]"), "topic_id and pod must not be empty"));
        }
    }
    Ok(topic_map)
}

/// Central-mode pods' replay endpoints.
fn replay(file: Vec<ReplayEntry>, flags: Vec<ReplayEntry>, src: &Sources<'_>) -> Result<Vec<ReplayEntry>, ConfigError> {
    let mut replay = Vec::new();
    for (entries, origin, indexed) in [(file, src.file_origin(), true), (flags, src.flag_origin("replay"), false)] {
        for (n, mut r) in entries.into_iter().enumerate() {
            let key = if indexed { format!("replay[{n}]") } else { "replay".to_string() };
            if r.pod.is_empty() {
                return Err(ConfigError::new(format!("{key}.pod"), origin, "must not be empty"));
            }
            r.endpoint = pod::endpoint(&r.endpoint)
                .map_err(|m| ConfigError::new(format!("{key}.endpoint"), origin.clone(), m))?;
            replay.push(r);
        }
    }
    Ok(replay)
}

fn tier_weights(
    file: Vec<TierWeight>,
    flags: Vec<TierWeight>,
    src: &Sources<'_>,
) -> Result<BTreeMap<String, f64>, ConfigError> {
    let mut tier_weights = BTreeMap::new();
    for (entries, origin) in [(file, src.file_origin()), (flags, src.flag_origin("tier_weights"))] {
        for TierWeight { medium, weight } in entries {
            if !weight.is_finite() || weight < 0.0 {
                return Err(ConfigError::new(format!("tier_weights.{medium}"), origin, "must be a finite number >= 0"));
            }
            tier_weights.insert(medium, weight);
        }
    }
    Ok(tier_weights)
}

/// The sampled cross-checks of the engines' own hashes: vLLM's block hashes (on when
/// `hash_seed` is set) and SGLang's page hashes.
struct HashChecks {
    hash_check: Option<HashCheckConfig>,
    sglang_check: SglangCheckConfig,
}

fn hash_checks(s: &Settings, src: &Sources<'_>, ints: &Ints<'_>) -> Result<HashChecks, ConfigError> {
    let hash_seed = s.hash_seed.clone().unwrap_or_default();
    let every = ints.get(&defs::hash_check_every, s.hash_check_every)? as u32;
    let sglang_check = SglangCheckConfig {
        release: defs::sglang_release
            .or_default(s.sglang_release.as_deref())
            .parse()
            .map_err(|e| src.error("sglang_release", format!("{e}")))?,
        format: defs::sglang_event_format
            .pick(s.sglang_event_format.as_deref())
            .map_err(|m| src.error("sglang_event_format", m))?
            .parse()
            .map_err(|m: String| src.error("sglang_event_format", m))?,
        every,
    };
    let hash_check = if hash_seed.is_empty() || every == 0 {
        None
    } else {
        let hasher = kvindex::vllm_hash::VllmHashConfig {
            version: defs::vllm_version
                .or_default(s.vllm_version.as_deref())
                .parse()
                .map_err(|e| src.error("vllm_version", format!("{e}")))?,
            algo: defs::hash_algo
                .or_default(s.hash_algo.as_deref())
                .parse()
                .map_err(|e| src.error("hash_algo", format!("{e}")))?,
            pythonhashseed: (hash_seed != "unset").then(|| hash_seed.clone()),
        };
        kvindex::vllm_hash::BlockHasher::new(&hasher).map_err(|e| src.error("hash_seed", format!("{e}")))?;
        Some(HashCheckConfig { hasher, every })
    };
    Ok(HashChecks { hash_check, sglang_check })
}

/// GetPodScores' tokenizers: in-process models (listed, or found in a directory) and the
/// remote one.
struct Tokenizers {
    tokenizer_models: Vec<String>,
    tokenizer_models_dir: Option<String>,
    tokenizer_endpoint: Option<String>,
}

fn tokenizers(
    s: &Settings,
    file: Vec<String>,
    flags: Vec<String>,
    src: &Sources<'_>,
) -> Result<Tokenizers, ConfigError> {
    let mut tokenizer_models = Vec::new();
    for (entries, origin) in [(file, src.file_origin()), (flags, src.flag_origin("tokenizer_models"))] {
        for spec in entries {
            pod::pair(&spec)
                .map_err(|m| ConfigError::new("tokenizer_models", origin.clone(), format!("{m}, got {spec:?}")))?;
            tokenizer_models.push(spec);
        }
    }
    let tokenizer_endpoint = s.tokenizer_endpoint.clone().filter(|e| !e.is_empty());
    if let Some(e) = &tokenizer_endpoint {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            return Err(src.error("tokenizer_endpoint", format!("must be http://host:port, got {e:?}")));
        }
    }
    let tokenizer_models_dir = s.tokenizer_models_dir.clone().filter(|d| !d.is_empty());
    Ok(Tokenizers { tokenizer_models, tokenizer_models_dir, tokenizer_endpoint })
}

/// What the sources' topics say: how a DP rank's pod is named, the engine of a source no pod
/// entry names one for, and the subscription prefix.
struct Topics {
    dp_naming_topic: bool,
    default_engine: kvindex::wire::Engine,
    topic_filter: String,
}

fn topics(s: &Settings, src: &Sources<'_>) -> Result<Topics, ConfigError> {
    let dp_naming = defs::dp_naming.pick(s.dp_naming.as_deref()).map_err(|m| src.error("dp_naming", m))?;
    let default_engine = defs::default_engine
        .pick(s.default_engine.as_deref())
        .map_err(|m| src.error("default_engine", m))?
        .parse()
        .map_err(|e: kvindex::wire::UnknownEngine| src.error("default_engine", e.to_string()))?;
    let topic_filter = defs::topic_filter.or_default(s.topic_filter.as_deref());
    if topic_filter.len() > 254 {
        return Err(src.error("topic_filter", "must be at most 254 bytes (one ZMTP short frame)"));
    }
    Ok(Topics { dp_naming_topic: dp_naming == "topic", default_engine, topic_filter })
}

/// The `grpc_*` admission of large queries; the defaults follow the cores and `max_tokens`.
fn grpc_admission(s: &Settings, ints: &Ints<'_>, max_tokens: i64) -> Result<admission::AdmissionConfig, ConfigError> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as i64;
    Ok(admission::AdmissionConfig {
        small_query_tokens: ints.get(&defs::grpc_small_query_tokens, s.grpc_small_query_tokens)? as usize,
        max_concurrent_large: ints.or(
            &defs::grpc_max_concurrent_large,
            s.grpc_max_concurrent_large,
            (cores / 2).max(1),
        )? as usize,
        max_queued_tokens: ints.or(&defs::grpc_max_queued_tokens, s.grpc_max_queued_tokens, 4 * max_tokens)? as usize,
    })
}

/// RecordRoute's speculative credits (`speculative_*`), in blocks of the index's size.
fn speculative(
    s: &Settings,
    ints: &Ints<'_>,
    block_size: usize,
) -> Result<kvindex::speculative::SpeculativeConfig, ConfigError> {
    let max_entries = ints.get(&defs::speculative_max_entries, s.speculative_max_entries)?;
    Ok(kvindex::speculative::SpeculativeConfig {
        block_size,
        default_ttl_ms: ints.get(&defs::speculative_ttl_ms, s.speculative_ttl_ms)? as u64,
        max_ttl_ms: ints.get(&defs::speculative_max_ttl_ms, s.speculative_max_ttl_ms)? as u64,
        max_entries: max_entries as usize,
        max_entries_per_pod: ints.get(&defs::speculative_max_entries_per_pod, s.speculative_max_entries_per_pod)?
            as usize,
        max_entries_per_caller: ints.or(
            &defs::speculative_max_entries_per_caller,
            s.speculative_max_entries_per_caller,
            (max_entries / 4).max(1),
        )? as usize,
    })
}

/// RecordRoute's reservations (`reservation_*`).
fn reservations(s: &Settings, ints: &Ints<'_>) -> Result<reservations::ReservationConfig, ConfigError> {
    let max_entries = ints.get(&defs::reservation_max_entries, s.reservation_max_entries)?;
    Ok(reservations::ReservationConfig {
        default_ttl_ms: ints.get(&defs::reservation_ttl_ms, s.reservation_ttl_ms)? as u64,
        max_ttl_ms: ints.get(&defs::reservation_max_ttl_ms, s.reservation_max_ttl_ms)? as u64,
        max_entries: max_entries as usize,
        max_entries_per_pod: ints.get(&defs::reservation_max_entries_per_pod, s.reservation_max_entries_per_pod)?
            as usize,
        max_entries_per_caller: ints.or(
            &defs::reservation_max_entries_per_caller,
            s.reservation_max_entries_per_caller,
            (max_entries / 4).max(1),
        )? as usize,
    })
}

/// The bounds of serving `ExportIndex` to bootstrapping siblings (`sibling_export_*`).
fn sibling_export(s: &Settings, ints: &Ints<'_>) -> Result<sibling::ExportLimits, ConfigError> {
    Ok(sibling::ExportLimits {
        max_bytes: ints.get(&defs::sibling_export_max_bytes, s.sibling_export_max_bytes)? as u64,
        timeout: std::time::Duration::from_millis(
            ints.get(&defs::sibling_export_timeout_ms, s.sibling_export_timeout_ms)? as u64,
        ),
        max_concurrent: ints.get(&defs::sibling_export_max_concurrent, s.sibling_export_max_concurrent)? as usize,
    })
}

/// The rules that join settings of different sections, checked once each section is; and the
/// warning for a server nothing can declare a pod to but the registration API.
fn check_combinations(config: &Config, src: &Sources<'_>) -> Result<(), ConfigError> {
    if config.bootstrap_from.is_some() && config.admin_token.is_none() {
        return Err(src.error(
            "bootstrap_from",
            "needs admin_token_file: a sibling exports its index only to a caller holding the replicas' admin token",
        ));
    }
    if config.bootstrap_from.is_none() && config.sibling_check_interval_ms > 0 {
        return Err(src.error("sibling_check_interval_ms", "needs bootstrap_from (the siblings' address)"));
    }
    if config.speculative.default_ttl_ms > config.speculative.max_ttl_ms {
        return Err(src.error("speculative_ttl_ms", "must not exceed speculative_max_ttl_ms"));
    }
    if config.reservations.default_ttl_ms > config.reservations.max_ttl_ms {
        return Err(src.error("reservation_ttl_ms", "must not exceed reservation_max_ttl_ms"));
    }
    if config.zmq_bind.is_none()
        && config.pods.iter().all(|p| p.endpoint.is_none())
        && config.pods_file.is_none()
        && config.discovery.is_none()
    {
        tracing::warn!(
            "no zmq_bind, no per-pod endpoints and no pods_file: pods can only come from the registration API"
        );
    }
    Ok(())
}
/// The sibling of `bootstrap_from` and the `bootstrap_tls_*` settings, read and checked now.
fn sibling(s: &Settings, src: &Sources<'_>) -> Result<Option<sibling::Sibling>, ConfigError> {
    let path = |p: &Option<PathBuf>| p.clone().filter(|p| !p.as_os_str().is_empty());
    let (ca, cert, key) = (path(&s.bootstrap_tls_ca), path(&s.bootstrap_tls_cert), path(&s.bootstrap_tls_key));
    let domain = s.bootstrap_tls_domain.clone().filter(|d| !d.is_empty());
    let Some(addr) = s.bootstrap_from.clone().filter(|a| !a.is_empty()) else {
        if ca.is_some() || cert.is_some() || key.is_some() || domain.is_some() {
            return Err(src.error("bootstrap_from", "the bootstrap_tls_* settings need bootstrap_from"));
        }
        return Ok(None);
    };
    let port = addr.rsplit_once(':').and_then(|(host, port)| (!host.is_empty()).then_some(port));
    if port.is_none_or(|p| p.parse::<u16>().is_err()) || addr.contains('/') {
        return Err(
            src.error("bootstrap_from", format!("must be host:port (the sibling's gRPC address), got {addr:?}"))
        );
    }
    let identity = match (&cert, &key) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        (None, None) => None,
        (Some(_), None) => return Err(src.error("bootstrap_tls_key", "bootstrap_tls_cert needs bootstrap_tls_key")),
        (None, Some(_)) => return Err(src.error("bootstrap_tls_cert", "bootstrap_tls_key needs bootstrap_tls_cert")),
    };
    let tls = match &ca {
        Some(ca) => {
            Some(sibling::SiblingTls::read(ca, identity, domain).map_err(|m| src.error("bootstrap_tls_ca", m))?)
        }
        None if identity.is_some() || domain.is_some() => {
            return Err(src.error("bootstrap_tls_ca", "the other bootstrap_tls_* settings need bootstrap_tls_ca"))
        }
        None => None,
    };
    Ok(Some(sibling::Sibling { addr, tls }))
}

/// The listeners' TLS files (`tls_cert` and `tls_key` together; `tls_client_ca` only with them),
/// read and parsed now so that a bad file is a config error naming its key.
fn tls_files(s: &Settings, src: &Sources<'_>) -> Result<Option<tls_files::TlsFiles>, ConfigError> {
    let path = |p: &Option<PathBuf>| p.clone().filter(|p| !p.as_os_str().is_empty());
    let (cert, key, ca) = (path(&s.tls_cert), path(&s.tls_key), path(&s.tls_client_ca));
    let (cert, key) = match (cert, key) {
        (Some(cert), Some(key)) => (cert, key),
        (None, None) if ca.is_some() => return Err(src.error("tls_client_ca", "needs tls_cert and tls_key")),
        (None, None) => return Ok(None),
        (Some(_), None) => return Err(src.error("tls_key", "tls_cert needs tls_key")),
        (None, Some(_)) => return Err(src.error("tls_cert", "tls_key needs tls_cert")),
    };
    let read = |key: &str, path: &Path| {
        std::fs::read(path).map_err(|e| src.error(key, format!("cannot read {}: {e}", path.display())))
    };
    let ca = match &ca {
        Some(path) => Some(read("tls_client_ca", path)?),
        None => None,
    };
    tls_files::TlsFiles::parse(&read("tls_cert", &cert)?, &read("tls_key", &key)?, ca.as_deref())
        .map(Some)
        .map_err(|e| src.error(e.key, e.message))
}

/// Checks integer settings against their specs ([`settings::defs`]); an error names the key and
/// where its value came from.
struct Ints<'a> {
    src: &'a Sources<'a>,
}

impl Ints<'_> {
    /// The value, or the spec's default.
    fn get(&self, spec: &IntSpec, v: Option<i64>) -> Result<i64, ConfigError> {
        self.within(spec, v, spec.default.unwrap_or(spec.min), spec.max)
    }

    /// The value, or `default` (computed: the spec has none).
    fn or(&self, spec: &IntSpec, v: Option<i64>, default: i64) -> Result<i64, ConfigError> {
        self.within(spec, v, default, spec.max)
    }

    /// The same, with an upper bound another setting lowers.
    fn within(&self, spec: &IntSpec, v: Option<i64>, default: i64, max: i64) -> Result<i64, ConfigError> {
        spec.check_within(v.unwrap_or(default), max).map_err(|m| self.src.error(spec.key, m))
    }
}

/// The `zmq_*` settings as the ZeroMQ stack's [`kvindex_zmtp::Limits`], checked as a whole.
fn zmq_limits(s: &Settings, src: &Sources<'_>, ints: &Ints<'_>) -> Result<kvindex_zmtp::Limits, ConfigError> {
    use std::time::Duration;
    let bytes = |spec, v| ints.get(spec, v).map(|v| v as usize);
    let ms = |spec, v| ints.get(spec, v).map(|v| Duration::from_millis(v as u64));
    let max_connections =
        ints.or(&defs::zmq_max_connections, s.zmq_max_connections, default_max_connections())? as usize;
    // Sockets that never greet hold a descriptor each until the handshake timeout: they get a
    // share of the listener, not all of it, so publishers that did handshake always find room.
    let max_handshaking =
        ints.or(&defs::zmq_max_handshaking, s.zmq_max_handshaking, (max_connections as i64 / 4).max(2))? as usize;
    let max_connections_per_source = ints.or(
        &defs::zmq_max_connections_per_source,
        s.zmq_max_connections_per_source,
        (max_connections as i64 / 4).clamp(1, 32),
    )? as usize;
    let limits = kvindex_zmtp::Limits {
        max_frame_size: bytes(&defs::zmq_max_frame_bytes, s.zmq_max_frame_bytes)?,
        max_message_size: bytes(&defs::zmq_max_message_bytes, s.zmq_max_message_bytes)?,
        max_parts: ints.get(&defs::zmq_max_parts, s.zmq_max_parts)? as usize,
        max_bytes_in_flight: bytes(&defs::zmq_max_bytes_in_flight, s.zmq_max_bytes_in_flight)?,
        max_bytes_in_flight_per_source: bytes(
            &defs::zmq_max_bytes_in_flight_per_source,
            s.zmq_max_bytes_in_flight_per_source,
        )?,
        max_connections,
        max_connections_per_source,
        max_connections_per_network: ints.or(
            &defs::zmq_max_connections_per_network,
            s.zmq_max_connections_per_network,
            (max_connections as i64 / 2).max(1),
        )? as usize,
        max_handshaking,
        max_handshaking_per_source: ints.or(
            &defs::zmq_max_handshaking_per_source,
            s.zmq_max_handshaking_per_source, // An operator who lets one address hold N connections (many publishers on one
            // host) lets them connect at once.
            match s.zmq_max_connections_per_source {
                Some(_) => max_connections_per_source as i64,
                None => (max_handshaking as i64 / 2).clamp(1, 4),
            },
        )? as usize,
        handshake_timeout: ms(&defs::zmq_handshake_timeout_ms, s.zmq_handshake_timeout_ms)?,
        heartbeat_interval: ms(&defs::zmq_heartbeat_interval_ms, s.zmq_heartbeat_interval_ms)?,
        idle_timeout: ms(&defs::zmq_idle_timeout_ms, s.zmq_idle_timeout_ms)?,
        ..kvindex_zmtp::Limits::default()
    };
    // The stack's own check names the field at fault first (`max_parts must be ...`).
    limits.validate().map_err(|message| {
        let field = message.split_whitespace().next().unwrap_or_default();
        let key = match field {
            "max_frame_size" => "zmq_max_frame_bytes",
            "max_message_size" => "zmq_max_message_bytes",
            "max_bytes_in_flight" => "zmq_max_bytes_in_flight",
            "max_bytes_in_flight_per_source" => "zmq_max_bytes_in_flight_per_source",
            "heartbeat_interval" => "zmq_heartbeat_interval_ms",
            _ => "zmq_limits",
        };
        src.error(key, message)
    })?;
    Ok(limits)
}

/// The `http_*` bounds of the HTTP listeners: their connections and the bodies they read.
fn http_limits(
    s: &Settings,
    src: &Sources<'_>,
    ints: &Ints<'_>,
) -> Result<(http_limits::ConnLimits, http_limits::BodyLimits), ConfigError> {
    use std::time::Duration;
    let ms = |spec, v| ints.get(spec, v).map(|v| Duration::from_millis(v as u64));
    // The defaults fit in the descriptors kept beside the central SUB (DESCRIPTORS_KEPT):
    // both listeners full take half of them.
    let max_connections = ints.get(&defs::http_max_connections, s.http_max_connections)?;
    let max_connections_per_address = ints.within(
        &defs::http_max_connections_per_address,
        s.http_max_connections_per_address,
        (max_connections / 4).max(1),
        max_connections,
    )?;
    let max_bytes = ints.get(&defs::http_max_body_bytes, s.http_max_body_bytes)?;
    let max_inflight_bytes =
        ints.or(&defs::http_max_inflight_body_bytes, s.http_max_inflight_body_bytes, (1 << 20).max(max_bytes))?;
    if max_inflight_bytes < max_bytes {
        return Err(src.error(
            "http_max_inflight_body_bytes",
            format!("must be at least http_max_body_bytes ({max_bytes}), got {max_inflight_bytes}"),
        ));
    }
    let max_connections_per_network = ints.within(
        &defs::http_max_connections_per_network,
        s.http_max_connections_per_network,
        (max_connections / 2).max(1),
        max_connections,
    )?;
    let conn = http_limits::ConnLimits {
        header_timeout: ms(&defs::http_header_timeout_ms, s.http_header_timeout_ms)?,
        write_timeout: ms(&defs::http_write_timeout_ms, s.http_write_timeout_ms)?,
        max_connections: max_connections as usize,
        max_connections_per_address: max_connections_per_address as usize,
        max_connections_per_network: max_connections_per_network as usize,
    };
    let body = http_limits::BodyLimits {
        max_bytes: max_bytes as usize,
        max_inflight_bytes: max_inflight_bytes as usize,
        timeout: ms(&defs::http_body_timeout_ms, s.http_body_timeout_ms)?,
    };
    Ok((conn, body))
}

/// Descriptors kept for everything but the central SUB: gRPC and HTTP clients, dialled pods,
/// replays, files.
const DESCRIPTORS_KEPT: i64 = 256;

/// The central SUB's default connection cap: 1024, or half of what the descriptor limit leaves
/// after [`DESCRIPTORS_KEPT`], so a flood of publishers cannot starve the APIs of descriptors.
fn default_max_connections() -> i64 {
    let soft = std::fs::read_to_string("/proc/self/limits").ok().and_then(|limits| {
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        line.split_whitespace().nth(3)?.parse::<i64>().ok()
    });
    match soft {
        Some(soft) => ((soft - DESCRIPTORS_KEPT) / 2).clamp(16, 1024),
        None => 1024,
    }
}

/// The list settings of one layer (the file, or the flags).
#[derive(Default)]
struct Lists {
    pods: Vec<PodConfig>,
    topic_map: Vec<TopicMapEntry>,
    replay: Vec<ReplayEntry>,
    tier_weights: Vec<TierWeight>,
    tokenizer_models: Vec<String>,
    zmq_allow: Vec<String>,
    register_allow: Vec<String>,
}

impl Settings {
    fn take_lists(&mut self) -> Lists {
        Lists {
            pods: std::mem::take(&mut self.pods),
            topic_map: std::mem::take(&mut self.topic_map),
            replay: std::mem::take(&mut self.replay),
            tier_weights: std::mem::take(&mut self.tier_weights),
            tokenizer_models: std::mem::take(&mut self.tokenizer_models),
            zmq_allow: std::mem::take(&mut self.zmq_allow),
            register_allow: std::mem::take(&mut self.register_allow),
        }
    }
}

/// Reads the config file (named by `named_by`): its settings, and which keys it sets.
fn read_file(path: &Path, named_by: ValueOrigin) -> Result<(Settings, HashSet<String>), ConfigError> {
    let origin = ValueOrigin::File(path.to_path_buf());
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("config", named_by, format!("cannot read {}: {e}", path.display())))?;
    let settings: Settings =
        toml::from_str(&text).map_err(|e| ConfigError::new("config", origin.clone(), e.to_string()))?;
    let keys = text
        .parse::<toml::Table>()
        .map_err(|e| ConfigError::new("config", origin, e.to_string()))?
        .keys()
        .cloned()
        .collect::<HashSet<String>>();
    // Settings take no `deny_unknown_fields` (serde cannot with the flattened discovery
    // settings): the keys are checked against the declared settings here.
    let known: Vec<String> = settings::table().into_iter().map(|s| s.key.to_string()).collect();
    let mut unknown: Vec<&String> = keys.iter().filter(|k| !known.contains(k)).collect();
    unknown.sort();
    if let Some(key) = unknown.first() {
        let expected: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
        let message = format!("unknown field `{key}`, expected one of {}", expected.join(", "));
        return Err(ConfigError::new("config", ValueOrigin::File(path.to_path_buf()), message));
    }
    Ok((settings, keys))
}

/// Where each setting's value came from.
struct Sources<'a> {
    matches: &'a ArgMatches,
    file: Option<&'a Path>,
    file_keys: HashSet<String>,
}

impl Sources<'_> {
    fn origin(&self, key: &str) -> ValueOrigin {
        match self.matches.value_source(key) {
            Some(ValueSource::CommandLine) => self.flag_origin(key),
            Some(ValueSource::EnvVariable) => {
                let command = serve_command();
                let env = command.get_arguments().find(|a| a.get_id() == key).and_then(|a| a.get_env());
                ValueOrigin::Env(env.map_or_else(String::new, |e| e.to_string_lossy().into_owned()))
            }
            _ if self.file_keys.contains(key) => self.file_origin(),
            _ => ValueOrigin::Default,
        }
    }

    fn flag_origin(&self, key: &str) -> ValueOrigin {
        let command = serve_command();
        let long = command.get_arguments().find(|a| a.get_id() == key).and_then(|a| a.get_long()).unwrap_or(key);
        ValueOrigin::Flag(format!("--{long}"))
    }

    fn file_origin(&self) -> ValueOrigin {
        self.file.map_or(ValueOrigin::Default, |p| ValueOrigin::File(p.to_path_buf()))
    }

    fn error(&self, key: &str, message: impl Into<String>) -> ConfigError {
        let setting = key.split(['[', '.']).next().unwrap_or(key);
        ConfigError::new(key, self.origin(setting), message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Result<Config, ConfigError> {
        Config::from_args(args)
    }

    /// A config file with `text`, and the flags after it.
    fn with_file(text: &str, args: &[&str]) -> Result<Config, ConfigError> {
        static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kvindex-config-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kvindex.toml");
        std::fs::write(&path, text).unwrap();
        let mut argv = vec!["--config", path.to_str().unwrap()];
        argv.extend_from_slice(args);
        let result = config(&argv);
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    #[test]
    fn sglang_check_defaults_to_the_newest_release_and_pods_tile_the_block() {
        use kvindex::sglang::{EventFormat, SglangRelease};
        let c = config(&[]).unwrap().sglang_check;
        assert_eq!((c.release, c.format, c.every), (SglangRelease::new(0, 5, 23), EventFormat::Default, 16));
        let c = config(&["--sglang-release", "0.5.19.post1", "--sglang-event-format", "dynamo"]).unwrap().sglang_check;
        assert_eq!((c.release, c.format), (SglangRelease::new(0, 5, 19), EventFormat::Dynamo));
        assert_eq!(config(&["--sglang-release", "latest"]).unwrap_err().key, "sglang_release");
        assert_eq!(config(&["--sglang-event-format", "llmd"]).unwrap_err().key, "sglang_event_format");
        let e = config(&["--block-size", "16", "--pod", "a,m,tcp://h:1,engine=sglang,page_size=24"]).unwrap_err();
        assert_eq!(e.key, "pods.page_size");
        let e = with_file("[[pods]]\nid = \"a\"\nmodel = \"m\"\npage_size = 3\n", &[]).unwrap_err();
        assert_eq!(e.key, "pods[0].page_size");
        assert!(config(&["--block-size", "16", "--pod", "a,m,tcp://h:1,engine=sglang,page_size=32"]).is_ok());
    }

    #[test]
    fn bootstrap_settings_are_checked_together() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "sibling-test-token-0123456789abcdef").unwrap();
        let token = token.to_str().unwrap();
        assert!(config(&[]).unwrap().bootstrap_from.is_none());
        let c = config(&["--admin-token-file", token, "--bootstrap-from", "kvindex-indexer-peers:50051"]).unwrap();
        assert_eq!(c.bootstrap_from.unwrap().addr, "kvindex-indexer-peers:50051");
        assert_eq!((c.bootstrap_timeout_ms, c.sibling_check_interval_ms), (60_000, 0));
        let err = |args: &[&str]| config(args).unwrap_err().key;
        assert_eq!(err(&["--bootstrap-from", "peers:50051"]), "bootstrap_from", "no admin token to present");
        for bad in ["peers", ":50051", "peers:http", "http://peers:50051"] {
            assert_eq!(err(&["--admin-token-file", token, "--bootstrap-from", bad]), "bootstrap_from", "{bad}");
        }
        assert_eq!(err(&["--bootstrap-tls-ca", token]), "bootstrap_from", "TLS to no sibling");
        let from = ["--admin-token-file", token, "--bootstrap-from", "peers:50051"];
        assert_eq!(err(&[&from[..], &["--bootstrap-tls-ca", token]].concat()), "bootstrap_tls_ca", "not PEM");
        assert_eq!(err(&[&from[..], &["--bootstrap-tls-cert", token]].concat()), "bootstrap_tls_key");
        assert_eq!(err(&["--sibling-check-interval-ms", "1000"]), "sibling_check_interval_ms");
    }

    #[test]
    fn hash_seed_turns_the_vllm_hash_check_on() {
        assert!(config(&[]).unwrap().hash_check.is_none());
        let on = config(&["--hash-seed", "0"]).unwrap().hash_check.unwrap();
        assert_eq!(on.every, 16);
        assert_eq!(on.hasher.pythonhashseed.as_deref(), Some("0"));
        assert_eq!(config(&["--hash-seed", "0", "--hash-algo", "md5"]).unwrap_err().key, "hash_algo");
        let e = config(&["--hash-seed", "unset", "--vllm-version", "0.20.0"]).unwrap_err();
        assert_eq!(e.key, "hash_seed", "random NONE_HASH before 0.29");
        assert_eq!(config(&["--tokenizer-endpoint", "unix:/x"]).unwrap_err().key, "tokenizer_endpoint");
    }

    #[test]
    fn errors_name_the_key_and_where_it_came_from() {
        let e = config(&["--block-size", "0"]).unwrap_err();
        assert_eq!((e.key.as_str(), &e.origin), ("block_size", &ValueOrigin::Flag("--block-size".into())));
        assert_eq!(e.to_string(), "config error: block_size (flag --block-size): must be between 1 and 65536, got 0");
        let e = config(&["--block-size", "many"]).unwrap_err();
        assert_eq!((e.key.as_str(), &e.origin), ("block_size", &ValueOrigin::Flag("--block-size".into())));
        let e = config(&["--pod", "p,m"]).unwrap_err();
        assert_eq!((e.key.as_str(), &e.origin), ("pods", &ValueOrigin::Flag("--pod".into())));
        let e = config(&["--pod", "p,m,udp://x"]).unwrap_err();
        assert_eq!((e.key.as_str(), &e.origin), ("pods.endpoint", &ValueOrigin::Flag("--pod".into())));
        let e = with_file("grpc_addr = \"nope\"", &[]).unwrap_err();
        assert_eq!(e.key, "grpc_addr");
        assert!(matches!(e.origin, ValueOrigin::File(_)), "{e}");
        let e = with_file("[[pods]]\nid = \"a\"\nmodel = \"m\"\nendpoint = \"udp://x\"", &[]).unwrap_err();
        assert_eq!(e.key, "pods[0].endpoint");
        let e = with_file("bogus_key = 1", &[]).unwrap_err();
        assert!(e.to_string().contains("bogus_key"), "{e}");
        let e = with_file("block_size = 0", &["--block-size", "8", "--shards", "0"]).unwrap_err();
        assert_eq!((e.key.as_str(), &e.origin), ("shards", &ValueOrigin::Flag("--shards".into())));
        let e = config(&["--dp-naming", "sideways"]).unwrap_err();
        assert_eq!(e.key, "dp_naming");
    }

    #[test]
    fn flags_override_the_file_and_add_to_its_lists() {
        let file = "block_size = 32\nzmq_bind = \"tcp://*:5557\"\n[tier_weights]\nCPU = 0.5\nDISK = 0.1\n[[topic_map]]\ntopic_id = \"a\"\npod = \"b\"";
        let c = with_file(file, &["--block-size", "64", "--tier-weight", "CPU=0.25", "--topic-map", "c=d"]).unwrap();
        assert_eq!(c.block_size, 64);
        assert_eq!(c.zmq_bind.as_deref(), Some("tcp://0.0.0.0:5557"));
        assert_eq!((c.tier_weights["CPU"], c.tier_weights["DISK"]), (0.25, 0.1));
        assert_eq!(c.topic_map.iter().map(|t| t.pod.as_str()).collect::<Vec<_>>(), ["b", "d"]);
    }

    #[test]
    fn half_open_connections_get_a_share_of_the_listener_by_default() {
        let l = config(&["--zmq-max-connections", "16"]).unwrap().zmq_limits;
        assert_eq!((l.max_connections_per_source, l.max_handshaking, l.max_handshaking_per_source), (4, 4, 2));
        let l = config(&["--zmq-max-connections", "1024"]).unwrap().zmq_limits;
        assert_eq!((l.max_connections_per_source, l.max_handshaking, l.max_handshaking_per_source), (32, 256, 4));
        // Many publishers on one host, declared: they may connect at once.
        let l = config(&["--zmq-max-connections-per-source", "64"]).unwrap().zmq_limits;
        assert_eq!(l.max_handshaking_per_source, 64);
        let l = config(&["--zmq-max-handshaking", "9", "--zmq-max-handshaking-per-source", "3"]).unwrap().zmq_limits;
        assert_eq!((l.max_handshaking, l.max_handshaking_per_source), (9, 3));
        assert_eq!(config(&["--zmq-max-handshaking", "0"]).unwrap_err().key, "zmq_max_handshaking");
    }

    #[test]
    fn zmq_limits_are_checked_as_a_whole_and_name_the_key() {
        let c = config(&[]).unwrap();
        assert_eq!(c.zmq_limits.max_frame_size, 16 << 20);
        assert!(c.zmq_limits.max_connections >= 16 && c.zmq_limits.max_connections <= 1024);
        let c = config(&[
            "--zmq-max-connections-per-source",
            "4",
            "--zmq-idle-timeout-ms",
            "3000",
            "--zmq-heartbeat-interval-ms",
            "1000",
        ])
        .unwrap();
        assert_eq!(c.zmq_limits.max_connections_per_source, 4);
        assert_eq!(c.zmq_limits.idle_timeout, std::time::Duration::from_secs(3));
        assert_eq!(config(&["--zmq-max-parts", "0"]).unwrap_err().key, "zmq_max_parts");
        let e = config(&["--zmq-max-frame-bytes", "33554432"]).unwrap_err();
        assert_eq!(e.key, "zmq_max_message_bytes", "{e}");
        let e = config(&["--zmq-idle-timeout-ms", "5000"]).unwrap_err();
        assert_eq!((e.key.as_str(), &e.origin), ("zmq_heartbeat_interval_ms", &ValueOrigin::Default), "{e}");
        assert_eq!(
            config(&["--pod", "p,m,ipc:///run/engine.sock"]).unwrap().pods[0].endpoint.as_deref(),
            Some("ipc:///run/engine.sock")
        );
    }

    #[test]
    fn http_bounds_default_within_the_kept_descriptors_and_are_checked() {
        let c = config(&[]).unwrap();
        let (conn, body) = (c.http_conn_limits, c.http_body_limits);
        assert_eq!(
            (conn.max_connections, conn.max_connections_per_address, conn.max_connections_per_network),
            (64, 16, 32)
        );
        let probes = conn.for_probes().max_connections;
        assert!(
            2 * conn.max_connections as i64 + probes as i64 <= DESCRIPTORS_KEPT,
            "every HTTP listener full leaves room"
        );
        assert_eq!(conn.header_timeout, std::time::Duration::from_secs(10));
        assert_eq!(conn.write_timeout, std::time::Duration::from_secs(30));
        assert_eq!((body.max_bytes, body.max_inflight_bytes), (64 << 10, 1 << 20));
        let c = config(&["--http-max-connections", "8", "--http-max-body-bytes", "4194304"]).unwrap();
        assert_eq!(c.http_conn_limits.max_connections_per_address, 2);
        assert_eq!(c.http_conn_limits.max_connections_per_network, 4);
        let e = config(&["--http-max-connections", "8", "--http-max-connections-per-network", "9"]).unwrap_err();
        assert_eq!(e.key, "http_max_connections_per_network");
        assert_eq!(c.http_body_limits.max_inflight_bytes, 4 << 20, "the budget holds at least one body");
        let e = config(&["--http-max-connections", "8", "--http-max-connections-per-address", "9"]).unwrap_err();
        assert_eq!(e.key, "http_max_connections_per_address");
        let e = config(&["--http-max-body-bytes", "4096", "--http-max-inflight-body-bytes", "4095"]).unwrap_err();
        assert_eq!(e.key, "http_max_inflight_body_bytes");
        assert_eq!(config(&["--http-header-timeout-ms", "0"]).unwrap_err().key, "http_header_timeout_ms");
    }

    #[test]
    fn example_config_is_valid() {
        let c = with_file(include_str!("../../../../docs/kvindex.example.toml"), &[]).unwrap();
        assert_eq!(c.zmq_bind.as_deref(), Some("tcp://0.0.0.0:5557"));
        assert_eq!(c.pods.len(), 1);
        assert_eq!(c.replay[0].endpoint, "tcp://10.0.0.7:5558");
    }

    #[test]
    fn discovery_is_off_by_default_and_checked_when_on() {
        assert!(Config::from_args(["--block-size", "16"]).unwrap().discovery.is_none());
        let c = Config::from_args(["--discovery", "kubernetes", "--discovery-namespace", "llm"]).unwrap();
        let d = c.discovery.unwrap();
        assert_eq!((d.namespace.as_str(), d.label_selector.as_str()), ("llm", "llm-d.ai/inference-serving=true"));
        assert_eq!((d.settings.pub_port, d.settings.replay_port, d.settings.http_port), (5557, Some(5558), 8000));
        assert!(d.settings.model_required, "per-pod mode needs a model");
        let d = Config::from_args([
            "--discovery",
            "kubernetes",
            "--discovery-replay-port",
            "0",
            "--zmq-bind",
            "tcp://*:5557",
        ])
        .unwrap()
        .discovery
        .unwrap();
        assert_eq!(d.settings.replay_port, None);
        assert!(!d.settings.model_required, "central mode: the topic names the model");
        for (args, key) in [
            (&["--discovery", "consul"][..], "discovery"),
            (&["--discovery", "kubernetes", "--discovery-pub-port", "0"], "discovery_pub_port"),
            (&["--discovery", "kubernetes", "--discovery-dp-size", "129"], "discovery_dp_size"),
            (
                &["--discovery", "kubernetes", "--discovery-http-port", "65535", "--discovery-dp-size", "2"],
                "discovery_dp_size",
            ),
            (&["--discovery", "kubernetes", "--discovery-namespace", "a b"], "discovery_namespace"),
            (&["--discovery", "kubernetes", "--discovery-api-server", "10.0.0.1:6443"], "discovery_api_server"),
        ] {
            assert_eq!(Config::from_args(args).unwrap_err().key, key, "{args:?}");
        }
    }

    #[test]
    fn zmq_bind_dp_size_needs_a_tcp_port_with_room_for_every_rank() {
        let c = Config::from_args(["--zmq-bind", "tcp://*:5557", "--zmq-bind-dp-size", "4"]).unwrap();
        assert_eq!((c.zmq_bind.as_deref(), c.zmq_bind_dp_size), (Some("tcp://0.0.0.0:5557"), 4));
        assert_eq!(Config::from_args(["--zmq-bind", "tcp://*:0"]).unwrap().zmq_bind_dp_size, 1);
        for args in [
            &["--zmq-bind", "tcp://*:0", "--zmq-bind-dp-size", "2"][..],
            &["--zmq-bind", "ipc:///run/kv.sock", "--zmq-bind-dp-size", "2"],
            &["--zmq-bind", "tcp://*:65535", "--zmq-bind-dp-size", "2"],
            &["--pod", "a,m,tcp://h:1", "--zmq-bind-dp-size", "2"],
            &["--zmq-bind", "tcp://*:5557", "--zmq-bind-dp-size", "129"],
        ] {
            assert_eq!(Config::from_args(args).unwrap_err().key, "zmq_bind_dp_size", "{args:?}");
        }
    }
}
