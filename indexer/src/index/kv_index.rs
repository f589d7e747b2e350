//! [`KvIndex`] itself: the tree, the pods' ingest states and their KV-cache group plans, and
//! the operations on them (apply, clear, remove, score). Its own file so that the parts it is
//! built from, and `export`, which adds to it, name it without naming `mod.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Guard};
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use super::groups::{is_plain, GroupSpec};
use super::hybrid::{coordinate, GroupPlan, Held};
use super::ingest::{IngestContext, PodIngest};
use super::pods::{PodId, Pods};
use super::published::Published;
use super::score::{score, score_in_units, PodFilter, PodMatch};
use super::tiers::{Tiers, MAX_TIERS};
use super::tree::{BlockHashes, Tree};
use super::units::{cap_blocks, Cut, PodRules};
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
    /// Pods credited at least one block (among the filtered pods), sorted by pod id.
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
    pub(super) plans: Published<GroupPlan>,
    /// How the matches of pods whose engine reuses more than a canonical block at a time, or
    /// drops a block for EAGLE, are cut (see `units`); pods with the default cut are absent.
    pub(super) cuts: Published<Cut>,
    /// The operator's rules per pod (only pods with rules other than the default), kept
    /// across clears, forgotten by `remove_pod`.
    rules: Mutex<FxHashMap<PodId, PodRules>>,
    /// The last version stamped on a pod (see `pod_version`).
    pub(super) versions: AtomicU64,
}

/// How often a score is retried when a pod's cut was published while it walked (rare: a cut
/// changes on a pod's first store of a new block size), before the pods whose cut moved are
/// left out of it.
const SCORE_TRIES: usize = 4;

