//! kvindex: an exact prefix-cache index for vLLM fleets.
//!
//! The library is the pure core: no I/O, no async, no clocks. Data flows one way:
//! frames ([`wire`]) → events → per-pod ingest ([`ingest`]) → the sharded [`index`] →
//! [`score`]s. [`KvIndex`] ties them together. The one rule: the index never claims a block
//! a pod does not hold; anything it cannot resolve exactly is skipped and counted.

pub mod extra_keys;
pub mod hybrid;
pub mod ingest;
pub mod keys;
pub mod kv_index;
pub mod pods;
pub mod score;
pub mod source;
pub mod tiers;
pub mod topic;
pub mod tree;
pub mod vllm_hash;
pub mod wire;

pub use ingest::{ApplyReport, HashCheck, SkipReason};
pub use kv_index::{KvIndex, KvIndexConfig, PodStats, ScoreQuery, ScoreResult};
