//! The command line (`kvindex-router serve …`) and its validation into a [`Config`], so every
//! mistake is reported at start with the flag's name instead of surfacing as a routing error.
//!
//! The fixed contract is `--http-addr`, `--indexer`, `--pod` and `--tokenizer`; every other
//! flag has a default that works for a small fleet (docs/ROUTER-CONFIG.md lists each).

use std::path::PathBuf;
use std::time::Duration;

pub mod error;
pub mod ext_proc;

pub use error::ConfigError;

use clap::Args;
use kvindex_discovery::DiscoveryArgs;
use kvindex_tokenizer::client_template::{ClientTemplateArgs, SandboxLimits};

use crate::place::cost::{CostWeights, Policy};
use crate::pods::spec::{PodSpec, Role};
use ext_proc::{ExtProcArgs, ExtProcConfig};

/// `kvindex-router serve` flags.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// OpenAI-compatible proxy, /metrics, /healthz, /readyz and /debug/pods.
    #[arg(long, value_name = "HOST:PORT")]
    pub http_addr: String,
    /// Pod registration (`POST /pods`, `DELETE /pods/{id}`), on its own address so the public
    /// port cannot redirect traffic. Off unless given.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin_addr: Option<String>,
    /// A metrics-only listener: `/metrics` and `/debug/pods` move here (off `--http-addr` and
    /// `--admin-addr`). Unset: they are served on both.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// A listener for the kubelet's probes only: `/healthz` and `/readyz` (anything else 404),
    /// still also served on the other addresses. Clients of those cannot fill it, so the
    /// probes answer while `--http-addr` is full. Off unless given.
    #[arg(long, value_name = "HOST:PORT")]
    pub probe_addr: Option<String>,
    /// `kvindex serve` gRPC endpoints, tried in order with failover. None: load-only placement.
    #[arg(long = "indexer", value_name = "HOST:PORT", num_args = 1.., action = clap::ArgAction::Append)]
    pub indexers: Vec<String>,
    /// A pod serving both prefill and decode: `<pod-id>=<http-base-url>`, the pod id being the
    /// one the indexer reports (e.g. `10.0.0.7:8000=http://10.0.0.7:8000`). An engine serving
    /// several data-parallel ranks behind that URL (SGLang's `--dp-size`) adds
    /// `,dp_size=<n>[,dp_routing=engine|router]`: the engine picks the rank (the pod is credited
    /// what every rank holds), or the router names it (`X-Data-Parallel-Rank`).
    #[arg(long = "pod", value_name = "ID=URL", num_args = 1.., action = clap::ArgAction::Append)]
    pub pods: Vec<String>,
    /// A prefill-only pod (P/D disaggregation), `<pod-id>=<http-base-url>`.
    #[arg(long = "prefill-pod", value_name = "ID=URL", num_args = 1.., action = clap::ArgAction::Append)]
    pub prefill_pods: Vec<String>,
    /// A decode-only pod (P/D disaggregation), `<pod-id>=<http-base-url>`.
    #[arg(long = "decode-pod", value_name = "ID=URL", num_args = 1.., action = clap::ArgAction::Append)]
    pub decode_pods: Vec<String>,
    /// A JSON file listing pods (`[{"id", "url", "role"}]`), re-read when it changes.
    #[arg(long, value_name = "PATH")]
    pub pods_file: Option<PathBuf>,
    /// How often the pods file is checked for changes.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub pods_file_interval_ms: u64,
    /// In-process tokenizer for a served model: `<model>=<dir>` (tokenizer.json, chat template).
    #[arg(long = "tokenizer", value_name = "MODEL=DIR", num_args = 1.., action = clap::ArgAction::Append)]
    pub tokenizers: Vec<String>,
    /// A `kvindex-tokenizer` (or llm-d's tokenizer sidecar) over gRPC, for models without an
    /// in-process tokenizer.
    #[arg(long, value_name = "HOST:PORT")]
    pub tokenizer_endpoint: Option<String>,
    /// A served model without an in-process tokenizer (token-id prompts are scored; text is
    /// tokenized by --tokenizer-endpoint, or placed by load only).
    #[arg(long = "model", value_name = "NAME", num_args = 1.., action = clap::ArgAction::Append)]
    pub models: Vec<String>,
    /// A LoRA adapter served under its own model name: `<adapter>=<base-model>`.
    #[arg(long = "lora", value_name = "ADAPTER=BASE", num_args = 1.., action = clap::ArgAction::Append)]
    pub loras: Vec<String>,
    /// Tokens per KV block; must equal the indexer's (its answers win, with a warning).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// How long ScoreTokens may take before the request is placed by load only.
    #[arg(long, default_value_t = 5, value_name = "MS")]
    pub score_deadline_ms: u64,
    /// After this share of the deadline without an answer, the next indexer is asked too.
    #[arg(long, default_value_t = 0.5)]
    pub hedge_fraction: f64,
    /// PEM CA that signed the indexers' certificates: talk to `--indexer` over TLS.
    #[arg(long, value_name = "PATH")]
    pub indexer_tls_ca: Option<PathBuf>,
    /// PEM client certificate for the indexers' mTLS (with --indexer-tls-key).
    #[arg(long, value_name = "PATH")]
    pub indexer_tls_cert: Option<PathBuf>,
    /// PEM private key of --indexer-tls-cert.
    #[arg(long, value_name = "PATH")]
    pub indexer_tls_key: Option<PathBuf>,
    /// The name the indexers' certificates carry (default: the host of each --indexer).
    #[arg(long, value_name = "NAME")]
    pub indexer_tls_domain: Option<String>,
    /// File holding the indexers' admin bearer token (their `--admin-token-file`), sent with
    /// RecordRoute only: the indexer refuses RecordRoute without it. Unset: predict on route
    /// is off (RecordRoute is not called).
    #[arg(long, value_name = "PATH", env = "KVINDEX_INDEXER_ADMIN_TOKEN_FILE")]
    pub indexer_admin_token_file: Option<PathBuf>,
    /// An indexer endpoint that failed or timed out is skipped this long.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub indexer_retry_after_ms: u64,
    /// Cost of one uncached prompt block.
    #[arg(long, default_value_t = 1.0)]
    pub prefill_weight: f64,
    /// Cost of one block of prefill this router sent to the pod and has had no response byte
    /// for yet (work the pod computes before a new request's). 0 = ignore it.
    #[arg(long, default_value_t = 0.5)]
    pub queued_prefill_weight: f64,
    /// Cost of one running request on the pod (in uncached blocks).
    #[arg(long, default_value_t = 2.0)]
    pub decode_weight: f64,
    /// Cost of one waiting (queued) request on the pod (in uncached blocks).
    #[arg(long, default_value_t = 64.0)]
    pub queue_weight: f64,
    /// Cost of a full KV cache (times the pod's KV usage, 0–1), in uncached blocks, on a pod of
    /// at least --kv-reference-blocks KV blocks (or whose capacity is unknown).
    #[arg(long, default_value_t = 256.0)]
    pub kv_weight: f64,
    /// KV capacity (blocks of --block-size; a pod reports tokens: vLLM's `num_gpu_blocks` ×
    /// `block_size` from `vllm:cache_config_info`, SGLang's `sglang:max_total_num_tokens`)
    /// below which a full cache costs --kv-weight × capacity / this, so every token held costs
    /// alike on small and big pods, whatever their block or page size. 0 = --kv-weight on every pod.
    #[arg(long, default_value_t = crate::place::cost::DEFAULT_KV_REFERENCE_BLOCKS, value_name = "BLOCKS")]
    pub kv_reference_blocks: f64,
    /// Pods at or above this KV-cache usage (0–1) are picked only when every pod is.
    #[arg(long, default_value_t = 0.95)]
    pub kv_cutoff: f64,
    /// `cost` (default) or `load-band`: among pods whose load is within --load-band of the
    /// least loaded, the longest cached prefix, then load, then least recently picked.
    #[arg(long, value_enum, default_value_t = PolicyArg::Cost)]
    pub policy: PolicyArg,
    /// Width of the load band (requests above the minimum), for --policy load-band and for
    /// the prefill pick in P/D.
    #[arg(long, default_value_t = 1.0)]
    pub load_band: f64,
    /// How often each pod's /metrics is scraped.
    #[arg(long, default_value_t = 100, value_name = "MS")]
    pub scrape_interval_ms: u64,
    /// A scrape slower than this fails.
    #[arg(long, default_value_t = 500, value_name = "MS")]
    pub scrape_timeout_ms: u64,
    /// A scraped load older than this is ignored (own in-flight counts only).
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub load_stale_after_ms: u64,
    /// Largest request body accepted.
    #[arg(long, default_value_t = 16 << 20)]
    pub max_body_bytes: usize,
    /// Request body bytes held at once over all requests on `--http-addr` (503 with Retry-After
    /// past it); at least --max-body-bytes.
    #[arg(long, default_value_t = 256 << 20)]
    pub max_inflight_body_bytes: usize,
    /// Time for a request's headers to arrive (and for an idle keep-alive connection to start
    /// its next request) before the connection is closed.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub http_header_timeout_ms: u64,
    /// Time a write to a client may make no progress (a client that stopped reading its answer
    /// or its stream) before the connection is closed.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub http_write_timeout_ms: u64,
    /// Time for a whole request body to arrive (408 past it).
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    pub http_body_timeout_ms: u64,
    /// Most open connections per HTTP listener. At the cap the oldest idle connection makes
    /// room; a new connection is closed at accept only when every one is answering a request.
    #[arg(long, default_value_t = 2048)]
    pub max_connections: usize,
    /// Most open connections per HTTP listener from one client IP address (the same rule at
    /// the cap); at most --max-connections. Default: half of --max-connections.
    #[arg(long)]
    pub max_connections_per_address: Option<usize>,
    /// Most open connections per HTTP listener from one network, an IPv4 /24 or an IPv6 /64
    /// (the same rule at the cap); at most --max-connections. Default: three quarters of
    /// --max-connections.
    #[arg(long)]
    pub max_connections_per_network: Option<usize>,
    /// Longest prompt accepted, in tokens (after tokenization).
    #[arg(long, default_value_t = 262_144)]
    pub max_prompt_tokens: usize,
    /// Most messages in one chat request (400 past it, before any template or tokenizer runs).
    #[arg(long, default_value_t = 4096)]
    pub max_messages: usize,
    /// Further pods tried when a pod fails before sending any response byte.
    #[arg(long, default_value_t = 2)]
    pub upstream_retries: usize,
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub upstream_connect_timeout_ms: u64,
    /// Speculative credit (RecordRoute) asked of the indexer after each pick, so every replica
    /// sees the pick before the engine's events arrive; 0 turns RecordRoute off.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub speculative_ttl_ms: u64,
    /// A RecordRoute call (sent in the background, never delaying the request) is abandoned
    /// after this; so is a ReleaseRoute call.
    #[arg(long, default_value_t = 250, value_name = "MS")]
    pub record_route_timeout_ms: u64,
    /// Shared in-flight load: each request is reserved on every indexer (in its RecordRoute)
    /// for at most this long, and released at its first response byte (its prefill) and its
    /// end; the cost then counts every router's requests. The TTL ends the reservations of a
    /// router that dies. 0 = off (this router's own counts only). Needs
    /// --indexer-admin-token-file.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub reservation_ttl_ms: u64,
    #[command(flatten)]
    pub client_templates: ClientTemplateArgs,
    /// Log format: `text` or `json` (one object per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub ext_proc: ExtProcArgs,
    /// Kubernetes pod discovery (`--discovery kubernetes`): every Running, Ready pod matching
    /// the selector is a pod to route to, each DP rank r at `http://<podIP>:<http-port + r>`
    /// with the pod id `<podIP>:<http-port + r>` (the indexer's names for the same ranks). The
    /// flags, env vars, defaults and ranges are `kvindex-discovery`'s, shared with the indexer.
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    Cost,
    LoadBand,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub http_addr: String,
    pub admin_addr: Option<String>,
    pub metrics_addr: Option<String>,
    pub probe_addr: Option<String>,
    pub indexers: Vec<String>,
    pub pods: Vec<PodSpec>,
    pub pods_file: Option<PathBuf>,
    pub pods_file_interval: Duration,
    pub tokenizers: Vec<(String, PathBuf)>,
    pub tokenizer_endpoint: Option<String>,
    pub models: Vec<String>,
    /// adapter → base model.
    pub loras: Vec<(String, String)>,
    pub block_size: usize,
    pub score_deadline: Duration,
    pub hedge_after: Duration,
    pub indexer_retry_after: Duration,
    /// TLS to the indexers (`--indexer-tls-*`); `None`: plain gRPC.
    pub indexer_tls: Option<IndexerTls>,
    /// The indexers' admin token (`--indexer-admin-token-file`), for RecordRoute.
    pub indexer_admin_token: Option<IndexerToken>,
    pub weights: CostWeights,
    pub policy: Policy,
    pub load_band: f64,
    pub scrape_interval: Duration,
    pub scrape_timeout: Duration,
    pub load_stale_after: Duration,
    pub max_body_bytes: usize,
    pub max_inflight_body_bytes: usize,
    pub http_header_timeout: Duration,
    pub http_write_timeout: Duration,
    pub http_body_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_address: usize,
    pub max_connections_per_network: usize,
    pub max_prompt_tokens: usize,
    pub max_messages: usize,
    pub upstream_retries: usize,
    pub upstream_connect_timeout: Duration,
    pub speculative_ttl: Duration,
    pub record_route_timeout: Duration,
    /// Each request's reservation on the indexers; zero = off.
    pub reservation_ttl: Duration,
    pub log_format: LogFormat,
    /// Budgets of client-supplied chat templates (`--allow-client-chat-template`); `None`:
    /// refused.
    pub client_chat_templates: Option<SandboxLimits>,
    /// The Gateway API endpoint picker (`--ext-proc-*`), when `--ext-proc-addr` is given.
    pub ext_proc: Option<ExtProcConfig>,
    /// Kubernetes pod discovery (`--discovery kubernetes`).
    pub discovery: Option<kvindex_discovery::WatchConfig>,
}