impl KvIndex {
    pub fn new(config: KvIndexConfig) -> Self {
        assert!(config.block_size > 0, "block_size must be positive");
        KvIndex {
            tree: Tree::new(config.shards, config.max_entries),
            pods: Pods::new(),
            tiers: Tiers::with_weights(config.tier_limits, config.tier_classes),
            states: RwLock::new(FxHashMap::default()),
            plans: Published::default(),
            cuts: Published::default(),
            rules: Mutex::new(FxHashMap::default()),
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
    #[inline]
    pub fn apply_not_vllm(&self, pod: &str, model: &str, batch: &EventBatch<'_>) -> ApplyReport {
        let ctx = IngestContext { hash_check: None, ..self.context() };
        let mut report = ApplyReport::default();
        self.apply_in(&ctx, pod, model, batch, &mut report);
        report
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
        fresh.set_rules(self.rules.lock().get(&id).copied().unwrap_or_default());
        // What is published for the pod stays until the new state publishes its own.
        fresh.note_published(self.cuts.load(&epoch::pin()).get(&id).copied().unwrap_or_default());
        self.stamp(&mut fresh);
        let state = Arc::new(Mutex::new(fresh));
        states.insert(id, state.clone());
        Some(state)
    }

    /// Applies one decoded batch from `pod` (already resolved for DP rank) serving `model`.
    ///
    /// Inlined, so that the report is built where the caller keeps it: the stores write it
    /// last, and a copy of it right after (a return by value) stalls until those writes drain.
    #[inline]
    pub fn apply(&self, pod: &str, model: &str, batch: &EventBatch<'_>) -> ApplyReport {
        let mut report = ApplyReport::default();
        self.apply_in(&self.context(), pod, model, batch, &mut report);
        report
    }

    fn apply_in(
        &self,
        ctx: &IngestContext<'_>,
        pod: &str,
        model: &str,
        batch: &EventBatch<'_>,
        report: &mut ApplyReport,
    ) {
        let Some(state) = self.state(pod, model) else { return };
        let mut state = state.lock();
        self.stamp(&mut state);
        // A hybrid engine's groups must be known before any of its blocks can be scored, so
        // the batch's group specs are published first.
        state.note_groups(self.config.block_size, batch);
        if state.take_groups_changed() {
            self.publish_plan(state.pod(), Some(state.groups()));
        }
        // The batch's engine blocks may be larger than the pod's unit so far: the unit that
        // covers them is published before any of them can be scored, the exact one after.
        if let Some(cut) = state.cut_for_batch(self.config.block_size, batch) {
            self.publish_cut(&mut state, cut);
        }
        state.apply_batch(ctx, &self.tree, batch, report);
        if let Some(cut) = state.take_cut_change() {
            self.publish_cut(&mut state, cut);
        }
    }

    /// Records (or with `None`, forgets) a pod's KV-cache groups for scoring.
    pub(super) fn publish_plan(&self, pod: PodId, groups: Option<&[Option<GroupSpec>]>) {
        let plan = groups.filter(|g| !is_plain(g)).map(|g| GroupPlan { groups: g.to_vec() });
        self.plans.set(pod, plan);
    }

    /// Publishes `cut` as `state`'s pod's (under its lock, so a pod's cuts publish in order).
    pub(super) fn publish_cut(&self, state: &mut PodIngest, cut: Cut) {
        state.note_published(cut);
        self.cuts.set(state.pod(), (!cut.is_trivial()).then_some(cut));
    }

    /// Sets what the operator declares about `pod`'s engine (EAGLE, context parallelism; see
    /// [`PodRules`]). Kept across clears and restarts of the pod's stream, forgotten by
    /// [`remove_pod`](Self::remove_pod). Rules that do not validate are refused.
    pub fn set_pod_rules(&self, pod: &str, rules: PodRules) -> Result<(), String> {
        rules.validate()?;
        let Some(id) = self.pods.intern(pod) else { return Err("no room for another pod name".to_string()) };
        {
            let mut all = self.rules.lock();
            if rules == PodRules::default() {
                all.remove(&id);
            } else {
                all.insert(id, rules);
            }
        }
        let state = self.states.read().get(&id).cloned();
        if let Some(state) = state {
            let mut state = state.lock();
            if state.rules() != rules {
                state.set_rules(rules);
                if let Some(cut) = state.take_cut_change() {
                    self.publish_cut(&mut state, cut);
                }
            }
        }
        Ok(())
    }

    /// The operator's rules for `pod` (the default when none were set).
    pub fn pod_rules(&self, pod: &str) -> PodRules {
        self.pods.get(pod).and_then(|id| self.rules.lock().get(&id).copied()).unwrap_or_default()
    }

    /// The unit `pod` is credited in, in tokens (its engine's reusable block, times its
    /// context-parallel size), and whether it drops a unit for EAGLE. A pod that never stored a
    /// block has the canonical block as its unit.
    pub fn credit_unit(&self, pod: &str) -> (u32, bool) {
        let cut = self.cut_of(pod);
        (cut.unit.saturating_mul(self.config.block_size as u32), cut.eagle)
    }

    fn cut_of(&self, pod: &str) -> Cut {
        let Some(id) = self.pods.get(pod) else { return Cut::default() };
        let guard = epoch::pin();
        self.cuts.load(&guard).get(&id).copied().unwrap_or_default()
    }

    /// What `pod` can be credited of a run of `blocks` canonical blocks of a prompt of
    /// `num_tokens` tokens: whole units of its engine, never the last token, less a unit with
    /// EAGLE. For credit computed outside the index (RecordRoute's speculative runs).
    pub fn cut_credit(&self, pod: &str, blocks: u32, num_tokens: usize) -> u32 {
        self.cut_of(pod).credit(blocks, cap_blocks(num_tokens, self.config.block_size))
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
                self.cuts.set(id, None);
                self.rules.lock().remove(&id);
                true
            }
            None => {
                self.rules.lock().remove(&id);
                false
            }
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
    ///
    /// Every pod is credited at most `⌊(num_tokens - 1) / block_size⌋` blocks (the engine
    /// computes the prompt's last token), in whole units of its engine (see `units`).
    pub fn score(&self, q: &ScoreQuery<'_>) -> ScoreResult {
        let bs = self.config.block_size;
        let total_blocks = (q.token_ids.len() / bs) as u32;
        let namespace = namespace_of(q.model, q.lora_name, None);
        let root = namespace_root(&namespace, 0);
        let cap = cap_blocks(q.token_ids.len(), bs);
        let mut keys = PromptQuery { keys: PromptKeys::new(q.token_ids, bs, q.cache_salt), cap: cap as usize };
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
        if matches!(filter, PodFilter::Only(ids) if ids.is_empty()) {
            return ScoreResult { total_blocks, matches: Vec::new() };
        }
        let guard = epoch::pin();
        // The cuts are read before the walk and again after it: a cut is published before any
        // block it covers is stored, so if none was published meanwhile, every block the walk
        // saw is covered by the cuts it used. Else the score is taken again.
        let mut cuts = self.cuts.load(&guard);
        for attempt in 1..=SCORE_TRIES {
            let mut matches = if cuts.is_empty() {
                score(&self.tree, root, &mut keys, filter, &weights)
            } else {
                score_in_units(&self.tree, root, &mut keys, filter, &weights, |pod| cuts.get(&pod).copied())
            };
            if self.plans.any() {
                let query = HybridQuery { namespace: &namespace, keys: &mut keys, filter, weights: &weights };
                self.score_hybrid(query, cuts, &guard, &mut matches);
            }
            let after = self.cuts.load(&guard);
            if std::ptr::eq(after, cuts) {
                return ScoreResult { total_blocks, matches };
            }
            if attempt == SCORE_TRIES {
                // Still moving: the pods whose cut moved are not credited this time.
                matches.retain(|m| cuts.get(&m.pod) == after.get(&m.pod));
                return ScoreResult { total_blocks, matches };
            }
            cuts = after;
        }
        unreachable!("the last attempt returns")
    }

    /// Replaces the matches of pods with hybrid engines by what vLLM's coordinator would serve
    /// them: per group, what they hold along the prompt's chain, then the longest prefix every
    /// group can serve (capped, as vLLM caps it, at the prompt's tokens minus one), in whole
    /// units of the pod's cut.
    fn score_hybrid(
        &self,
        query: HybridQuery<'_, '_>,
        cuts: &FxHashMap<PodId, Cut>,
        guard: &Guard,
        matches: &mut Vec<PodMatch>,
    ) {
        let HybridQuery { namespace, keys, filter, weights } = query;
        // The prompt's keys stop at the cap (a u32 of blocks, see `score`).
        let cap = keys.cap as u32;
        let plans = self.plans.load(guard);
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
            let cut = cuts.get(pod).copied().unwrap_or_default();
            if let Some(m) = coordinate(*pod, plan, &mine, cap, bs as u32, cut, weights) {
                if m.matched_blocks > 0 {
                    matches.push(m);
                }
            }
        }
        matches.sort_unstable_by_key(|m| m.pod);
    }
}

/// What the hybrid engines' score walks with: the prompt's namespace and keys (up to its cap),
/// the pods it may credit and the tiers' weights.
struct HybridQuery<'a, 'k> {
    namespace: &'a str,
    keys: &'a mut PromptQuery<'k>,
    filter: PodFilter<'a>,
    weights: &'a [f64; MAX_TIERS],
}

/// A prompt's block keys as the tree walk asks for them: no further than `cap` blocks, past
/// which no pod can be credited.
struct PromptQuery<'a> {
    keys: PromptKeys<'a>,
    cap: usize,
}

