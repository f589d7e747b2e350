//! The settings of `kvindex serve`, each declared once: one entry holds its doc, its flag and
//! env var (clap), its file key (the field's name, serde) and its default and range (the spec
//! after `=`, read by `validate`). The `settings!` macro turns the entries into the
//! [`Settings`] struct clap and serde parse, and into [`defs`], one spec per setting;
//! [`table`] joins the two for the docs test and the file loader's unknown-key check.

use std::path::PathBuf;

use clap::{Args, Command};
use kvindex_discovery::args::{self as discovery_args, DiscoveryArgs};
use serde::Deserialize;

use super::pod::{PodConfig, ReplayEntry, TierWeight, TopicMapEntry};
use super::spec::{self, ChoiceSpec, IntSpec, ListSpec, Setting, Spec, TextSpec};

const GIB: i64 = 1 << 30;

/// Declares the settings: each entry is its doc, `#[arg(..)]` (and `#[serde(..)]`), then
/// `name: type = spec`. See the module doc.
macro_rules! settings {
    ($( $(#[$attr:meta])* $field:ident : $ty:ty = $spec:ident { $($body:tt)* } ),* $(,)?) => {
        /// The settings of `kvindex serve`: each one a flag (`--kebab-case`), a TOML key (the
        /// field's name) and, for single values, an env var (`KVINDEX_UPPER_SNAKE`). Unset
        /// everywhere means the default (applied when the layers are validated into the
        /// runtime `Config`). List flags add to the file's lists.
        #[derive(Debug, Clone, Default, Args, Deserialize)]
        #[serde(default)]
        pub struct Settings {
            $( $(#[$attr])* pub $field: $ty, )*
            /// Kubernetes pod discovery (the `discovery_*` settings), declared and checked once
            /// by `kvindex-discovery` for both services.
            #[command(flatten)]
            #[serde(flatten)]
            pub discovery: DiscoveryArgs,
        }

        /// Each setting's default and range, named after the setting.
        #[allow(non_upper_case_globals)]
        pub mod defs {
            use super::*;
            $( pub const $field: $spec = $spec { key: stringify!($field), $($body)* }; )*
        }

        /// The specs of the settings declared here (discovery's come from its crate).
        const OWN_SPECS: &[Spec] = &[ $( defs::$field.entry(), )* ];
    };
}

settings! {
    /// gRPC listen address (port 0 = any free port; the bound address is printed).
    #[arg(long, env = "KVINDEX_GRPC_ADDR")]
    grpc_addr: Option<String> = TextSpec { default: Some("127.0.0.1:50051") },
    /// HTTP admin listen address.
    #[arg(long, env = "KVINDEX_HTTP_ADDR")]
    http_addr: Option<String> = TextSpec { default: Some("127.0.0.1:9090") },
    /// Canonical block size of the index (engines must use a multiple of it).
    #[arg(long, env = "KVINDEX_BLOCK_SIZE")]
    block_size: Option<i64> = IntSpec { default: Some(16), min: 1, max: 1 << 16 },
    /// The engines' PYTHONHASHSEED (`unset` = not set), for the sampled cross-check of vLLM's
    /// own block hashes. Setting it turns the check on; matching never depends on it.
    #[arg(long, env = "KVINDEX_HASH_SEED")]
    hash_seed: Option<String> = TextSpec { default: None },
    /// vLLM release of the engines, for the hash cross-check's rules (default 0.33.0).
    #[arg(long, env = "KVINDEX_VLLM_VERSION")]
    vllm_version: Option<String> = TextSpec { default: Some("0.33.0") },
    /// The engines' `--prefix-caching-hash-algo` (default sha256_cbor).
    #[arg(long, env = "KVINDEX_HASH_ALGO")]
    hash_algo: Option<String> = TextSpec { default: Some("sha256_cbor") },
    /// The SGLang release of SGLang sources no pod entry names one for, for the sampled
    /// page-hash cross-check's rules (default 0.5.23; before 0.5.6: no check).
    #[arg(long, env = "KVINDEX_SGLANG_RELEASE")]
    sglang_release: Option<String> = TextSpec { default: Some("0.5.23") },
    /// SGLang's `kv_events_config.format` of SGLang sources no pod entry names one for.
    #[arg(long, env = "KVINDEX_SGLANG_EVENT_FORMAT")]
    sglang_event_format: Option<String> = ChoiceSpec { default: "default", choices: &["default", "dynamo"] },
    /// Cross-check one in this many stores per pod (default 16; 0 = off).
    #[arg(long, env = "KVINDEX_HASH_CHECK_EVERY")]
    hash_check_every: Option<i64> = IntSpec { default: Some(16), min: 0, max: u32::MAX as i64 },
    /// In-process tokenizer for llm-d's GetPodScores: `<model>=<dir>` (repeatable).
    #[arg(long = "tokenizer-model", value_name = "MODEL=DIR")]
    tokenizer_models: Vec<String> = ListSpec {},
    /// In-process tokenizers: every subdirectory holding a tokenizer.json is a model.
    #[arg(long, env = "KVINDEX_TOKENIZER_MODELS_DIR")]
    tokenizer_models_dir: Option<String> = TextSpec { default: None },
    /// Remote tokenizer for GetPodScores (`http://host:port` of kvindex-tokenizer or llm-d's
    /// sidecar), used when no in-process tokenizer is configured.
    #[arg(long, env = "KVINDEX_TOKENIZER_ENDPOINT")]
    tokenizer_endpoint: Option<String> = TextSpec { default: None },
    /// Central mode: bind a SUB socket here (e.g. tcp://*:5557) that engines dial.
    #[arg(long, env = "KVINDEX_ZMQ_BIND")]
    zmq_bind: Option<String> = TextSpec { default: None },
    /// Central mode: also listen on `zmq_bind`'s port + r for each DP rank r below this, since
    /// an engine's rank r dials its configured port + r (vLLM's and SGLang's
    /// `offset_endpoint_port`). A `tcp://` endpoint with a port other than 0.
    #[arg(long, env = "KVINDEX_ZMQ_BIND_DP_SIZE")]
    zmq_bind_dp_size: Option<i64> = IntSpec { default: Some(1), min: 1, max: 128 },
    /// Per-pod mode: `<pod-id>,<model>,<pub-endpoint>[,<replay-endpoint>]` (repeatable).
    #[arg(long = "pod", value_name = "POD", value_parser = PodConfig::from_flag)]
    pods: Vec<PodConfig> = ListSpec {},
    /// Replay endpoint of a central-mode pod: `<pod-id>=<replay-endpoint>` (repeatable).
    #[arg(long = "replay", value_name = "POD=ENDPOINT", value_parser = ReplayEntry::from_flag)]
    replay: Vec<ReplayEntry> = ListSpec {},
    /// Topic id → pod id: `<topic-id>=<pod-id>` (repeatable; default identity).
    #[arg(long = "topic-map", value_name = "TOPIC_ID=POD", value_parser = TopicMapEntry::from_flag)]
    topic_map: Vec<TopicMapEntry> = ListSpec {},
    /// How a central-mode DP rank's pod is named: `port-offset` (llm-d: `<addr>:<port+rank>`
    /// from the topic's id, for engines whose ranks share one topic) or `topic` (the topic's id
    /// already names the rank's pod).
    #[arg(long, env = "KVINDEX_DP_NAMING")]
    dp_naming: Option<String> = ChoiceSpec { default: "port-offset", choices: &["port-offset", "topic"] },
    /// The engine family of a source no pod entry names an engine for (central-mode topics
    /// of unregistered pods, pods without `engine`): `vllm`, `sglang` or `trtllm`.
    #[arg(long, env = "KVINDEX_DEFAULT_ENGINE")]
    default_engine: Option<String> = ChoiceSpec { default: "vllm", choices: &["vllm", "sglang", "trtllm"] },
    /// SUB subscription prefix.
    #[arg(long, env = "KVINDEX_TOPIC_FILTER")]
    topic_filter: Option<String> = TextSpec { default: Some("kv@") },
    /// Largest ZeroMQ frame accepted from any peer (live and replay); a bigger declared frame
    /// closes the connection before anything is allocated. Default 16 MiB.
    #[arg(long, env = "KVINDEX_ZMQ_MAX_FRAME_BYTES")]
    zmq_max_frame_bytes: Option<i64> = IntSpec { default: Some(16 << 20), min: 1, max: 64 * GIB },
    /// Largest ZeroMQ message (all its frames), also the most an unfinished multi-part message
    /// may hold. Default 16 MiB.
    #[arg(long, env = "KVINDEX_ZMQ_MAX_MESSAGE_BYTES")]
    zmq_max_message_bytes: Option<i64> = IntSpec { default: Some(16 << 20), min: 1, max: 64 * GIB },
    /// Most frames in one ZeroMQ message (vLLM sends 3 or 4). Default 16.
    #[arg(long, env = "KVINDEX_ZMQ_MAX_PARTS")]
    zmq_max_parts: Option<i64> = IntSpec { default: Some(16), min: 1, max: 1024 },
    /// Bytes the central SUB may hold at once: unfinished messages plus messages waiting in the
    /// apply queue. At the cap its connections stop reading. Default 512 MiB.
    #[arg(long, env = "KVINDEX_ZMQ_MAX_BYTES_IN_FLIGHT")]
    zmq_max_bytes_in_flight: Option<i64> = IntSpec { default: Some(512 << 20), min: 1, max: 64 * GIB },
    /// The same per source address on the central SUB, and per dialled pod socket.
    /// Default 64 MiB.
    #[arg(long, env = "KVINDEX_ZMQ_MAX_BYTES_IN_FLIGHT_PER_SOURCE")]
    zmq_max_bytes_in_flight_per_source: Option<i64> = IntSpec { default: Some(64 << 20), min: 1, max: 64 * GIB },
    /// Most connections the central SUB holds (handshaking ones included). Default: 1024, or
    /// less when the descriptor limit (RLIMIT_NOFILE) is low, keeping room for gRPC and HTTP.
    #[arg(long, env = "KVINDEX_ZMQ_MAX_CONNECTIONS")]
    zmq_max_connections: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 20 },
    /// Most connections the central SUB holds from one source address. Default 32, or a
    /// quarter of `zmq_max_connections` when that is lower.
    #[arg(long, env = "KVINDEX_ZMQ_MAX_CONNECTIONS_PER_SOURCE")]
    zmq_max_connections_per_source: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 20 },
    /// Most central-SUB connections from one network (an IPv4 /24, an IPv6 /64): a few
    /// addresses of one owner cannot take the listener either. At the cap a newcomer takes the
    /// place of the network's oldest connection still handshaking. Default half of
    /// `zmq_max_connections`.
    #[arg(long, env = "KVINDEX_ZMQ_MAX_CONNECTIONS_PER_NETWORK")]
    zmq_max_connections_per_network: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 20 },
    /// Most central-SUB connections that have not finished their ZeroMQ handshake; at the cap a
    /// newcomer takes the place of the oldest of them. Default a quarter of
    /// `zmq_max_connections` (at least 2).
    #[arg(long, env = "KVINDEX_ZMQ_MAX_HANDSHAKING")]
    zmq_max_handshaking: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 20 },
    /// The same from one source address. Default 4, or half of `zmq_max_handshaking` when that
    /// is lower; `zmq_max_connections_per_source` when that is set.
    #[arg(long, env = "KVINDEX_ZMQ_MAX_HANDSHAKING_PER_SOURCE")]
    zmq_max_handshaking_per_source: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 20 },
    /// Time a ZeroMQ peer has to finish its handshake. Default 10000.
    #[arg(long, env = "KVINDEX_ZMQ_HANDSHAKE_TIMEOUT_MS")]
    zmq_handshake_timeout_ms: Option<i64> = IntSpec { default: Some(10_000), min: 1, max: 86_400_000 },
    /// Silence after which a ZMTP 3.1 peer is PINGed. Default 10000.
    #[arg(long, env = "KVINDEX_ZMQ_HEARTBEAT_INTERVAL_MS")]
    zmq_heartbeat_interval_ms: Option<i64> = IntSpec { default: Some(10_000), min: 1, max: 86_400_000 },
    /// Silence (no byte, no PONG) after which a ZeroMQ connection is closed. Default 60000.
    #[arg(long, env = "KVINDEX_ZMQ_IDLE_TIMEOUT_MS")]
    zmq_idle_timeout_ms: Option<i64> = IntSpec { default: Some(60_000), min: 1, max: 86_400_000 },
    /// Index shards.
    #[arg(long, env = "KVINDEX_SHARDS")]
    shards: Option<i64> = IntSpec { default: Some(64), min: 1, max: 1 << 16 },
    /// Bound on resident (block, pod) entries.
    #[arg(long, env = "KVINDEX_MAX_ENTRIES")]
    max_entries: Option<i64> = IntSpec { default: Some(50_000_000), min: 1, max: i64::MAX },
    /// Bounded queue between the sockets and the apply workers (messages, per worker).
    #[arg(long, env = "KVINDEX_QUEUE_CAPACITY")]
    queue_capacity: Option<i64> = IntSpec { default: Some(65_536), min: 1, max: 1 << 24 },
    /// Apply threads.
    #[arg(long, env = "KVINDEX_APPLY_WORKERS")]
    apply_workers: Option<i64> = IntSpec { default: Some(1), min: 1, max: 256 },
    /// A source silent this long is STALE.
    #[arg(long, env = "KVINDEX_STALE_AFTER_MS")]
    stale_after_ms: Option<i64> = IntSpec { default: Some(30_000), min: 1, max: i64::MAX },
    /// A source further behind its engine than this (the backlog its batches' `ts` show, plus
    /// what was read and not applied) is not credited in scores until it is back under it; its
    /// state is kept. Default 10000; 0 = off.
    #[arg(long, env = "KVINDEX_MAX_SOURCE_STALENESS_MS")]
    max_source_staleness_ms: Option<i64> = IntSpec { default: Some(10_000), min: 0, max: 86_400_000 },
    /// A replay must finish within this once it has begun.
    #[arg(long, env = "KVINDEX_REPLAY_TIMEOUT_MS")]
    replay_timeout_ms: Option<i64> = IntSpec { default: Some(5_000), min: 1, max: i64::MAX },
    /// A replay may wait this long for one of the `max_concurrent_replays` slots before it
    /// fails (its stream holds live messages meanwhile, up to `max_pending`). Default 60000.
    #[arg(long, env = "KVINDEX_REPLAY_QUEUE_TIMEOUT_MS")]
    replay_queue_timeout_ms: Option<i64> = IntSpec { default: Some(60_000), min: 1, max: i64::MAX },
    /// After a failed replay, gaps are cleared instead of replayed for this long.
    #[arg(long, env = "KVINDEX_REPLAY_COOLDOWN_MS")]
    replay_cooldown_ms: Option<i64> = IntSpec { default: Some(5_000), min: 0, max: i64::MAX },
    /// Replays in flight at once.
    #[arg(long, env = "KVINDEX_MAX_CONCURRENT_REPLAYS")]
    max_concurrent_replays: Option<i64> = IntSpec { default: Some(8), min: 1, max: 4096 },
    /// Live messages of one stream held while its replay runs.
    #[arg(long, env = "KVINDEX_MAX_PENDING")]
    max_pending: Option<i64> = IntSpec { default: Some(100_000), min: 1, max: 1 << 24 },
    /// Largest ScoreTokens prompt, in tokens.
    #[arg(long, env = "KVINDEX_MAX_TOKENS")]
    max_tokens: Option<i64> = IntSpec { default: Some(262_144), min: 1, max: 1 << 28 },
    /// Largest gRPC request, in bytes.
    #[arg(long, env = "KVINDEX_MAX_MESSAGE_BYTES")]
    max_message_bytes: Option<i64> = IntSpec { default: Some(4 << 20), min: 1024, max: 1 << 30 },
    /// RecordRoute: TTL of a speculative credit when the request names none.
    #[arg(long, env = "KVINDEX_SPECULATIVE_TTL_MS")]
    speculative_ttl_ms: Option<i64> = IntSpec { default: Some(2_000), min: 1, max: 3_600_000 },
    /// RecordRoute: longest TTL a request may ask for (longer is capped).
    #[arg(long, env = "KVINDEX_SPECULATIVE_MAX_TTL_MS")]
    speculative_max_ttl_ms: Option<i64> = IntSpec { default: Some(10_000), min: 1, max: 3_600_000 },
    /// RecordRoute: speculative credits held at once, all pods together (0 = RecordRoute off).
    #[arg(long, env = "KVINDEX_SPECULATIVE_MAX_ENTRIES")]
    speculative_max_entries: Option<i64> = IntSpec { default: Some(1 << 20), min: 0, max: 1 << 32 },
    /// RecordRoute: speculative credits held for one pod.
    #[arg(long, env = "KVINDEX_SPECULATIVE_MAX_ENTRIES_PER_POD")]
    speculative_max_entries_per_pod: Option<i64> = IntSpec { default: Some(1 << 16), min: 1, max: 1 << 32 },
    /// RecordRoute: speculative credits one caller (peer address) may hold, all pods together.
    /// Default: a quarter of `speculative_max_entries`.
    #[arg(long, env = "KVINDEX_SPECULATIVE_MAX_ENTRIES_PER_CALLER")]
    speculative_max_entries_per_caller: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 32 },
    /// RecordRoute reservations (shared in-flight load): TTL of a reservation whose request
    /// names none; the backstop for a router that dies before releasing it.
    #[arg(long, env = "KVINDEX_RESERVATION_TTL_MS")]
    reservation_ttl_ms: Option<i64> = IntSpec { default: Some(30_000), min: 1, max: 3_600_000 },
    /// RecordRoute reservations: longest TTL a request may ask for (longer is capped).
    #[arg(long, env = "KVINDEX_RESERVATION_MAX_TTL_MS")]
    reservation_max_ttl_ms: Option<i64> = IntSpec { default: Some(300_000), min: 1, max: 3_600_000 },
    /// RecordRoute reservations held at once, all pods together (0 = reservations off:
    /// ScoreTokens answers no in-flight load).
    #[arg(long, env = "KVINDEX_RESERVATION_MAX_ENTRIES")]
    reservation_max_entries: Option<i64> = IntSpec { default: Some(1 << 18), min: 0, max: 1 << 32 },
    /// RecordRoute reservations held for one pod.
    #[arg(long, env = "KVINDEX_RESERVATION_MAX_ENTRIES_PER_POD")]
    reservation_max_entries_per_pod: Option<i64> = IntSpec { default: Some(1 << 14), min: 1, max: 1 << 32 },
    /// RecordRoute reservations one caller (peer address) may hold, all pods together.
    /// Default: a quarter of `reservation_max_entries`.
    #[arg(long, env = "KVINDEX_RESERVATION_MAX_ENTRIES_PER_CALLER")]
    reservation_max_entries_per_caller: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 32 },
    /// ScoreTokens, GetPodScores and RecordRoute requests of at most this many tokens are
    /// answered at once, never queued or shed. Default 16384.
    #[arg(long, env = "KVINDEX_GRPC_SMALL_QUERY_TOKENS")]
    grpc_small_query_tokens: Option<i64> = IntSpec { default: Some(16_384), min: 0, max: 1 << 28 },
    /// Larger requests computed at once (each on its own thread, off the gRPC I/O threads).
    /// Default: half the cores, at least 1.
    #[arg(long, env = "KVINDEX_GRPC_MAX_CONCURRENT_LARGE")]
    grpc_max_concurrent_large: Option<i64> = IntSpec { default: None, min: 1, max: 4096 },
    /// Tokens of larger requests that may wait for a thread; a request that would take the
    /// wait past it is refused at once (RESOURCE_EXHAUSTED). Default: 4 × `max_tokens`.
    #[arg(long, env = "KVINDEX_GRPC_MAX_QUEUED_TOKENS")]
    grpc_max_queued_tokens: Option<i64> = IntSpec { default: None, min: 0, max: 1 << 40 },
    /// File holding the bearer token of the control plane (pod registration over HTTP and
    /// gRPC, and RecordRoute). Unset: registration and RecordRoute are disabled.
    #[arg(long, env = "KVINDEX_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf> = TextSpec { default: None },
    /// Central mode: source addresses allowed to connect, as CIDRs (`10.0.0.0/8`, `::1/128`;
    /// repeatable). Empty: any address. Checked before the ZMTP handshake.
    #[arg(long = "zmq-allow", value_name = "CIDR")]
    zmq_allow: Vec<String> = ListSpec {},
    /// Most sources (topic or pod × DP rank) the index tracks; messages that would start
    /// another are dropped and counted.
    #[arg(long, env = "KVINDEX_MAX_SOURCES")]
    max_sources: Option<i64> = IntSpec { default: Some(4096), min: 1, max: 1 << 20 },
    /// Central mode: most sources the topics from one publisher address may start (a node's
    /// DP ranks and models). Default 64.
    #[arg(long, env = "KVINDEX_MAX_SOURCES_PER_ADDRESS")]
    max_sources_per_address: Option<i64> = IntSpec { default: Some(64), min: 1, max: 1 << 20 },
    /// Watched file of `[[pods]]` (reloaded on change).
    #[arg(long, env = "KVINDEX_PODS_FILE")]
    pods_file: Option<PathBuf> = TextSpec { default: None },
    /// How often the pods file is checked for changes.
    #[arg(long, env = "KVINDEX_PODS_FILE_POLL_MS")]
    pods_file_poll_ms: Option<i64> = IntSpec { default: Some(1_000), min: 10, max: i64::MAX },
    /// Directory of the RocksDB snapshot for warm restarts (unset = no snapshots): loaded at
    /// start, written periodically and on graceful shutdown. Holds prefix keys and pods, never
    /// token ids.
    #[arg(long, env = "KVINDEX_SNAPSHOT_DIR")]
    snapshot_dir: Option<PathBuf> = TextSpec { default: None },
    /// Seconds between snapshots (with `snapshot_dir`; default 60).
    #[arg(long, env = "KVINDEX_SNAPSHOT_INTERVAL")]
    snapshot_interval: Option<i64> = IntSpec { default: Some(60), min: 1, max: 1 << 31 },
    /// A running sibling replica's gRPC address (`host:port`; in Kubernetes the indexers'
    /// Service): start from its index, streamed in the snapshot format and taken with the
    /// snapshot's rule (each pod once its engine's replay continues from the sibling's cursor).
    /// Needs `admin_token_file` (the sibling's token). Unset: no bootstrap.
    #[arg(long, env = "KVINDEX_BOOTSTRAP_FROM")]
    bootstrap_from: Option<String> = TextSpec { default: None },
    /// PEM CA that signed the siblings' certificates: talk TLS to `bootstrap_from` (and to the
    /// siblings the digest check asks).
    #[arg(long, env = "KVINDEX_BOOTSTRAP_TLS_CA")]
    bootstrap_tls_ca: Option<PathBuf> = TextSpec { default: None },
    /// PEM client certificate for the siblings' mTLS (with `bootstrap_tls_key`).
    #[arg(long, env = "KVINDEX_BOOTSTRAP_TLS_CERT")]
    bootstrap_tls_cert: Option<PathBuf> = TextSpec { default: None },
    /// PEM private key of `bootstrap_tls_cert`.
    #[arg(long, env = "KVINDEX_BOOTSTRAP_TLS_KEY")]
    bootstrap_tls_key: Option<PathBuf> = TextSpec { default: None },
    /// The name the siblings' certificates carry (default: the host of `bootstrap_from`).
    #[arg(long, env = "KVINDEX_BOOTSTRAP_TLS_DOMAIN")]
    bootstrap_tls_domain: Option<String> = TextSpec { default: None },
    /// The sibling's whole export must arrive within this; `/readyz` then waits at most as
    /// long again for every stream to prove or drop its record. Default 60000.
    #[arg(long, env = "KVINDEX_BOOTSTRAP_TIMEOUT_MS")]
    bootstrap_timeout_ms: Option<i64> = IntSpec { default: Some(60_000), min: 1, max: 86_400_000 },
    /// The most bytes accepted from the sibling; a larger export is refused whole. Default 4 GiB.
    #[arg(long, env = "KVINDEX_BOOTSTRAP_MAX_BYTES")]
    bootstrap_max_bytes: Option<i64> = IntSpec { default: Some(4 * GIB), min: 1, max: 1 << 40 },
    /// Serving side: the largest export sent to a bootstrapping sibling (encoded); past it the
    /// export is refused (RESOURCE_EXHAUSTED). Default 4 GiB.
    #[arg(long, env = "KVINDEX_SIBLING_EXPORT_MAX_BYTES")]
    sibling_export_max_bytes: Option<i64> = IntSpec { default: Some(4 * GIB), min: 1, max: 1 << 40 },
    /// Serving side: an export must be captured and sent within this (DEADLINE_EXCEEDED).
    /// Default 120000.
    #[arg(long, env = "KVINDEX_SIBLING_EXPORT_TIMEOUT_MS")]
    sibling_export_timeout_ms: Option<i64> = IntSpec { default: Some(120_000), min: 1, max: 86_400_000 },
    /// Serving side: exports running at once, all callers together (one per caller). Default 2.
    #[arg(long, env = "KVINDEX_SIBLING_EXPORT_MAX_CONCURRENT")]
    sibling_export_max_concurrent: Option<i64> = IntSpec { default: Some(2), min: 1, max: 64 },
    /// Every this many ms, compare each pod's digest with every replica `bootstrap_from`
    /// resolves to (at most 16), into `kvindex_sibling_pods{sibling, verdict}`. 0 = off (the
    /// default).
    #[arg(long, env = "KVINDEX_SIBLING_CHECK_INTERVAL_MS")]
    sibling_check_interval_ms: Option<i64> = IntSpec { default: Some(0), min: 0, max: 86_400_000 },
    // ---- hardening: tier bounds, listeners, TLS, host policy ----
    /// Distinct tiers (`medium`) one source's blocks may be held in; a store naming another is
    /// skipped (`source_tier_limit`). Default 4.
    #[arg(long, env = "KVINDEX_MAX_TIERS_PER_SOURCE")]
    max_tiers_per_source: Option<i64> = IntSpec { default: Some(4), min: 1, max: 8 },
    /// Tier names learned from publishers (not GPU/CPU/STORAGE, not in `tier_weights`), all
    /// sources together. Default 5 (every free slot); 0 = only predefined and configured tiers.
    #[arg(long, env = "KVINDEX_MAX_LEARNED_TIERS")]
    max_learned_tiers: Option<i64> = IntSpec { default: Some(5), min: 0, max: 8 },
    /// Serve `/metrics` and `/debug/*` on this address only (a metrics-only listener, as
    /// etcd's `--listen-metrics-urls`). Unset: they stay on `http_addr`.
    #[arg(long, env = "KVINDEX_METRICS_ADDR")]
    metrics_addr: Option<String> = TextSpec { default: None },
    /// Also serve `/healthz` and `/readyz` (and nothing else) on this address, for the
    /// kubelet's probes: a listener of their own, which clients of `http_addr` cannot fill.
    /// Unset: the probes use `http_addr` (and `metrics_addr`).
    #[arg(long, env = "KVINDEX_PROBE_ADDR")]
    probe_addr: Option<String> = TextSpec { default: None },
    /// Time for an HTTP request's head to arrive, and for an idle keep-alive connection to
    /// start its next request, before the connection is closed. Default 10000.
    #[arg(long, env = "KVINDEX_HTTP_HEADER_TIMEOUT_MS")]
    http_header_timeout_ms: Option<i64> = IntSpec { default: Some(10_000), min: 1, max: 3_600_000 },
    /// Time a write of an HTTP answer may make no progress (a client that does not read it)
    /// before the connection is closed. Default 30000.
    #[arg(long, env = "KVINDEX_HTTP_WRITE_TIMEOUT_MS")]
    http_write_timeout_ms: Option<i64> = IntSpec { default: Some(30_000), min: 1, max: 3_600_000 },
    /// Time for a whole HTTP request body to arrive (408 past it). Default 10000.
    #[arg(long, env = "KVINDEX_HTTP_BODY_TIMEOUT_MS")]
    http_body_timeout_ms: Option<i64> = IntSpec { default: Some(10_000), min: 1, max: 3_600_000 },
    /// Most open connections per HTTP listener (`http_addr`, `metrics_addr`, `probe_addr`
    /// each). At the cap the oldest idle connection (no request being answered) is closed to
    /// make room; a new one is closed at accept only when every one is answering. Default 64.
    #[arg(long, env = "KVINDEX_HTTP_MAX_CONNECTIONS")]
    http_max_connections: Option<i64> = IntSpec { default: Some(64), min: 1, max: 1 << 20 },
    /// Most open connections per HTTP listener from one client address (the same rule at the
    /// cap). Default a quarter of `http_max_connections`.
    #[arg(long, env = "KVINDEX_HTTP_MAX_CONNECTIONS_PER_ADDRESS")]
    http_max_connections_per_address: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 20 },
    /// Most open connections per HTTP listener from one network (an IPv4 /24, an IPv6 /64; the
    /// same rule at the cap). Default half of `http_max_connections`.
    #[arg(long, env = "KVINDEX_HTTP_MAX_CONNECTIONS_PER_NETWORK")]
    http_max_connections_per_network: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 20 },
    /// Largest HTTP request body (a registration); 413 past it. Default 65536.
    #[arg(long, env = "KVINDEX_HTTP_MAX_BODY_BYTES")]
    http_max_body_bytes: Option<i64> = IntSpec { default: Some(64 << 10), min: 1, max: 1 << 30 },
    /// HTTP request body bytes held at once over all requests (503 past it); at least
    /// `http_max_body_bytes`. Default 1 MiB.
    #[arg(long, env = "KVINDEX_HTTP_MAX_INFLIGHT_BODY_BYTES")]
    http_max_inflight_body_bytes: Option<i64> = IntSpec { default: None, min: 1, max: 1 << 36 },
    /// PEM certificate chain: serve gRPC and HTTP (and the metrics listener) over TLS.
    #[arg(long, env = "KVINDEX_TLS_CERT")]
    tls_cert: Option<PathBuf> = TextSpec { default: None },
    /// PEM private key of `tls_cert`.
    #[arg(long, env = "KVINDEX_TLS_KEY")]
    tls_key: Option<PathBuf> = TextSpec { default: None },
    /// PEM CA certificate(s): require a client certificate signed by one of them (mTLS).
    #[arg(long, env = "KVINDEX_TLS_CLIENT_CA")]
    tls_client_ca: Option<PathBuf> = TextSpec { default: None },
    /// Registration's host policy: endpoints given through `POST /pods` / `RegisterPod` must
    /// resolve only to addresses in these CIDRs (repeatable); the name is resolved once, checked,
    /// and the pod dialled at the checked address. Empty: any host.
    #[arg(long = "register-allow", value_name = "CIDR")]
    register_allow: Vec<String> = ListSpec {},
    // ---- end of the hardening block ----
    /// Tier weight `<medium>=<weight>` (repeatable), e.g. `CPU=0.8`.
    #[arg(long = "tier-weight", value_name = "MEDIUM=WEIGHT", value_parser = TierWeight::from_flag)]
    #[serde(deserialize_with = "TierWeight::table")]
    tier_weights: Vec<TierWeight> = ListSpec {},
}

