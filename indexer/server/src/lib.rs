//! kvindex-server: the kvindex service as a library, around the pure core (`kvindex`).
//!
//! [`bind`] a [`Config`]'s listeners, then [`run`] the service on them until a shutdown future
//! resolves; the `kvindex` binary is thin glue over these two, and tests embed the server the
//! same way. All I/O and clocks live here; every decision about sequencing is made by
//! [`kvindex::sequencer::Sequencer`].
//!
//! ```text
//! transport (ZeroMQ) ─▶ sources (central SUB, per-pod SUBs, registry) ──send──▶ apply::Queues
//!              full → the reader waits (counted), its socket buffers, then ZeroMQ's   │
//! replay (DEALER) ─────────────────────────────────────────────────send (waits)────────┤
//!                                                                                      ▼
//!         grpc (ScoreTokens, GetPodScores) ◀── index ◀── apply worker: stream table → KvIndex
//!         http (admin, /metrics)
//! ```
//!
//! - [`config`]: the settings, declared once (flags, env vars, TOML file), validated into [`Config`].
//! - [`transport`]: the ZeroMQ boundary (`kvindex-zmtp`: SUB streams, replay requests, limits).
//! - [`sources`]: live streams (the central SUB, dialled pods).
//! - [`pods`]: which pods exist and who declared them (config, pods file, discovery, the
//!   registration API and its auth), their lifecycle, and the precedence between declarations.
//! - [`replay`]: replay requests for the sequencers' gaps and start-up syncs.
//! - [`ingest`]: the stream table (admission, naming, connections, decode once, sequencing),
//!   driven by the live [`apply`] workers and offline by `kvindex replay` ([`dump::offline`]).
//! - [`apply`]: the apply workers and their bounded queues; [`state`]: their context.
//!   [`protocols`]: the messages between components. [`housekeeping`]: the index-wide gauges
//!   and the speculative sweep.
//! - [`snapshot`]: warm restarts from an embedded RocksDB. [`dump`]: record and replay.
//! - The handles the parts share: [`index_handle`] (index, credits, [`status`], [`clock`]),
//!   [`readiness`], [`shutdown`]; [`source_series`]: the per-source metric series, which live
//!   as long as their source.
//! - [`reservations`]: the routers' shared in-flight load (RecordRoute reservations), a pure
//!   table the gRPC services hold.
//! - [`grpc`], [`http`]: the servers; [`tls`]: their TLS / mTLS. [`telemetry`]: metric names and the recorder.

pub mod clock;
pub mod config;
pub mod dump_server;
pub mod error;
pub mod index_handle;
pub mod persist;
pub mod pods;
pub mod protocols;
pub mod queue;
pub mod read;
pub mod readiness;
pub mod server;
pub mod shutdown;
pub mod source_series;
pub mod status;
pub mod telemetry;
#[cfg(test)]
mod test_events;
pub mod write;

pub use config::{Config, ConfigError};
pub use error::ServerError;
pub use server::{bind, run, Listeners};