/// TLS to the indexers: the CA to trust, the client identity for mTLS, the name to check.
#[derive(Clone)]
pub struct IndexerTls {
    pub ca_pem: Vec<u8>,
    /// (certificate, key) PEM.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    pub domain: Option<String>,
}

impl std::fmt::Debug for IndexerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("IndexerTls").field("mutual", &self.identity.is_some()).field("domain", &self.domain).finish()
    }
}

impl IndexerTls {
    fn from_args(args: &ServeArgs) -> Result<Option<IndexerTls>, ConfigError> {
        let read = |flag: &'static str, path: &PathBuf| {
            let pem = std::fs::read(path).map_err(|e| err(flag, format!("cannot read {}: {e}", path.display())))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN ") {
                return Err(err(flag, format!("{} is not PEM", path.display())));
            }
            Ok(pem)
        };
        let identity = match (&args.indexer_tls_cert, &args.indexer_tls_key) {
            (Some(cert), Some(key)) => Some((read("--indexer-tls-cert", cert)?, read("--indexer-tls-key", key)?)),
            (None, None) => None,
            (Some(_), None) => return Err(err("--indexer-tls-key", "--indexer-tls-cert needs --indexer-tls-key")),
            (None, Some(_)) => return Err(err("--indexer-tls-cert", "--indexer-tls-key needs --indexer-tls-cert")),
        };
        let Some(ca) = &args.indexer_tls_ca else {
            if identity.is_some() || args.indexer_tls_domain.is_some() {
                return Err(err("--indexer-tls-ca", "the other --indexer-tls-* flags need --indexer-tls-ca"));
            }
            return Ok(None);
        };
        Ok(Some(IndexerTls {
            ca_pem: read("--indexer-tls-ca", ca)?,
            identity,
            domain: args.indexer_tls_domain.clone(),
        }))
    }
}

