//! kvindex-server: the kvindex service as a library, around the pure core (`kvindex`).
//!
//! [`bind`] a [`Config`]'s listeners, then [`run`] the service on them until a shutdown future
//! resolves; the `kvindex` binary is thin glue over these two, and tests embed the server the
//! same way. All I/O and clocks live here; every decision about sequencing is made by
//! [`kvindex::sequencer::Sequencer`].
//!
//! One KV event, from an engine's socket to a score:
//!
//! ```text
//! engine PUB ─ZeroMQ─▶ write::transport ─▶ write::sources ─Work::Live─▶ queue::Queues
//!   SubListener (engines dial in) or         the central SUB hands     one lane per worker;
//!   SubDialer (we dial each pod that         through a relay per       full: the reader
//!   pods/ registered)                        worker                    waits, nothing drops
//!                                                                             │
//!                                                                             ▼
//! write::worker::Worker ─frames─▶ write::table::StreamTable ─Effect::Steps─▶ write::worker
//!   a thread per lane              admit, name, track connections,        (execute): Step::Apply
//!                                  decode once, sequence                  puts the batch into
//!                                                                         the index
//!                                                                             │
//!                                                                             ▼
//! read::grpc (ScoreTokens, GetPodScores) ─reads─▶ index_handle::IndexHandle (KvIndex, credits,
//! read::http (/debug/sources, /metrics)  ─reads─▶   status, clock)
//!
//! a gap: Step::RequestReplay ─▶ write::replay ─Dealer─▶ engine ROUTER ─Work::Replay─▶ queue::Queues
//! ```
//!
//! The wings, in the order the data flows (`deploy/tests/tests/it/server_rooms.rs` holds each file
//! to its floor and below):
//!
//! - [`server`] ([`bind`], [`run`]) puts the service together; [`dump_server`] serves a
//!   rebuilt index read-only (`kvindex replay --grpc-addr`).
//! - [`read`]: the servers that answer from the index: [`read::grpc`] (ScoreTokens,
//!   GetPodScores, RecordRoute, the Replica service), [`read::http`] (admin, probes,
//!   `/metrics`), [`read::tls`], and [`read::reservations`], the routers' shared in-flight
//!   load. It never names `write/`.
//! - [`error`]: why the service could not start or stopped.
//! - [`persist`]: [`persist::snapshot`] (warm restarts from an embedded RocksDB, a sibling's
//!   bootstrap), [`persist::dump`] (record and replay: `kvindex record`, `kvindex replay`
//!   drives the stream table offline in [`persist::dump::offline`]), [`persist::sibling`] and
//!   [`persist::sibling_check`] (replicas of one fleet).
//! - [`pods`]: which pods exist and who declared them (config, pods file, discovery, the
//!   registration API and its auth) and their lifecycle, which dials their sources; below
//!   `write/`, the registry the workers read ([`pods::registry`]) and the precedence rule.
//! - [`write`]: the KV-event path, top to bottom: [`write::worker`] (the apply workers: take
//!   [`protocols::Work`] from their lane, carry out the table's effects on the index, run
//!   their part of snapshot captures and imports, worker 0's tick the shared data's upkeep;
//!   [`write::worker::context`], all a worker sees of the service), [`write::replay`]
//!   (replay requests for the sequencers' gaps), [`write::context`] (the service's state:
//!   snapshots use it, the workers' context is built from it), [`write::sources`] (the
//!   central SUB and the dialled pods' SUBs), [`write::table`] (the stream table: every stream
//!   of a worker, from frames to sequencer steps; pure, also driven offline),
//!   [`write::transport`] (the ZeroMQ boundary, `kvindex-zmtp`).
//! - The leaves every wing shares: [`queue`] (the bounded lanes to the workers; waits, never
//!   drops), [`protocols`] (the messages: `Work`, `StreamKey`, `LiveSocket`), [`index_handle`]
//!   (index, credits, [`status`], [`clock`]; its upkeep: index gauges, the credit sweep),
//!   [`source_series`] (per-source metric series that live as long as their source),
//!   [`readiness`], [`shutdown`], [`telemetry`] (metric names and the recorder).
//! - [`config`]: the settings, declared once (flags, env vars, TOML file), validated into
//!   [`Config`].

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