/// `kvindex serve`'s command line: the config file, and the settings on top of it.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, env = "KVINDEX_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
}

/// The `serve` command alone, for parsing its arguments and for introspection (the keys that
/// docs/CONFIG.md must list).
pub fn serve_command() -> Command {
    ServeArgs::augment_args(Command::new("serve"))
}

/// The discovery settings' specs, from the constants `kvindex-discovery` checks them with.
fn discovery_specs() -> Vec<Spec> {
    let text = |key, default| TextSpec { key, default }.entry();
    let mut specs = vec![
        ChoiceSpec { key: "discovery", default: discovery_args::KIND_DEFAULT, choices: &discovery_args::KIND_CHOICES }
            .entry(),
        text("discovery_namespace", None),
        text("discovery_label_selector", Some(discovery_args::LABEL_SELECTOR_DEFAULT)),
        text("discovery_model", None),
        text("discovery_api_server", None),
        ChoiceSpec {
            key: "discovery_engine_probe",
            default: discovery_args::ENGINE_PROBE_DEFAULT,
            choices: &discovery_args::ENGINE_PROBE_CHOICES,
        }
        .entry(),
    ];
    specs.extend(
        discovery_args::INT_ARGS
            .iter()
            .map(|a| IntSpec { key: a.key, default: Some(a.default), min: a.min, max: a.max }.entry()),
    );
    specs
}

