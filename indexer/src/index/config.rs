//! [`KvIndexConfig`]: what a [`KvIndex`](super::KvIndex) is built with, a leaf that the index and
//! the service's configuration both read.

use super::tiers::{TierLimits, TierWeights};
use crate::vllm_hash::BlockHasher;

#[derive(Debug, Clone)]
pub struct KvIndexConfig {
    /// Canonical block size of our keys; engines must use a multiple of it.
    pub block_size: usize,
    /// Index shards (rounded up to a power of two).
    pub shards: usize,
    /// Bound on resident (block, pod) entries; past it new residencies are refused (counted as
    /// `index_full`), which can only under-report.
    pub max_entries: u64,
    /// Sampled recomputation of vLLM's own block hashes, to detect misconfigured engines.
    pub hash_check: Option<HashCheck>,
    /// Bounds on tier names learned from publishers.
    pub tier_limits: TierLimits,
    /// Weights of llm-d's tier classes (a name's configured weight overrides its class).
    pub tier_classes: TierWeights,
}

impl Default for KvIndexConfig {
    fn default() -> Self {
        KvIndexConfig {
            block_size: 16,
            shards: 64,
            max_entries: 50_000_000,
            hash_check: None,
            tier_limits: TierLimits::default(),
            tier_classes: TierWeights::default(),
        }
    }
}

/// Sampled cross-check of the engine's block hashes against vLLM's own recipe.
///
/// Matching never depends on it (keys come from token ids), but a source whose recomputed
/// hashes all mismatch is misconfigured: wrong block size, seed or algorithm, the usual cause
/// of "scores are always 0" in deployments that key on engine hashes, and a sign that the
/// engine is not the release operators think it is.
#[derive(Debug, Clone)]
pub struct HashCheck {
    pub hasher: BlockHasher,
    /// Check one in this many stores of a pod (1 = every store, 0 = never).
    pub every: u32,
}
