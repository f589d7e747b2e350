//! Why the service could not start or stopped: the errors of [`crate::bind`] and [`crate::run`].
//! Configuration errors are [`ConfigError`]s; errors of single requests become gRPC statuses
//! or HTTP 4xx answers where they happen.

use crate::config::error::ConfigError;
use crate::write::transport::ZmtpError;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{key}: cannot bind {addr}: {source}")]
    Bind { key: &'static str, addr: String, source: std::io::Error },
    #[error("zmq_bind: {0}")]
    ZmqBind(ZmtpError),
    #[error("{key}: {message}")]
    Tokenizer { key: &'static str, message: String },
    #[error("tier_weights.{0}: too many tiers")]
    TooManyTiers(String),
    #[error("hash_seed: {0}")]
    HashCheck(#[from] kvindex::vllm_hash::VllmHashError),
    #[error(transparent)]
    Metrics(#[from] crate::telemetry::RecorderError),
    #[error("gRPC server: {0}")]
    Grpc(String),
    #[error("{server} server stopped: {reason}")]
    Stopped { server: &'static str, reason: String },
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
    #[error("tls: {0}")]
    Tls(String),
    #[error("snapshot_dir: {0}")]
    Snapshot(crate::persist::snapshot::store::RecreateError),
    #[error("snapshot_dir: {0}")]
    SnapshotDir(crate::persist::snapshot::store::DirError),
    #[error("discovery: {0}")]
    Discovery(String),
    #[error("{what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
}