/// Why a token file's text is not a token the indexer would take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token must have at least {min} characters")]
    TooShort { min: usize },
    #[error("the token must be printable ASCII without spaces")]
    NotPrintable,
    #[error("the token is not a valid header value")]
    NotAHeader,
    #[error(
        "the token is still the deploy manifests' placeholder (it starts with {prefix}): put a random token in the \
         Secret kvindex-admin-token (deploy/README.md, \"The admin token\")"
    )]
    Placeholder { prefix: &'static str },
}

/// The indexers' admin bearer token, as the `authorization` value RecordRoute sends. Never
/// printed.
#[derive(Clone)]
pub struct IndexerToken(tonic::metadata::AsciiMetadataValue);

impl std::fmt::Debug for IndexerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IndexerToken(<redacted>)")
    }
}

impl IndexerToken {
    /// Fewest characters a token may have: the indexer's own rule (`kvindex serve
    /// --admin-token-file`), so a token it would refuse is refused here, at start.
    const MIN_LEN: usize = 16;

    /// How the deploy manifests' placeholder token begins: the indexer refuses it, so it is
    /// refused here too, at start, with the same message.
    const PLACEHOLDER_PREFIX: &'static str = "REPLACE-ME";

    /// The token in a file's `text` (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<IndexerToken, TokenError> {
        let token = text.trim();
        if token.len() < Self::MIN_LEN {
            return Err(TokenError::TooShort { min: Self::MIN_LEN });
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotPrintable);
        }
        if token.starts_with(Self::PLACEHOLDER_PREFIX) {
            return Err(TokenError::Placeholder { prefix: Self::PLACEHOLDER_PREFIX });
        }
        let mut value: tonic::metadata::AsciiMetadataValue =
            format!("Bearer {token}").parse().map_err(|_| TokenError::NotAHeader)?;
        value.set_sensitive(true);
        Ok(IndexerToken(value))
    }

    fn from_file(path: &PathBuf) -> Result<IndexerToken, ConfigError> {
        let flag = "--indexer-admin-token-file";
        let text =
            std::fs::read_to_string(path).map_err(|e| err(flag, format!("cannot read {}: {e}", path.display())))?;
        IndexerToken::parse(&text).map_err(|m| err(flag, format!("{}: {m}", path.display())))
    }

    /// The `authorization` metadata value: `Bearer <token>`.
    pub fn authorization(&self) -> tonic::metadata::AsciiMetadataValue {
        self.0.clone()
    }
}

