//! kvindex: an exact prefix-cache index for vLLM, SGLang and TensorRT-LLM fleets, as a pure core.
//!
//! No I/O, no async, no clocks: the service (`kvindex-server`) feeds it bytes and time. The
//! modules follow the data flow:
//!
//! ```text
//! frames ─▶ wire (decode) ─▶ sequencer (order, gaps, restarts) ─▶ index::ingest ─▶ index::tree
//!                                                      keys (prefix keys) ─┘          ▲
//!                                            prompt ─▶ keys ─▶ index::score ──────────┘
//! ```
//!
//! [`KvIndex`] ties the index together. The one rule: the index never claims a block a pod
//! does not hold; anything it cannot resolve exactly is skipped and counted. Routers'
//! predictions (RecordRoute) live apart, in [`speculative`], so a prediction never becomes a claim.
//! Engines other than vLLM decode on the same event model ([`wire::Engine`]); SGLang's own
//! rules (page hash, namespaces, pages it does not serve) are in [`sglang`].

pub mod index;
pub mod keys;
pub mod sequencer;
pub mod sglang;
pub mod speculative;
pub mod vllm_hash;
pub mod wire;

pub use index::{
    ApplyReport, BlockRef, ChainParent, ColumnError, Columns, EngineBlocks, GroupExport, HashCheck, ImportReport,
    KvIndex, KvIndexConfig, PodDigest, PodExport, PodRules, PodStats, ScoreQuery, ScoreResult, SkipReason, TierClass,
    TierLimits, TierWeights, UnitExport, MAX_CONTEXT_PARALLEL,
};