impl BlockHashes for PromptQuery<'_> {
    fn len(&self) -> usize {
        self.keys.blocks().min(self.cap)
    }
    #[inline]
    fn get(&mut self, i: usize) -> u64 {
        self.keys.key(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::report::SkipReason;
    use crate::index::PodExport;
    use crate::wire::{BlockStored, EngineHash, Event};

    fn store(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> EventBatch<'static> {
        store_sized(hashes, parent, tokens, 2, None)
    }

    fn store_sized(
        hashes: &[u64],
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: i64,
        medium: Option<&'static str>,
    ) -> EventBatch<'static> {
        EventBatch {
            ts: 0.0,
            events: vec![Event::BlockStored(BlockStored {
                block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
                parent_block_hash: parent.map(EngineHash::Uint),
                token_ids: Some(tokens),
                block_size: Some(block_size),
                medium,
                ..Default::default()
            })],
            data_parallel_rank: Some(0),
        }
    }

    /// Canonical blocks of 2 tokens; each pod's matches for prompts sharing `k` tokens of
    /// `0..` and then differing, `n` tokens long.
    fn shared(index: &KvIndex, pod: &str, k: u32, n: u32) -> u32 {
        let prompt: Vec<u32> = (0..n).map(|t| if t < k { t } else { 1000 + t }).collect();
        matched(index, pod, "m", &prompt)
    }

    #[test]
    fn a_pod_is_credited_whole_engine_blocks_and_never_the_last_token() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        // Engine blocks of 8 tokens (4 canonical blocks), two of them; and a pod of 2.
        index.apply("big", "m", &store_sized(&[1, 2], None, (0..16).collect(), 8, None));
        index.apply("small", "m", &store_sized(&[1, 2, 3, 4, 5, 6, 7, 8], None, (0..16).collect(), 2, None));
        assert_eq!(index.credit_unit("big"), (8, false));
        assert_eq!(index.credit_unit("small"), (2, false));
        for k in 0..=16u32 {
            for n in [k, k + 1, 20] {
                // What the engine serves: whole engine blocks of the shared prefix, at most n - 1.
                let engine = |e: u32| k.min(n.saturating_sub(1)) / e * e;
                assert_eq!(shared(&index, "big", k, n) * 2, engine(8), "big, k {k} n {n}");
                assert_eq!(shared(&index, "small", k, n) * 2, engine(2), "small, k {k} n {n}");
            }
        }
        // A prompt of exactly the held blocks: the last token is computed, so one block less.
        assert_eq!(matched(&index, "small", "m", &(0..16).collect::<Vec<_>>()), 7);
        assert_eq!(matched(&index, "big", "m", &(0..16).collect::<Vec<_>>()), 4);
        assert_eq!(matched(&index, "big", "m", &(0..17).collect::<Vec<_>>()), 8);
        let q =
            ScoreQuery { model: "m", lora_name: None, cache_salt: None, token_ids: &[0, 1, 2, 3, 4, 5, 6], pods: None };
        let r = index.score(&q);
        assert_eq!(r.total_blocks, 3);
        assert_eq!(r.matches.iter().map(|m| m.matched_blocks).collect::<Vec<_>>(), [3], "big is credited nothing");
    }

    #[test]
    fn eagle_drops_a_unit_and_context_parallelism_multiplies_it() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        index.apply("a", "m", &store_sized(&[1, 2, 3, 4], None, (0..16).collect(), 4, None));
        assert_eq!(shared(&index, "a", 16, 20), 8);
        let eagle = PodRules { eagle: true, context_parallel: 1 };
        index.set_pod_rules("a", eagle).unwrap();
        assert_eq!(index.pod_rules("a"), eagle);
        assert_eq!((shared(&index, "a", 16, 20), shared(&index, "a", 9, 20), shared(&index, "a", 7, 20)), (6, 2, 0));
        assert_eq!(index.cut_credit("a", 8, 20), 6);
        index.set_pod_rules("a", PodRules { eagle: false, context_parallel: 2 }).unwrap();
        assert_eq!(index.credit_unit("a"), (8, false));
        assert_eq!((shared(&index, "a", 16, 20), shared(&index, "a", 15, 20)), (8, 4));
        assert!(index.set_pod_rules("a", PodRules { eagle: false, context_parallel: 0 }).is_err());
        // Rules outlive a clear and a restart of the stream, not the pod's removal.
        index.clear_pod("a");
        assert_eq!(index.pod_rules("a").context_parallel, 2);
        // Rules set before the pod has any state apply to its first store.
        index.set_pod_rules("b", eagle).unwrap();
        index.apply("b", "m", &store_sized(&[1, 2], None, (0..4).collect(), 2, None));
        assert_eq!(shared(&index, "b", 4, 9), 1);
        assert!(index.remove_pod("a"));
        assert_eq!(index.pod_rules("a"), PodRules::default());
        index.apply("a", "m", &store_sized(&[1, 2], None, (0..4).collect(), 2, None));
        assert_eq!(shared(&index, "a", 4, 9), 2);
    }

    #[test]
    fn a_stream_that_changes_block_size_is_cut_to_the_lcm_and_counted() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        let r = index.apply("a", "m", &store_sized(&[1], None, (0..4).collect(), 4, None));
        assert_eq!(r.block_size_changes, 0);
        // The same chain continued in blocks of 3 canonical blocks: the unit is now 6.
        let r = index.apply("a", "m", &store_sized(&[2], Some(1), (4..10).collect(), 6, None));
        assert_eq!((r.block_size_changes, r.stored_blocks), (1, 1));
        assert_eq!(index.credit_unit("a"), (12, false));
        assert_eq!(shared(&index, "a", 10, 20), 0, "5 blocks held, a unit of 6");
        // Another tier has a unit of its own: not a change.
        let r = index.apply("a", "m", &store_sized(&[7], None, (0..8).collect(), 8, Some("CPU")));
        assert_eq!(r.block_size_changes, 0);
        assert_eq!(index.credit_unit("a"), (24, false), "the lcm over the tiers");
        // A restart clears the pod: a new block size is its unit.
        index.clear_pod("a");
        assert_eq!(index.credit_unit("a"), (24, false), "until a store says otherwise");
        let r = index.apply("a", "m", &store_sized(&[1, 2], None, (0..8).collect(), 4, None));
        assert_eq!(r.block_size_changes, 0);
        assert_eq!(index.credit_unit("a"), (4, false));
        assert_eq!(shared(&index, "a", 8, 20), 4);
        // A block size that is not a multiple of the canonical one is refused, unit unchanged.
        let r = index.apply("a", "m", &store_sized(&[9], None, (0..3).collect(), 3, None));
        assert_eq!((r.skipped(SkipReason::BlockSizeMismatch), r.block_size_changes), (1, 0));
        assert_eq!(r.refused_block_size, Some(3));
        assert_eq!(index.credit_unit("a"), (4, false));
    }

    #[test]
    fn units_survive_an_export_and_old_exports_restore_them_from_spans() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        index.apply("a", "m", &store_sized(&[1], None, (0..4).collect(), 4, None));
        index.apply("a", "m", &store_sized(&[2], None, (10..16).collect(), 6, None));
        index.apply(
            "a",
            "m",
            &EventBatch {
                ts: 0.0,
                events: vec![Event::BlockRemoved(crate::wire::BlockRemoved {
                    block_hashes: vec![EngineHash::Uint(2)],
                    ..Default::default()
                })],
                data_parallel_rank: None,
            },
        );
        assert_eq!(index.credit_unit("a"), (12, false), "the blocks of 3 are gone, the unit stays");
        let export = index.export_pod("a").unwrap();
        let restored = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        restored.import_pod(&export);
        assert_eq!(restored.credit_unit("a"), (12, false));
        assert_eq!(shared(&restored, "a", 4, 9), 0);
        // An export without units (an older snapshot) takes its blocks' spans.
        let old = PodExport { units: Vec::new(), ..export };
        let restored = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        restored.import_pod(&old);
        assert_eq!(restored.credit_unit("a"), (4, false));
        assert_eq!(shared(&restored, "a", 4, 9), 2);
        assert_eq!(shared(&restored, "a", 3, 9), 0);
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
        assert_eq!(matched(&index, "a", "m1", &[1, 2, 0]), 1);
        index.apply("a", "m2", &store(&[9], None, vec![5, 6]));
        assert_eq!(matched(&index, "a", "m1", &[1, 2, 0]), 0);
        assert_eq!(matched(&index, "a", "m2", &[5, 6, 0]), 1);
        assert_eq!(index.table().entries(), 1);
    }

    #[test]
    fn clear_and_remove_pod_leave_nothing_behind() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        index.apply("a", "m", &store(&[1, 2], None, vec![1, 2, 3, 4]));
        index.apply("b", "m", &store(&[1, 2], None, vec![1, 2, 3, 4]));
        assert_eq!(index.clear_pod("a"), 2);
        assert_eq!(matched(&index, "a", "m", &[1, 2, 3, 4, 0]), 0);
        assert_eq!(matched(&index, "b", "m", &[1, 2, 3, 4, 0]), 2);
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