fn err(flag: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError { flag, message: message.into() }
}

/// `<id>=<http-base-url>[,dp_size=<n>][,dp_routing=engine|router]` → a pod spec with the URL
/// normalized (no trailing slash).
pub fn parse_pod(flag: &'static str, spec: &str, role: Role) -> Result<PodSpec, ConfigError> {
    let (id, rest) = spec
        .split_once('=')
        .filter(|(id, rest)| !id.trim().is_empty() && !rest.trim().is_empty())
        .ok_or_else(|| err(flag, format!("expected <pod-id>=<http-base-url>, got {spec:?}")))?;
    let mut parts = rest.split(',');
    let url = parts.next().unwrap_or_default();
    let mut pod = PodSpec::new(id.trim(), normalize_url(flag, url.trim())?, role);
    for option in parts {
        pod.set_option(option).map_err(|message| err(flag, format!("{spec:?}: {message}")))?;
    }
    match pod.dp_refusal() {
        Some(message) => Err(err(flag, format!("{spec:?}: {message}"))),
        None => Ok(pod),
    }
}

/// Checks a pod base URL: plain `http://host:port[/prefix]` (TLS to pods belongs in a sidecar).
pub fn normalize_url(flag: &'static str, url: &str) -> Result<String, ConfigError> {
    let uri: hyper::Uri = url.parse().map_err(|e| err(flag, format!("{url:?} is not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(err(flag, format!("{url:?}: https upstreams are not supported (use http, or a TLS sidecar)")))
        }
        _ => return Err(err(flag, format!("{url:?} must start with http://"))),
    }
    if uri.authority().is_none() {
        return Err(err(flag, format!("{url:?} has no host")));
    }
    if uri.query().is_some() {
        return Err(err(flag, format!("{url:?} must not have a query")));
    }
    Ok(url.trim_end_matches('/').to_string())
}

fn check_host_port(flag: &'static str, addr: &str) -> Result<(), ConfigError> {
    let ok = addr.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if ok {
        Ok(())
    } else {
        Err(err(flag, format!("expected <host>:<port>, got {addr:?}")))
    }
}

fn positive_ms(flag: &'static str, ms: u64) -> Result<Duration, ConfigError> {
    if ms == 0 {
        return Err(err(flag, "must be at least 1"));
    }
    Ok(Duration::from_millis(ms))
}

impl ServeArgs {
    /// Validates every flag; the first mistake is returned.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        check_host_port("--http-addr", &self.http_addr)?;
        if let Some(addr) = &self.admin_addr {
            check_host_port("--admin-addr", addr)?;
        }
        if let Some(addr) = &self.metrics_addr {
            check_host_port("--metrics-addr", addr)?;
        }
        if let Some(addr) = &self.probe_addr {
            check_host_port("--probe-addr", addr)?;
        }
        for addr in &self.indexers {
            check_host_port("--indexer", addr)?;
        }
        if let Some(addr) = &self.tokenizer_endpoint {
            check_host_port("--tokenizer-endpoint", addr)?;
        }
        let mut pods = Vec::new();
        for (flag, specs, role) in [
            ("--pod", &self.pods, Role::Both),
            ("--prefill-pod", &self.prefill_pods, Role::Prefill),
            ("--decode-pod", &self.decode_pods, Role::Decode),
        ] {
            for spec in specs {
                let pod = parse_pod(flag, spec, role)?;
                if pods.iter().any(|p: &PodSpec| p.id == pod.id) {
                    return Err(err(flag, format!("pod {:?} is given twice", pod.id)));
                }
                pods.push(pod);
            }
        }
        let indexer_tls = IndexerTls::from_args(&self)?;
        let indexer_admin_token = self.indexer_admin_token_file.as_ref().map(IndexerToken::from_file).transpose()?;
        let mut discovery = self.discovery.watch_config(false).map_err(|e| err(e.flag(), e.message))?;
        // The fleet keeps no engine per pod (it routes by HTTP and scrapes `/metrics`), so
        // asking pods what engine they are would only delay their arrival.
        if let Some(watch) = discovery.as_mut() {
            watch.settings.engine_probe = None;
        }
        if pods.is_empty() && self.pods_file.is_none() && self.admin_addr.is_none() && discovery.is_none() {
            return Err(err(
                "--pod",
                "no pods: give --pod, --pods-file, --discovery kubernetes, or --admin-addr for registration",
            ));
        }
        let mut tokenizers = Vec::new();
        for spec in &self.tokenizers {
            let (model, dir) = spec
                .split_once('=')
                .filter(|(m, d)| !m.is_empty() && !d.is_empty())
                .ok_or_else(|| err("--tokenizer", format!("expected <model>=<dir>, got {spec:?}")))?;
            let dir = PathBuf::from(dir);
            if !dir.join("tokenizer.json").is_file() {
                return Err(err("--tokenizer", format!("{}: no tokenizer.json there", dir.display())));
            }
            if tokenizers.iter().any(|(m, _): &(String, PathBuf)| m == model) {
                return Err(err("--tokenizer", format!("model {model:?} is given twice")));
            }
            tokenizers.push((model.to_string(), dir));
        }
        let mut loras = Vec::new();
        for spec in &self.loras {
            let (adapter, base) = spec
                .split_once('=')
                .filter(|(a, b)| !a.is_empty() && !b.is_empty())
                .ok_or_else(|| err("--lora", format!("expected <adapter>=<base-model>, got {spec:?}")))?;
            loras.push((adapter.to_string(), base.to_string()));
        }
        if self.block_size == 0 {
            return Err(err("--block-size", "must be at least 1"));
        }
        if !(0.0..1.0).contains(&self.hedge_fraction) {
            return Err(err("--hedge-fraction", "must be in [0, 1)"));
        }
        for (flag, v) in [
            ("--prefill-weight", self.prefill_weight),
            ("--queued-prefill-weight", self.queued_prefill_weight),
            ("--decode-weight", self.decode_weight),
            ("--queue-weight", self.queue_weight),
            ("--kv-weight", self.kv_weight),
            ("--kv-reference-blocks", self.kv_reference_blocks),
            ("--load-band", self.load_band),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(err(flag, "must be a finite number ≥ 0"));
            }
        }
        if !(self.kv_cutoff > 0.0 && self.kv_cutoff <= 1.0) {
            return Err(err("--kv-cutoff", "must be in (0, 1]"));
        }
        if self.max_body_bytes < 1024 {
            return Err(err("--max-body-bytes", "must be at least 1024"));
        }
        if self.max_prompt_tokens == 0 {
            return Err(err("--max-prompt-tokens", "must be at least 1"));
        }
        if self.max_inflight_body_bytes < self.max_body_bytes {
            return Err(err(
                "--max-inflight-body-bytes",
                format!("must be at least --max-body-bytes ({})", self.max_body_bytes),
            ));
        }
        if self.max_connections == 0 {
            return Err(err("--max-connections", "must be at least 1"));
        }
        let share = |flag: &'static str, given: Option<usize>, default: usize| match given {
            None => Ok(default.max(1)),
            Some(0) => Err(err(flag, "must be at least 1")),
            Some(n) if n > self.max_connections => {
                Err(err(flag, format!("must be at most --max-connections ({})", self.max_connections)))
            }
            Some(n) => Ok(n),
        };
        let max_connections_per_address =
            share("--max-connections-per-address", self.max_connections_per_address, self.max_connections / 2)?;
        let max_connections_per_network =
            share("--max-connections-per-network", self.max_connections_per_network, self.max_connections / 4 * 3)?;
        if self.max_messages == 0 {
            return Err(err("--max-messages", "must be at least 1"));
        }
        let score_deadline = positive_ms("--score-deadline-ms", self.score_deadline_ms)?;
        let client_chat_templates = self.client_templates.limits().map_err(|(flag, message)| err(flag, message))?;
        let policy = match self.policy {
            PolicyArg::Cost => Policy::Cost,
            PolicyArg::LoadBand => Policy::LoadBand { band: self.load_band },
        };
        Ok(Config {
            http_addr: self.http_addr,
            admin_addr: self.admin_addr,
            metrics_addr: self.metrics_addr,
            probe_addr: self.probe_addr,
            indexers: self.indexers,
            pods,
            pods_file: self.pods_file,
            pods_file_interval: positive_ms("--pods-file-interval-ms", self.pods_file_interval_ms)?,
            tokenizers,
            tokenizer_endpoint: self.tokenizer_endpoint,
            models: self.models,
            loras,
            block_size: self.block_size,
            score_deadline,
            hedge_after: score_deadline.mul_f64(self.hedge_fraction),
            indexer_retry_after: positive_ms("--indexer-retry-after-ms", self.indexer_retry_after_ms)?,
            indexer_tls,
            indexer_admin_token,
            weights: CostWeights {
                prefill: self.prefill_weight,
                queued_prefill: self.queued_prefill_weight,
                decode: self.decode_weight,
                queue: self.queue_weight,
                kv: self.kv_weight,
                kv_reference_blocks: self.kv_reference_blocks,
                kv_cutoff: self.kv_cutoff,
            },
            policy,
            load_band: self.load_band,
            scrape_interval: positive_ms("--scrape-interval-ms", self.scrape_interval_ms)?,
            scrape_timeout: positive_ms("--scrape-timeout-ms", self.scrape_timeout_ms)?,
            load_stale_after: positive_ms("--load-stale-after-ms", self.load_stale_after_ms)?,
            max_body_bytes: self.max_body_bytes,
            max_inflight_body_bytes: self.max_inflight_body_bytes,
            http_header_timeout: positive_ms("--http-header-timeout-ms", self.http_header_timeout_ms)?,
            http_write_timeout: positive_ms("--http-write-timeout-ms", self.http_write_timeout_ms)?,
            http_body_timeout: positive_ms("--http-body-timeout-ms", self.http_body_timeout_ms)?,
            max_connections: self.max_connections,
            max_connections_per_address,
            max_connections_per_network,
            max_prompt_tokens: self.max_prompt_tokens,
            max_messages: self.max_messages,
            upstream_retries: self.upstream_retries,
            upstream_connect_timeout: positive_ms("--upstream-connect-timeout-ms", self.upstream_connect_timeout_ms)?,
            speculative_ttl: Duration::from_millis(self.speculative_ttl_ms),
            record_route_timeout: positive_ms("--record-route-timeout-ms", self.record_route_timeout_ms)?,
            reservation_ttl: Duration::from_millis(self.reservation_ttl_ms),
            log_format: self.log_format,
            client_chat_templates,
            ext_proc: self.ext_proc.into_config(check_host_port, self.max_body_bytes)?,
            discovery,
        })
    }
}

