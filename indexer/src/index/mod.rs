//! The index: [`KvIndex`], the pure core's entry point, over the chain [`tree`] of block
//! residencies. Events reach the tree through per-pod [`ingest`] and prompts are answered by
//! [`score`] (and, for engines with several KV-cache groups, by [`hybrid`]), credited in the
//! [`units`] each pod's engine can reuse; [`pods`] and [`tiers`] intern the names a residency
//! records.
//!
//! Writers apply one pod's batches under that pod's lock, so a source's operations apply in its
//! order while different pods proceed in parallel; readers score without taking any lock.
//! There is no I/O, async or clock here: the service shell decides when to apply, clear or
//! drop a pod, and this type does it exactly.

mod config;
pub mod digest;
pub mod engine_blocks;
pub mod export;
pub mod groups;
pub mod hybrid;
pub mod ingest;
mod kv_index;
mod pod_digest;
mod pod_segments;
pub mod pods;
mod published;
pub mod report;
pub mod score;
pub mod tiers;
pub mod tree;
pub mod units;

pub use self::config::HashCheck;
pub use self::config::KvIndexConfig;
pub use self::engine_blocks::{BlockRef, ChainParent, ColumnError, Columns, EngineBlocks};
pub use self::export::{GroupExport, ImportReport, PodExport, UnitExport};
pub use self::kv_index::{KvIndex, PodStats, ScoreQuery, ScoreResult};
pub use self::pod_digest::PodDigest;
pub use self::report::{ApplyReport, SkipReason};
pub use self::tiers::{TierClass, TierLimits, TierWeights};
pub use self::units::{Cut, PodRules, MAX_CONTEXT_PARALLEL};