/// Every setting's spec.
pub fn specs() -> Vec<Spec> {
    OWN_SPECS.iter().copied().chain(discovery_specs()).collect()
}

/// Every setting of `kvindex serve` (`--config` aside), in the order `--help` lists them: key,
/// flag, env var, doc, default and range.
pub fn table() -> Vec<Setting> {
    spec::table(&serve_command(), &specs())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_argument_has_one_spec_and_every_spec_an_argument() {
        let args: BTreeSet<String> = serve_command()
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .filter(|id| !matches!(id.as_str(), "config" | "help"))
            .collect();
        let specs: Vec<&str> = specs().iter().map(Spec::key).collect();
        let spec_keys: BTreeSet<String> = specs.iter().map(|k| k.to_string()).collect();
        assert_eq!(specs.len(), spec_keys.len(), "a key declared twice");
        assert_eq!(args, spec_keys);
        let table = table();
        assert_eq!(table.len(), spec_keys.len());
        let block_size = table.iter().find(|s| s.key == "block_size").unwrap();
        assert_eq!((block_size.flag.as_str(), block_size.env.as_deref()), ("--block-size", Some("KVINDEX_BLOCK_SIZE")));
        assert!(block_size.doc.starts_with("Canonical block size"), "{block_size:?}");
        for s in &table {
            if let Spec::Int(i) = s.spec {
                assert!(i.min <= i.max && i.default.is_none_or(|d| i.check(d).is_ok()), "{s:?}");
            }
        }
    }
}
