//! The index: [`KvIndex`], the pure core's entry point, over the [`table`] of block residencies.
//! Events reach the table through per-pod [`ingest`] and prompts are answered by [`score`];
//! [`pods`] and [`tiers`] intern the names a residency records.
//!
//! Writers apply one pod's batches under that pod's lock, so a source's operations apply in its
//! order while different pods proceed in parallel; readers score without taking any pod lock.
//! There is no I/O, async or clock here: the service shell decides when to apply, clear or
//! drop a pod, and this type does it exactly.

pub mod export;
pub mod ingest;
pub mod pods;
pub mod report;
pub mod score;
pub mod table;
pub mod tiers;

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use self::ingest::{IngestContext, PodIngest};
use self::pods::{PodId, Pods};
use self::score::{score, PodFilter, PodMatch};
use self::table::BlockTable;
use self::tiers::{Tiers, MAX_TIERS};
use crate::keys::{namespace_of, namespace_root, prompt_keys};
use crate::vllm_hash::Verification;
use crate::wire::EventBatch;

pub use self::export::{BlockExport, ImportReport, PodExport};
pub use self::ingest::HashCheck;
pub use self::report::{ApplyReport, SkipReason};

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
}

impl Default for KvIndexConfig {
    fn default() -> Self {
        KvIndexConfig { block_size: 16, shards: 64, max_entries: 50_000_000, hash_check: None }
    }
}

/// A scoring question: the prompt's token ids in a model (or LoRA) namespace.
#[derive(Debug, Clone, Copy)]
pub struct ScoreQuery<'a> {
    pub model: &'a str,
    pub lora_name: Option<&'a str>,
    pub cache_salt: Option<&'a str>,
    pub token_ids: &'a [u32],
    /// Restrict to these pods; `None` = every pod.
    pub pods: Option<&'a [&'a str]>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScoreResult {
    /// Full canonical blocks in the prompt.
    pub total_blocks: u32,
    /// Pods holding at least block 0 (among the filtered pods), sorted by pod id.
    pub matches: Vec<PodMatch>,
}

/// What a pod holds, for debugging and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodStats {
    pub model: String,
    /// Canonical blocks held in any tier.
    pub blocks: u64,
    pub tier_blocks: [u64; MAX_TIERS],
    /// Totals of the sampled vLLM hash cross-check.
    pub hash_check: Verification,
}

pub struct KvIndex {
    config: KvIndexConfig,
    table: BlockTable,
    pods: Pods,
    tiers: Tiers,
    states: RwLock<FxHashMap<PodId, Arc<Mutex<PodIngest>>>>,
}

impl KvIndex {
    pub fn new(config: KvIndexConfig) -> Self {
        assert!(config.block_size > 0, "block_size must be positive");
        KvIndex {
            table: BlockTable::new(config.shards, config.max_entries),
            pods: Pods::new(),
            tiers: Tiers::new(),
            states: RwLock::new(FxHashMap::default()),
            config,
        }
    }

    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// The block table, for its size figures (entries, keys, bytes).
    pub fn table(&self) -> &BlockTable {
        &self.table
    }

    pub fn pods(&self) -> &Pods {
        &self.pods
    }

    pub fn tiers(&self) -> &Tiers {
        &self.tiers
    }

