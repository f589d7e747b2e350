//! [`KvIndex`] itself: the tree, the pods' ingest states and their KV-cache group plans, and
//! the operations on them (apply, clear, remove, score). Its own file so that the parts it is
//! built from, and `export`, which adds to it, name it without naming `mod.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Atomic, Owned};
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use super::hybrid::{coordinate, GroupPlan, Held};
use super::ingest::{GroupSpec, IngestContext, PodIngest};
use super::pods::{PodId, Pods};
use super::score::{score, PodFilter, PodMatch};
use super::tiers::{Tiers, MAX_TIERS};
use super::tree::{BlockHashes, Tree};
use crate::keys::{namespace_of, namespace_root, PromptKeys};
use crate::vllm_hash::Verification;
use crate::wire::EventBatch;

use super::config::KvIndexConfig;
use super::report::ApplyReport;

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
    pub(super) config: KvIndexConfig,
    pub(super) tree: Tree,
    pub(super) pods: Pods,
    pub(super) tiers: Tiers,
    pub(super) states: RwLock<FxHashMap<PodId, Arc<Mutex<PodIngest>>>>,
    /// KV-cache groups of pods whose engine is not plain full attention in group 0, for
    /// scoring without taking any pod's lock (replaced whole when a pod's groups change).
    pub(super) plans: Atomic<FxHashMap<PodId, GroupPlan>>,
    pub(super) plans_writer: Mutex<()>,
    pub(super) any_plan: AtomicBool,
    /// The last version stamped on a pod (see `pod_version`).
    pub(super) versions: AtomicU64,
}

impl Drop for KvIndex {
    fn drop(&mut self) {
        // SAFETY: dropping the index: no reader remains.
        unsafe {
            drop(self.plans.load(Ordering::Relaxed, epoch::unprotected()).try_into_owned());
        }
    }
}

impl KvIndex {
    pub fn new(config: KvIndexConfig) -> Self {
        assert!(config.block_size > 0, "block_size must be positive");
        KvIndex {
            tree: Tree::new(config.shards, config.max_entries),
            pods: Pods::new(),
            tiers: Tiers::with_weights(config.tier_limits, config.tier_classes),
            states: RwLock::new(FxHashMap::default()),
            plans: Atomic::new(FxHashMap::default()),
            plans_writer: Mutex::new(()),
            any_plan: AtomicBool::new(false),
            versions: AtomicU64::new(0),
            config,
        }
    }

    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// The residency tree, for its size figures (entries, keys, bytes).
    pub fn table(&self) -> &Tree {
        &self.tree
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

    /// Applies one decoded batch of an engine whose block ids are not vLLM's recipe (SGLang,
    /// TensorRT-LLM): as [`apply`](Self::apply), without vLLM's hash check, which would count
    /// every one of its ids as a mismatch.
    pub fn apply_not_vllm(&self, pod: &str, model: &str, batch: &EventBatch<'_>) -> ApplyReport {
        let ctx = IngestContext { hash_check: None, ..self.context() };
        self.apply_in(&ctx, pod, model, batch)
    }

    /// The ingest state of `pod` serving `model`. A pod that switches models is cleared first:
    /// its old blocks belong to another namespace and engine.
    pub(super) fn state(&self, pod: &str, model: &str) -> Option<Arc<Mutex<PodIngest>>> {
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
            old.clear(&self.tree);
            drop(old);
            self.publish_plan(id, None);
        }
        let mut fresh = PodIngest::new(id, Arc::from(model));
        self.stamp(&mut fresh);
        let state = Arc::new(Mutex::new(fresh));
        states.insert(id, state.clone());
        Some(state)
    }

    /// Applies one decoded batch from `pod` (already resolved for DP rank) serving `model`.
    pub fn apply(&self, pod: &str, model: &str, batch: &EventBatch<'_>) -> ApplyReport {
        self.apply_in(&self.context(), pod, model, batch)
    }

    fn apply_in(&self, ctx: &IngestContext<'_>, pod: &str, model: &str, batch: &EventBatch<'_>) -> ApplyReport {
        let Some(state) = self.state(pod, model) else {
            return ApplyReport::default();
        };
        let mut state = state.lock();
        self.stamp(&mut state);
        // A hybrid engine's groups must be known before any of its blocks can be scored, so
        // the batch's group specs are published first.
        state.note_groups(self.config.block_size, batch);
        if state.take_groups_changed() {
            self.publish_plan(state.pod(), Some(state.groups()));
        }
        state.apply_batch(ctx, &self.tree, batch)
    }

    /// Records (or with `None`, forgets) a pod's KV-cache groups for scoring.
    pub(super) fn publish_plan(&self, pod: PodId, groups: Option<&[Option<GroupSpec>]>) {
        let _writer = self.plans_writer.lock();
        let guard = epoch::pin();
        // SAFETY: replaced only below (swap + defer_destroy), never null.
        let current = unsafe { self.plans.load(Ordering::Acquire, &guard).deref() };
        let plan = groups.filter(|g| !GroupPlan::is_plain(g)).map(|g| GroupPlan { groups: g.to_vec() });
        if current.get(&pod) == plan.as_ref() {
            return;
        }
        let mut next = current.clone();
        match plan {
            Some(plan) => next.insert(pod, plan),
            None => next.remove(&pod),
        };
        self.any_plan.store(!next.is_empty(), Ordering::Release);
        let old = self.plans.swap(Owned::new(next), Ordering::AcqRel, &guard);
        // SAFETY: unlinked by the swap; readers that loaded it are pinned.
        unsafe { guard.defer_destroy(old) };
    }