impl Config {
    /// Models this router serves by name (tokenizers, --model, LoRA adapters); empty means
    /// any model name is passed through.
    pub fn served_models(&self) -> Vec<String> {
        let mut models: Vec<String> = self.tokenizers.iter().map(|(m, _)| m.clone()).collect();
        models.extend(self.models.iter().cloned());
        models.extend(self.loras.iter().map(|(a, _)| a.clone()));
        models.sort();
        models.dedup();
        models
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pods::spec::DpRouting;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeArgs,
    }

    /// `kvindex-router serve`'s flags `args` made into a config (or its error), for every config test.
    pub(crate) fn parse(args: &[&str]) -> Result<Config, String> {
        let cli = Cli::try_parse_from(std::iter::once("kvindex-router").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.args.into_config().map_err(|e| e.to_string())
    }

    #[test]
    fn the_fixed_contract_parses_with_repeated_and_multi_valued_flags() {
        let config = parse(&[
            "--http-addr",
            "127.0.0.1:8080",
            "--indexer",
            "127.0.0.1:50051",
            "127.0.0.1:50052",
            "--pod",
            "127.0.0.1:8001=http://127.0.0.1:8001/",
            "--pod",
            "127.0.0.1:8002=http://127.0.0.1:8002",
        ])
        .unwrap();
        assert_eq!(config.indexers, ["127.0.0.1:50051", "127.0.0.1:50052"]);
        assert_eq!(config.pods.len(), 2);
        assert_eq!(config.pods[0].url, "http://127.0.0.1:8001", "trailing slash dropped");
        assert_eq!(config.pods[0].role, Role::Both);
        assert!(config.client_chat_templates.is_none(), "client chat templates are off by default");
        assert_eq!((config.pods[0].dp_size, config.pods[0].dp_routing), (1, DpRouting::Engine));
    }

    #[test]
    fn a_pod_serving_data_parallel_ranks_behind_its_url_says_so_and_who_picks_the_rank() {
        let config = parse(&[
            "--http-addr",
            "127.0.0.1:8080",
            "--pod",
            "10.0.0.7:30000=http://10.0.0.7:30000/,dp_size=2",
            "--pod",
            "10.0.0.8:30000=http://10.0.0.8:30000,dp_size=4,dp_routing=router",
            "--decode-pod",
            "10.0.0.9:30000=http://10.0.0.9:30000,dp_size=2,dp_routing=router",
        ])
        .unwrap();
        let shapes: Vec<_> = config.pods.iter().map(|p| (p.url.as_str(), p.dp_size, p.dp_routing)).collect();
        assert_eq!(
            shapes,
            [
                ("http://10.0.0.7:30000", 2, DpRouting::Engine),
                ("http://10.0.0.8:30000", 4, DpRouting::Router),
                ("http://10.0.0.9:30000", 2, DpRouting::Router),
            ]
        );
    }

    #[test]
    fn the_indexer_admin_token_is_read_checked_and_never_printed() {
        let dir = std::env::temp_dir().join(format!("kvindex-router-token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (good, short, placeholder) = (dir.join("good"), dir.join("short"), dir.join("placeholder"));
        std::fs::write(&good, "  0123456789abcdef-secret\n").unwrap();
        std::fs::write(&short, "tooshort").unwrap();
        std::fs::write(&placeholder, "REPLACE-ME-with-a-random-token\n").unwrap();
        let base = ["--http-addr", "127.0.0.1:8080", "--pod", "a=http://x:1", "--indexer-admin-token-file"];
        let config = parse(&[&base[..], &[good.to_str().unwrap()]].concat()).unwrap();
        let token = config.indexer_admin_token.clone().expect("a token");
        assert_eq!(token.authorization().to_str().unwrap(), "Bearer 0123456789abcdef-secret");
        assert!(!format!("{token:?} {config:?}").contains("secret"), "the token is never printed");
        let e = parse(&[&base[..], &[short.to_str().unwrap()]].concat()).unwrap_err();
        assert!(e.contains("--indexer-admin-token-file") && e.contains("at least 16"), "{e}");
        let e = parse(&[&base[..], &[placeholder.to_str().unwrap()]].concat()).unwrap_err();
        assert!(e.contains("placeholder") && e.contains("Secret kvindex-admin-token"), "{e}");
        assert!(parse(&base[..4]).unwrap().indexer_admin_token.is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn discovery_alone_is_a_source_of_pods_with_the_indexers_defaults() {
        let config = parse(&["--http-addr", "127.0.0.1:8080", "--discovery", "kubernetes"]).unwrap();
        let d = config.discovery.unwrap();
        assert_eq!(d.label_selector, "llm-d.ai/inference-serving=true");
        assert_eq!((d.settings.http_port, d.settings.dp_size, d.settings.replay_port), (8000, 1, Some(5558)));
        assert!(parse(&["--http-addr", "127.0.0.1:8080"]).unwrap_err().contains("no pods"));
    }

    #[test]
    fn the_per_address_and_per_network_caps_default_to_shares_of_the_total() {
        let base = ["--http-addr", "127.0.0.1:8080", "--pod", "a=http://x:1"];
        let caps = |c: Config| (c.max_connections, c.max_connections_per_address, c.max_connections_per_network);
        assert_eq!(caps(parse(&base).unwrap()), (2048, 1024, 1536));
        assert_eq!(caps(parse(&[&base[..], &["--max-connections", "1"]].concat()).unwrap()), (1, 1, 1));
        let given =
            ["--max-connections", "8", "--max-connections-per-address", "8", "--max-connections-per-network", "2"];
        assert_eq!(caps(parse(&[&base[..], &given[..]].concat()).unwrap()), (8, 8, 2));
    }

    #[test]
    fn mistakes_name_the_flag() {
        let base = ["--http-addr", "127.0.0.1:8080"];
        let cases: &[(&[&str], &str)] = &[
            (&["--pod", "nourl"], "--pod: expected <pod-id>=<http-base-url>"),
            (&["--pod", "a=https://x:1"], "https upstreams are not supported"),
            (&["--pod", "a=http://x:1,dp_size=0"], "--pod: \"a=http://x:1,dp_size=0\": dp_size must be 1–128"),
            (&["--pod", "a=http://x:1,dp=2"], "unknown option \"dp\""),
            (&["--pod", "a=http://x:1,dp_routing=gateway"], "dp_routing must be engine or router"),
            (&["--prefill-pod", "a=http://x:1,dp_size=2,dp_routing=router"], "cannot name the rank of a prefill pod"),
            (&["--pod", "a=ftp://x:1"], "must start with http://"),
            (&["--pod", "a=http://x:1", "--pod", "a=http://y:1"], "given twice"),
            (&["--pod", "a=http://x:1", "--indexer", "nohostport"], "--indexer: expected <host>:<port>"),
            (&["--pod", "a=http://x:1", "--tokenizer", "m=/nonexistent"], "no tokenizer.json"),
            (&["--pod", "a=http://x:1", "--kv-cutoff", "1.5"], "--kv-cutoff"),
            (&["--pod", "a=http://x:1", "--kv-weight", "NaN"], "--kv-weight: must be a finite number"),
            (&["--pod", "a=http://x:1", "--queue-weight=-1"], "--queue-weight: must be a finite number"),
            (&["--pod", "a=http://x:1", "--kv-reference-blocks=-5"], "--kv-reference-blocks"),
            (&["--pod", "a=http://x:1", "--score-deadline-ms", "0"], "--score-deadline-ms: must be at least 1"),
            (&[], "no pods"),
            (&["--discovery", "consul"], "--discovery: must be \"kubernetes\" or \"none\""),
            (&["--discovery", "kubernetes", "--discovery-dp-size", "0"], "--discovery-dp-size"),
            (&["--discovery", "kubernetes", "--discovery-namespace", "No"], "--discovery-namespace"),
            (&["--pod", "a=http://x:1", "--client-chat-template-memory-mib", "1"], "--client-chat-template-memory-mib"),
            (&["--pod", "a=http://x:1", "--client-chat-template-timeout-ms", "0"], "--client-chat-template-timeout-ms"),
            (
                &["--pod", "a=http://x:1", "--indexer-admin-token-file", "/nonexistent/token"],
                "--indexer-admin-token-file: cannot read /nonexistent/token",
            ),
            (&["--pod", "a=http://x:1", "--max-connections-per-address", "0"], "--max-connections-per-address"),
            (
                &["--pod", "a=http://x:1", "--max-connections", "8", "--max-connections-per-network", "9"],
                "--max-connections-per-network: must be at most --max-connections (8)",
            ),
            (&["--pod", "a=http://x:1", "--probe-addr", "nohostport"], "--probe-addr: expected <host>:<port>"),
        ];
        for (extra, expected) in cases {
            let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
            let error = parse(&args).expect_err(expected);
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }
}