    fn context(&self) -> IngestContext<'_> {
        IngestContext {
            tiers: &self.tiers,
            block_size: self.config.block_size,
            hash_check: self.config.hash_check.as_ref(),
        }
    }

    /// The ingest state of `pod` serving `model`. A pod that switches models is cleared first:
    /// its old blocks belong to another namespace and engine.
    fn state(&self, pod: &str, model: &str) -> Option<Arc<Mutex<PodIngest>>> {
        let id = self.pods.intern(pod)?;
        if let Some(state) = self.states.read().get(&id) {
            if state.lock().model() == model {
                return Some(state.clone());
            }
        }
        let mut states = self.states.write();
        if let Some(old) = states.get(&id) {
            let mut old = old.lock();
            if old.model() == model {
                return Some(states[&id].clone());
            }
            old.clear(&mut self.table.writer());
        }
        let state = Arc::new(Mutex::new(PodIngest::new(id, Arc::from(model))));
        states.insert(id, state.clone());
        Some(state)
    }

    /// Applies one decoded batch from `pod` (already resolved for DP rank) serving `model`.
    pub fn apply(&self, pod: &str, model: &str, batch: &EventBatch<'_>) -> ApplyReport {
        let Some(state) = self.state(pod, model) else {
            return ApplyReport::default();
        };
        let mut state = state.lock();
        state.apply_batch(&self.context(), &mut self.table.writer(), batch)
    }

    /// Drops everything `pod` holds; its ingest state starts empty. Returns entries removed.
    pub fn clear_pod(&self, pod: &str) -> u64 {
        let Some(id) = self.pods.get(pod) else { return 0 };
        let state = self.states.read().get(&id).cloned();
        state.map_or(0, |s| s.lock().clear(&mut self.table.writer()))
    }

    /// Clears `pod` and forgets its state. Returns whether it was known.
    pub fn remove_pod(&self, pod: &str) -> bool {
        let Some(id) = self.pods.get(pod) else { return false };
        let state = self.states.write().remove(&id);
        match state {
            Some(s) => {
                s.lock().clear(&mut self.table.writer());
                true
            }
            None => false,
        }
    }

    pub fn pod_stats(&self, pod: &str) -> Option<PodStats> {
        let id = self.pods.get(pod)?;
        let state = self.states.read().get(&id).cloned()?;
        let state = state.lock();
        Some(PodStats {
            model: state.model().to_string(),
            blocks: state.blocks(),
            tier_blocks: state.tier_blocks(),
            hash_check: state.hash_check(),
        })
    }

    /// Pods with ingest state, by name.
    pub fn pod_names(&self) -> Vec<String> {
        let ids: Vec<PodId> = self.states.read().keys().copied().collect();
        let mut names: Vec<String> =
            ids.into_iter().filter_map(|id| self.pods.name(id)).map(|n| n.to_string()).collect();
        names.sort();
        names
    }

    /// Scores a prompt. Hashing, lookups and the walk; no allocation per block beyond the keys.
    pub fn score(&self, q: &ScoreQuery<'_>) -> ScoreResult {
        let bs = self.config.block_size;
        let total_blocks = (q.token_ids.len() / bs) as u32;
        let namespace = namespace_of(q.model, q.lora_name, None);
        let keys = prompt_keys(namespace_root(&namespace, 0), q.token_ids, bs, q.cache_salt);
        let filter_ids: Option<Vec<PodId>> = q.pods.map(|names| {
            let mut ids: Vec<PodId> = names.iter().filter_map(|n| self.pods.get(n)).collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        });
        let filter = match &filter_ids {
            None => PodFilter::All,
            Some(ids) => PodFilter::Only(ids),
        };
        let matches = if matches!(filter, PodFilter::Only(ids) if ids.is_empty()) {
            Vec::new()
        } else {
            score(&self.table, &keys, filter, &self.tiers.weights())
        };
        ScoreResult { total_blocks, matches }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BlockStored, EngineHash, Event};

    fn store(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> EventBatch<'static> {
        EventBatch {
            ts: 0.0,
            events: vec![Event::BlockStored(BlockStored {
                block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
                parent_block_hash: parent.map(EngineHash::Uint),
                token_ids: Some(tokens),
                block_size: Some(2),
                ..Default::default()
            })],
            data_parallel_rank: Some(0),
        }
    }

    fn matched(index: &KvIndex, pod: &str, model: &str, tokens: &[u32]) -> u32 {
        let pods = [pod];
        let q = ScoreQuery { model, lora_name: None, cache_salt: None, token_ids: tokens, pods: Some(&pods) };
        index.score(&q).matches.first().map_or(0, |m| m.matched_blocks)
    }

    #[test]
    fn memory_bound_drops_only_new_residencies_and_counts_them() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, max_entries: 3, ..Default::default() });
        let report = index.apply("a", "m", &store(&[1, 2, 3, 4, 5], None, (0..10).collect()));
        assert_eq!(report.stored_blocks, 3);
        assert_eq!(report.skipped(SkipReason::IndexFull), 2);
        assert_eq!(matched(&index, "a", "m", &(0..10).collect::<Vec<_>>()), 3, "under-reports, never over");
        // A child of a refused block cannot resolve its parent: skipped, not guessed.
        let child = index.apply("a", "m", &store(&[6], Some(5), vec![10, 11]));
        assert_eq!(child.skipped(SkipReason::ParentUnknown), 1);
        assert_eq!(index.table().entries(), 3);
    }

    #[test]
    fn a_pod_that_switches_models_starts_empty() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        index.apply("a", "m1", &store(&[1], None, vec![1, 2]));
        assert_eq!(matched(&index, "a", "m1", &[1, 2]), 1);
        index.apply("a", "m2", &store(&[9], None, vec![5, 6]));
        assert_eq!(matched(&index, "a", "m1", &[1, 2]), 0);
        assert_eq!(matched(&index, "a", "m2", &[5, 6]), 1);
        assert_eq!(index.table().entries(), 1);
    }

    #[test]
    fn clear_and_remove_pod_leave_nothing_behind() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        index.apply("a", "m", &store(&[1, 2], None, vec![1, 2, 3, 4]));
        index.apply("b", "m", &store(&[1, 2], None, vec![1, 2, 3, 4]));
        assert_eq!(index.clear_pod("a"), 2);
        assert_eq!(matched(&index, "a", "m", &[1, 2, 3, 4]), 0);
        assert_eq!(matched(&index, "b", "m", &[1, 2, 3, 4]), 2);
        assert!(index.remove_pod("b"));
        assert!(!index.remove_pod("b"));
        assert_eq!((index.table().entries(), index.table().keys()), (0, 0));
        assert_eq!(index.pod_names(), vec!["a".to_string()]);
    }

    #[test]
    fn filter_naming_unknown_pods_matches_nothing() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        index.apply("a", "m", &store(&[1], None, vec![1, 2]));
        let pods = ["nope"];
        let q = ScoreQuery { model: "m", lora_name: None, cache_salt: None, token_ids: &[1, 2, 3], pods: Some(&pods) };
        let r = index.score(&q);
        assert_eq!(r.total_blocks, 1);
        assert!(r.matches.is_empty());
    }
}