    /// Drops everything `pod` holds; its ingest state starts empty. Returns entries removed.
    pub fn clear_pod(&self, pod: &str) -> u64 {
        let Some(id) = self.pods.get(pod) else { return 0 };
        let state = self.states.read().get(&id).cloned();
        state.map_or(0, |s| {
            let mut s = s.lock();
            self.stamp(&mut s);
            s.clear(&self.tree)
        })
    }

    /// A number that changes whenever what `pod` holds may have changed (an applied batch, a
    /// clear, an import; a pod forgotten and seen again gets a new one), and never comes back.
    /// A snapshot that exported `pod` at this version holds exactly what it holds now.
    pub fn pod_version(&self, pod: &str) -> Option<u64> {
        let id = self.pods.get(pod)?;
        let state = self.states.read().get(&id).cloned()?;
        let version = state.lock().version();
        Some(version)
    }

    pub(super) fn stamp(&self, state: &mut PodIngest) {
        state.set_version(self.versions.fetch_add(1, Ordering::Relaxed) + 1);
    }

    /// Clears `pod` and forgets its state. Returns whether it was known.
    pub fn remove_pod(&self, pod: &str) -> bool {
        let Some(id) = self.pods.get(pod) else { return false };
        let state = self.states.write().remove(&id);
        match state {
            Some(s) => {
                s.lock().clear(&self.tree);
                self.publish_plan(id, None);
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
        let root = namespace_root(&namespace, 0);
        let mut keys = PromptQuery(PromptKeys::new(q.token_ids, bs, q.cache_salt));
        let weights = self.tiers.weights();
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
        let mut matches = if matches!(filter, PodFilter::Only(ids) if ids.is_empty()) {
            Vec::new()
        } else {
            score(&self.tree, root, &mut keys, filter, &weights)
        };
        if self.any_plan.load(Ordering::Acquire) {
            self.score_hybrid(&namespace, q.token_ids.len(), &mut keys, filter, &weights, &mut matches);
        }
        ScoreResult { total_blocks, matches }
    }

    /// Replaces the matches of pods with hybrid engines by what vLLM's coordinator would serve
    /// them: per group, what they hold along the prompt's chain, then the longest prefix every
    /// group can serve (capped, as vLLM caps it, at the prompt's tokens minus one).
    fn score_hybrid(
        &self,
        namespace: &str,
        tokens: usize,
        keys: &mut PromptQuery<'_>,
        filter: PodFilter<'_>,
        weights: &[f64; MAX_TIERS],
        matches: &mut Vec<PodMatch>,
    ) {
        let guard = epoch::pin();
        // SAFETY: replaced by swap + defer_destroy only, never null.
        let plans = unsafe { self.plans.load(Ordering::Acquire, &guard).deref() };
        let mut pods: Vec<(PodId, &GroupPlan, Vec<u32>)> = plans
            .iter()
            .filter(|(pod, _)| filter.admits(**pod))
            .map(|(pod, plan)| (*pod, plan, plan.order()))
            .collect();
        if pods.is_empty() {
            return;
        }
        pods.sort_unstable_by_key(|p| p.0);
        matches.retain(|m| pods.binary_search_by_key(&m.pod, |p| p.0).is_err());
        let bs = self.config.block_size;
        let cap = (tokens.saturating_sub(1) / bs) as u32;
        let mut groups: Vec<u32> = pods.iter().flat_map(|p| p.2.iter().copied()).collect();
        groups.sort_unstable();
        groups.dedup();
        let slot: FxHashMap<PodId, usize> = pods.iter().enumerate().map(|(i, p)| (p.0, i)).collect();
        // held[pod][group index in `groups`]
        let mut held: Vec<Vec<Held>> = vec![vec![Held::default(); groups.len()]; pods.len()];
        for (gi, &g) in groups.iter().enumerate() {
            self.tree.walk(namespace_root(namespace, g), keys, |span| {
                for h in span.holders {
                    if let Some(&i) = slot.get(&h.pod()) {
                        held[i][gi].push(&span, h.tiers());
                    }
                }
                span.depth + span.len < cap
            });
        }
        for (i, (pod, plan, order)) in pods.iter().enumerate() {
            let mine: Vec<Held> =
                order.iter().map(|g| held[i][groups.binary_search(g).expect("collected")].clone()).collect();
            if let Some(m) = coordinate(*pod, plan, &mine, cap, bs as u32, weights) {
                if m.matched_blocks > 0 {
                    matches.push(m);
                }
            }
        }
        matches.sort_unstable_by_key(|m| m.pod);
    }
}

/// A prompt's block keys as the tree walk asks for them.
struct PromptQuery<'a>(PromptKeys<'a>);

impl BlockHashes for PromptQuery<'_> {
    fn len(&self) -> usize {
        self.0.blocks()
    }
    #[inline]
    fn get(&mut self, i: usize) -> u64 {
        self.0.key(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::report::SkipReason;
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
