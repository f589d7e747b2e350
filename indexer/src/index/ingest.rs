//! Applying one pod's decoded events to the index.
//!
//! Each pod resolves the engine's block hashes (per KV-cache group) to the tree's block
//! positions, for `parent_block_hash` and `BlockRemoved`, and keeps the set of segments it holds
//! blocks in as its reverse index: clearing a pod walks only that pod's segments. It also
//! records what the engine says about its KV-cache groups, which hybrid scoring needs. Nothing is guessed: a store whose
//! parent is unknown, whose sizes disagree, or whose tier cannot be named is skipped and
//! counted, which can only under-report.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crossbeam_epoch::Guard;

use super::config::HashCheck;
use super::groups::{is_plain, GroupKind, GroupSpec, MAX_GROUPS};
use super::pod_segments::PodSegments;
use super::pods::PodId;
use super::report::{ApplyReport, SkipReason};
use super::tiers::{TierId, TierRefusal, Tiers, MAX_TIERS};
use super::tree::{EditStats, HeldBlock, HeldChain, ParentKey, Pos, Stored, Tree};
use super::units::{lcm, Cut, EngineUnits, PodRules};
use crate::keys::extra_keys::encode_block_extras;
use crate::keys::{block_key, block_keys, namespace_of, namespace_root, BlockKey, Extras};
use crate::vllm_hash::{ParentRef, PublishedHash, Verification};
use crate::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch, Value};

/// The shared pieces every pod's ingest needs.
pub struct IngestContext<'a> {
    pub tiers: &'a Tiers,
    /// Canonical block size of our keys.
    pub block_size: usize,
    pub hash_check: Option<&'a HashCheck>,
}

/// One pod's view of its engine: which segments it holds blocks in, how its engine hashes
/// resolve, its KV-cache groups, and per-tier block counts.
///
/// Engine hashes are scoped by the pod's model and KV-cache group (`scope`) before they reach
/// the index's shared engine table, so two models that happen to hash the same tokens alike
/// never resolve to each other's blocks.
pub struct PodIngest {
    pod: PodId,
    model: Arc<str>,
    /// Every segment this pod holds a block in (a superset: the reverse index for clears).
    segments: PodSegments,
    /// Scoped engine hashes whose block recorded another engine hash (a pod hashing
    /// differently from the first holder, or a LoRA path the key does not see), with the
    /// block's segment's first key as a guard against a reused segment number.
    exceptions: FxHashMap<u64, (Pos, u64)>,
    /// The exceptions by block (packed position → scoped engine hash): an eviction names the
    /// block before the evicted one by it, and a scan of `exceptions` there made every removal
    /// cost O(the pod's exceptions), which a pod hashing unlike the fleet has by the hundred
    /// thousand.
    exception_at: FxHashMap<u64, u64>,
    /// Engine blocks spanning several canonical blocks: how many.
    spans: FxHashMap<u64, u32>,
    /// Canonical blocks (packed positions) that more than one of this pod's engine blocks
    /// cover: two engine blocks that agree on a canonical block and then differ share it, and
    /// evicting one must not drop it, nor leave behind a tier only the evicted one held it in.
    /// Rare, so a map.
    covers: FxHashMap<u64, Cover>,
    /// This pod's chain ends: scoped engine hash → (position, the segment's first key) of the
    /// last block of each store, and of the block before each evicted one (one entry per store,
    /// not per block). A store's parent is the end of an earlier store, and vLLM evicts a chain
    /// from its end (LRU, tail first), so these resolve nearly every lookup without the engine
    /// table.
    ends: FxHashMap<u64, (u64, u64)>,
    /// Whether this pod's blocks are in the engine table: once a lookup misses its chain ends
    /// (an eviction out of chain order, a tier re-announcement of an inner block), its blocks
    /// are indexed in one pass and every later store indexes its own.
    indexed: bool,
    /// Within `restore_run`: the blocks come from an export, which names each of the pod's
    /// engine blocks once, so a name the pod's own maps do not hold names nothing of it yet
    /// and the engine table is not asked (see `claim`).
    restoring: bool,
    /// Scope seed per KV-cache group.
    scopes: Vec<u64>,
    /// Per KV-cache group: what the engine said about it (None = never seen).
    groups: Vec<Option<GroupSpec>>,
    groups_changed: bool,
    /// Canonical blocks resident per tier and in any tier (for `/debug/sources`).
    tier_blocks: [u64; MAX_TIERS],
    /// Every tier this pod's engine has stored blocks in (kept across clears, so reconnecting
    /// does not renew a source's allowance of [`TierLimits::max_per_source`](super::tiers::TierLimits)).
    tiers_used: u8,
    blocks: u64,
    extras: Extras,
    keys_scratch: Vec<BlockKey>,
    ends_scratch: Vec<(usize, u64)>,
    stores_seen: u64,
    hash_check: Verification,
    /// Stamped by the index whenever this pod's residencies may change (see `KvIndex::pod_version`).
    version: u64,
    /// The engine block sizes stored per group and tier (see `units`).
    units: EngineUnits,
    /// The operator's rules for this pod (a copy of the index's, under this pod's lock).
    rules: PodRules,
    /// The cut last published for scoring.
    published_cut: Cut,
    /// Per tier, the wrapping sum of the pod's residency hashes (see `digest`).
    digest: [u64; MAX_TIERS],
}

/// The pod: its identity, version and figures.
impl PodIngest {
    pub fn new(pod: PodId, model: Arc<str>) -> Self {
        PodIngest {
            pod,
            model,
            segments: PodSegments::default(),
            exceptions: FxHashMap::default(),
            exception_at: FxHashMap::default(),
            spans: FxHashMap::default(),
            covers: FxHashMap::default(),
            ends: FxHashMap::default(),
            indexed: false,
            restoring: false,
            scopes: Vec::new(),
            groups: Vec::new(),
            groups_changed: false,
            tier_blocks: [0; MAX_TIERS],
            tiers_used: 0,
            blocks: 0,
            extras: Extras::new(),
            keys_scratch: Vec::new(),
            ends_scratch: Vec::new(),
            stores_seen: 0,
            hash_check: Verification::default(),
            version: 0,
            units: EngineUnits::default(),
            rules: PodRules::default(),
            published_cut: Cut::default(),
            digest: [0; MAX_TIERS],
        }
    }

    /// See `KvIndex::pod_version`.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub(super) fn set_version(&mut self, version: u64) {
        self.version = version;
    }

    pub fn pod(&self) -> PodId {
        self.pod
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// Canonical blocks this pod holds, per tier id.
    pub fn tier_blocks(&self) -> [u64; MAX_TIERS] {
        self.tier_blocks
    }

    /// Totals of the sampled hash cross-check for this pod.
    pub fn hash_check(&self) -> Verification {
        self.hash_check
    }

    /// Per tier id, the sum of this pod's residency hashes (see `digest`).
    pub fn digest_sums(&self) -> [u64; MAX_TIERS] {
        self.digest
    }

    /// Canonical blocks this pod holds in any tier.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    fn note_stats(&mut self, stats: &EditStats) {
        self.blocks = (self.blocks + stats.gained).saturating_sub(stats.lost);
        for (i, count) in self.tier_blocks.iter_mut().enumerate() {
            *count = (*count + stats.tier_gained[i]).saturating_sub(stats.tier_lost[i]);
        }
        for (sum, d) in self.digest.iter_mut().zip(stats.digest) {
            *sum = sum.wrapping_add(d);
        }
    }

    /// Drops everything this pod holds: `AllBlocksCleared`, a restart, an unrecoverable gap,
    /// or unregistration. Costs O(this pod's segments). Returns the entries removed.
    pub fn clear(&mut self, tree: &Tree) -> u64 {
        let guard = tree.pin();
        let stats = tree.clear_pod(self.pod, self.segments.iter(), &guard);
        self.segments.clear();
        self.exceptions = FxHashMap::default();
        self.exception_at = FxHashMap::default();
        self.spans = FxHashMap::default();
        self.covers = FxHashMap::default();
        self.ends = FxHashMap::default();
        self.indexed = false;
        self.tier_blocks = [0; MAX_TIERS];
        self.blocks = 0;
        self.units.clear();
        self.digest = [0; MAX_TIERS];
        stats.lost
    }
}

/// Engine units and the cut scores use (see `units`).
impl PodIngest {
    /// The pod's engine units (see `units`).
    pub fn units(&self) -> &EngineUnits {
        &self.units
    }

    pub(super) fn rules(&self) -> PodRules {
        self.rules
    }

    pub(super) fn set_rules(&mut self, rules: PodRules) {
        self.rules = rules;
    }

    /// How this pod's matches are cut now: its unit (group 0's for a plain engine, every
    /// group's for a hybrid one, which the coordinator aligns to) times its context-parallel
    /// size, and its EAGLE rule.
    pub fn cut(&self) -> Cut {
        self.cut_with(1)
    }

    /// [`cut`](Self::cut), with the unit also a multiple of `extra`.
    fn cut_with(&self, extra: u32) -> Cut {
        let base = if is_plain(&self.groups) { self.units.plain() } else { self.units.all() };
        Cut { unit: lcm(base, extra).saturating_mul(self.rules.context_parallel.max(1)), eagle: self.rules.eagle }
    }

    /// The cut that covers this pod while `batch` is applied: its stores may bring engine
    /// blocks of a size not noted yet, and no reader may see one of their blocks under a
    /// smaller unit. `None` when that is the cut already published.
    pub(super) fn cut_for_batch(&self, block_size: usize, batch: &EventBatch<'_>) -> Option<Cut> {
        let plain = is_plain(&self.groups);
        let mut extra = 1;
        for event in &batch.events {
            if let Event::BlockStored(s) = event {
                let bs = s.block_size.and_then(|b| usize::try_from(b).ok()).unwrap_or(0);
                let full = s.token_ids.as_ref().is_some_and(|t| !t.is_empty());
                if full && bs > 0 && bs.is_multiple_of(block_size) && (!plain || s.group_idx.unwrap_or(0) == 0) {
                    extra = lcm(extra, u32::try_from(bs / block_size).unwrap_or(u32::MAX));
                }
            }
        }
        let cut = self.cut_with(extra);
        (cut != self.published_cut).then_some(cut)
    }

    /// The cut to publish now, if it changed since it was last published (noted as published).
    pub(super) fn take_cut_change(&mut self) -> Option<Cut> {
        let cut = self.cut();
        (cut != self.published_cut).then(|| {
            self.published_cut = cut;
            cut
        })
    }

    /// Notes `cut` as published (one that covers the current one, for a batch being applied).
    pub(super) fn note_published(&mut self, cut: Cut) {
        self.published_cut = cut;
    }
}

/// KV-cache groups, and the scope each group gives its engine hashes.
impl PodIngest {
    /// The KV-cache groups the engine has published, by index.
    pub fn groups(&self) -> &[Option<GroupSpec>] {
        &self.groups
    }

    /// Whether `groups()` changed since the last call.
    pub fn take_groups_changed(&mut self) -> bool {
        std::mem::take(&mut self.groups_changed)
    }

    /// Notes the KV-cache groups a batch's events name (and their kinds and block sizes)
    /// without applying anything, so they are known before any of the batch's blocks are.
    pub fn note_groups(&mut self, block_size: usize, batch: &EventBatch<'_>) {
        for event in &batch.events {
            let (group, kind, tokens) = match event {
                Event::BlockStored(s) => {
                    let kind = s.kv_cache_spec_kind.map(|k| GroupKind::from_event(k, s.kv_cache_spec_sliding_window));
                    let bs = s.block_size.and_then(|b| u32::try_from(b).ok()).unwrap_or(0);
                    let full = s.token_ids.as_ref().is_some_and(|t| !t.is_empty())
                        && bs > 0
                        && (bs as usize).is_multiple_of(block_size.max(1));
                    (s.group_idx, kind, if full { bs } else { 0 })
                }
                Event::BlockRemoved(r) => (r.group_idx, None, 0),
                _ => continue,
            };
            if usize::try_from(group.unwrap_or(0)).is_ok_and(|g| g < MAX_GROUPS) {
                self.note_group(group, kind, tokens);
            }
        }
    }

    /// Notes what an event says about its group: that it exists, its kind, its block size.
    fn note_group(&mut self, group_idx: Option<i64>, kind: Option<GroupKind>, block_tokens: u32) {
        let g = group_idx.unwrap_or(0) as usize;
        if self.groups.len() <= g {
            self.groups.resize(g + 1, None);
            self.groups_changed = true;
        }
        let old = self.groups[g];
        let mut spec = old.unwrap_or(GroupSpec { kind: GroupKind::AsFull, block_tokens: 0 });
        if let Some(kind) = kind {
            spec.kind = kind;
        }
        spec.block_tokens = spec.block_tokens.max(block_tokens);
        if old != Some(spec) {
            self.groups[g] = Some(spec);
            self.groups_changed = true;
        }
    }

    /// The scoped engine hash of `engine` in KV-cache group `group_idx`; `None` when the group
    /// is out of range.
    fn scoped(&mut self, group_idx: Option<i64>, engine: u64) -> Option<u64> {
        self.scope(group_idx).map(|scope| scoped_in(scope, engine))
    }

    /// The scope of KV-cache group `group_idx` (see [`scoped_in`]); `None` when the group is
    /// out of range.
    fn scope(&mut self, group_idx: Option<i64>) -> Option<u64> {
        let g = usize::try_from(group_idx.unwrap_or(0)).ok().filter(|g| *g < MAX_GROUPS)?;
        while self.scopes.len() <= g {
            let group = self.scopes.len() as u32;
            self.scopes.push(namespace_root(&self.model, group) ^ SCOPE_SALT);
        }
        Some(self.scopes[g])
    }
}

/// Applying a batch: each event stored, re-announced or removed.
impl PodIngest {
    /// Applies a batch's events in order, adding what it did to `report` (filled in place by
    /// the caller: a report returned by value is copied right after the stores wrote it, which
    /// stalls until those writes drain).
    pub fn apply_batch(
        &mut self,
        ctx: &IngestContext<'_>,
        tree: &Tree,
        batch: &EventBatch<'_>,
        report: &mut ApplyReport,
    ) {
        let guard = tree.pin();
        for (i, event) in batch.events.iter().enumerate() {
            match event {
                Event::BlockStored(s) if is_sparse(s) => {
                    report.stored_events += 1;
                    let dense = dense_sibling(&batch.events, i, s);
                    self.apply_stored(ctx, tree, &guard, s, dense, report);
                }
                _ => self.apply_event(ctx, tree, &guard, event, report),
            }
        }
    }

    /// Applies one event on its own. A sparse store (see [`dense_sibling`]) needs its batch,
    /// so here it is skipped as `token_count_mismatch`.
    pub fn apply_event(
        &mut self,
        ctx: &IngestContext<'_>,
        tree: &Tree,
        guard: &Guard,
        event: &Event<'_>,
        report: &mut ApplyReport,
    ) {
        match event {
            Event::BlockStored(s) => {
                report.stored_events += 1;
                self.apply_stored(ctx, tree, guard, s, None, report);
            }
            Event::BlockRemoved(r) => {
                report.removed_events += 1;
                self.apply_removed(ctx, tree, guard, r, report);
            }
            Event::AllBlocksCleared { .. } => {
                report.cleared_events += 1;
                self.clear(tree);
            }
            Event::Unknown { .. } => report.unknown_events += 1,
        }
    }

    /// The tier of a store's `medium`, after checking its tier and group can be recorded;
    /// `None` (with the event's blocks counted as skipped) when they cannot. A tier new to this
    /// pod must fit its per-source allowance before its name may be learned by the table.
    fn event_tier(
        &mut self,
        ctx: &IngestContext<'_>,
        medium: Option<&str>,
        group_idx: Option<i64>,
        blocks: u64,
        report: &mut ApplyReport,
    ) -> Option<TierId> {
        if self.scoped(group_idx, 0).is_none() {
            report.skip(SkipReason::GroupOutOfRange, blocks);
            return None;
        }
        // The tier if the table knows it, else the name to learn.
        let known = match medium {
            None => Ok(TierId::GPU),
            Some(m) => ctx.tiers.lookup(m).ok_or(m),
        };
        let new_to_pod = known.map_or(true, |t| self.tiers_used & t.bit() == 0);
        if new_to_pod && self.tiers_used.count_ones() as usize >= ctx.tiers.limits().max_per_source {
            report.skip(SkipReason::SourceTierLimit, blocks);
            return None;
        }
        let tier = match known.or_else(|m| ctx.tiers.learn(m)) {
            Ok(t) => t,
            Err(refusal) => {
                let reason = match refusal {
                    TierRefusal::BadName => SkipReason::BadTierName,
                    TierRefusal::TableFull => SkipReason::TooManyTiers,
                };
                report.skip(reason, blocks);
                return None;
            }
        };
        self.tiers_used |= tier.bit();
        Some(tier)
    }

    fn apply_stored(
        &mut self,
        ctx: &IngestContext<'_>,
        tree: &Tree,
        guard: &Guard,
        ev: &BlockStored<'_>,
        dense: Option<&BlockStored<'_>>,
        report: &mut ApplyReport,
    ) {
        let blocks = ev.block_hashes.len() as u64;
        let Some(tier) = self.event_tier(ctx, ev.medium, ev.group_idx, blocks, report) else { return };
        if ctx.tiers.is_unweighted(tier) {
            report.unweighted_tier_blocks += blocks;
        }
        if ev.odd_token_ids.is_some() {
            // Bigram pages depend on the token after them, wide or placeholder ids are no u32
            // a prompt has: no query names these blocks, and they must not look re-announced.
            return report.skip(SkipReason::UnkeyableTokens, blocks);
        }
        let kind = ev.kv_cache_spec_kind.map(|k| GroupKind::from_event(k, ev.kv_cache_spec_sliding_window));
        let tokens = ev.token_ids.as_deref().unwrap_or(&[]);
        if tokens.is_empty() {
            self.note_group(ev.group_idx, kind, 0);
            return self.apply_reannounce(tree, guard, ev, tier, report);
        }
        let engine_bs = match usize::try_from(ev.block_size.unwrap_or(0)) {
            Ok(bs) if bs > 0 => bs,
            _ => return report.skip(SkipReason::BlockSizeMismatch, blocks),
        };
        if engine_bs % ctx.block_size != 0 {
            report.refused_block_size = Some(engine_bs as u64);
            return report.skip(SkipReason::BlockSizeMismatch, blocks);
        }
        let per_block_units = u32::try_from(engine_bs / ctx.block_size).unwrap_or(u32::MAX);
        if self.units.note(ev.group_idx.unwrap_or(0) as u32, tier.0, per_block_units) {
            report.block_size_changes += 1;
        }
        // Which blocks of the event's token range it holds: all of them, or for a sparse store
        // (a sliding-window group's, which names only the blocks it kept) the ones its hashes
        // name in the dense store of another group that covers the same tokens.
        let mut held: SmallVec<[usize; 16]> = SmallVec::new();
        let all_held = Some(tokens.len()) == ev.block_hashes.len().checked_mul(engine_bs);
        let layout = if all_held {
            held.extend(0..ev.block_hashes.len());
            self.maybe_check_hashes(ctx, ev, tokens, engine_bs, report);
            ev
        } else {
            match dense.and_then(|d| sparse_positions(ev, d, &mut held).then_some(d)) {
                Some(d) => d,
                None => return report.skip(SkipReason::TokenCountMismatch, blocks),
            }
        };
        self.note_group(ev.group_idx, kind, engine_bs as u32);
        let group = ev.group_idx.unwrap_or(0);
        let root = ParentKey::Root(namespace_root(&namespace_of(&self.model, ev.lora_name, ev.lora_id), group as u32));
        let mut keys = std::mem::take(&mut self.keys_scratch);
        keys.clear();
        let parent = match &ev.parent_block_hash {
            None => root,
            Some(h) => {
                let scoped = self.scoped(ev.group_idx, h.key()).expect("group checked above");
                match self.resolve_or_index(tree, guard, scoped) {
                    // It stays a known end: the pod may continue it again (a shared prefix).
                    Some(pos) => ParentKey::Block(pos.pack()),
                    // A sliding-window or Mamba group keeps blocks whose parents it dropped (or
                    // never cached). vLLM hashes a prefix alike in every group, so another group
                    // of this pod that holds the parent names the path; the new blocks hang off
                    // it without this group holding the path.
                    None => match self.resolve_in_other_group(tree, guard, group, h.key()) {
                        Some(pos) => {
                            keys.extend(tree.path_keys(pos, guard));
                            root
                        }
                        None => {
                            self.keys_scratch = keys;
                            return report.skip(SkipReason::ParentUnknown, blocks);
                        }
                    },
                }
            }
        };
        let prefix = keys.len();
        let per_block = engine_bs / ctx.block_size;
        let last_held = held.last().copied().unwrap_or(0);
        let engine_blocks = (last_held + 1).min(tokens.len() / engine_bs);
        // Every canonical block keyed plain in one call (several in flight), then the few with
        // extras keyed again.
        block_keys(&tokens[..engine_blocks * engine_bs], ctx.block_size, &mut keys);
        let mut extras = std::mem::take(&mut self.extras);
        // Most events carry none of what follows: their blocks are keyed plain already.
        let any_extras = layout.extra_keys.is_some()
            || layout.cache_salt.is_some()
            || layout.mm_keys.is_some()
            || layout.lookahead_token_ids.is_some();
        for i in (0..engine_blocks).filter(|_| any_extras) {
            extras.clear();
            if let Some(entry) = layout.extra_keys.as_ref().and_then(|e| e.get(i)) {
                encode_block_extras(entry, layout.lora_name, layout.lora_id, &mut extras);
            }
            if i == 0 && layout.parent_block_hash.is_none() {
                // A salt published beside the blocks (SGLang) folds into the chain's first
                // block exactly as a query's `cache_salt` does, so only salted prompts match.
                if let Some(salt) = layout.cache_salt.filter(|s| !s.is_empty()) {
                    extras.push_str(salt);
                }
            }
            if let Some(Value::Array(segments)) = layout.mm_keys.as_ref().and_then(|m| m.get(i)) {
                if !segments.is_empty() {
                    // TensorRT-LLM's multimodal hashes are its own; no query names them yet, so
                    // such a block must never match a plain prefix.
                    extras.push_opaque(b'm');
                }
            }
            if let Some(lookahead) = layout.lookahead_token_ids.as_ref().and_then(|l| l.get(i)) {
                // Lookahead hashing makes the engine's block depend on tokens past it; a query
                // cannot reproduce that, so such blocks must never match a plain prefix.
                extras.push_tokens(lookahead);
            }
            if !extras.is_empty() {
                // Extras fold into the engine block's first canonical block; the tree carries
                // them to the rest.
                let first = &tokens[i * engine_bs..i * engine_bs + ctx.block_size];
                keys[prefix + i * per_block] = block_key(first, extras.as_bytes());
            }
        }
        self.extras = extras;
        let mut ends = std::mem::take(&mut self.ends_scratch);
        let mut stored_blocks = 0u64;
        let mut run_start = 0;
        // One tree store per run of consecutive held blocks; the blocks between runs are path
        // this group does not hold.
        let scope = self.scope(ev.group_idx).expect("group checked above");
        while run_start < held.len() {
            let mut run_end = if all_held { held.len() } else { run_start + 1 };
            while run_end < held.len() && held[run_end] == held[run_end - 1] + 1 {
                run_end += 1;
            }
            ends.clear();
            for (k, &i) in held.iter().enumerate().take(run_end).skip(run_start) {
                let scoped = scoped_in(scope, ev.block_hashes[k].key());
                if self.indexed {
                    // Its engine-table slot is a cache miss when the store records it: start it now.
                    tree.prefetch_engine(scoped);
                }
                ends.push((prefix + (i + 1) * per_block - 1, scoped));
            }
            let hold_from = prefix + held[run_start] * per_block;
            let upto = prefix + (held[run_end - 1] + 1) * per_block;
            let run = Run { tier, parent, keys: &keys[..upto], hold_from, ends: &ends };
            let whole = self.store_run(tree, guard, run, per_block, None);
            stored_blocks += whole as u64;
            if whole < run_end - run_start {
                break;
            }
            run_start = run_end;
        }
        report.stored_blocks += stored_blocks;
        report.skip(SkipReason::IndexFull, blocks - stored_blocks);
        self.keys_scratch = keys;
        self.ends_scratch = ends;
    }

    /// Stores `keys[hold_from..]` for this pod (the keys before it are path it need not
    /// hold), engine blocks of `per_block` canonical blocks ending at `ends`; settles what
    /// their engine hashes name. Returns the engine blocks applied, and with `placed`, appends
    /// the position of each one's last block there.
    fn store_run(
        &mut self,
        tree: &Tree,
        guard: &Guard,
        run: Run<'_>,
        per_block: usize,
        placed: Option<&mut Vec<Pos>>,
    ) -> usize {
        let Run { tier, parent, keys, hold_from, ends } = run;
        let chain = HeldChain {
            pod: self.pod,
            tier_bit: tier.bit(),
            parent,
            hashes: keys,
            hold_from,
            ends,
            index: self.indexed,
        };
        // Filled in place: a store's result is large, and a move of it copies what the tree
        // has just written (a stall while the writes drain).
        let mut stored = Stored::default();
        tree.store_into(chain, guard, &mut stored);
        self.note_stats(&stored.stats);
        for &seg in &stored.segments {
            self.segments.insert(seg);
        }
        let applied = stored.applied.saturating_sub(hold_from);
        let whole = applied / per_block;
        if let (true, Some(last)) = (!applied.is_multiple_of(per_block), stored.last) {
            // The bound cut an engine block: without its last block the engine hash cannot
            // name it, so nothing could ever remove what was held of it. Let go what this
            // store added of it (what the pod held before, through its other engine blocks, it
            // still holds).
            let cut = applied % per_block;
            if stored.held_before.is_empty() {
                let (_, _, stats) = tree.release(self.pod, last, cut as u32, tier.bit(), guard);
                self.note_stats(&stats);
            } else {
                let mut added: SmallVec<[Pos; 8]> = SmallVec::new();
                let mut pos = Some(last);
                for idx in (stored.applied - cut..stored.applied).rev() {
                    let Some(p) = pos else { break };
                    if held_before(&stored, idx).is_none_or(|tiers| tiers & tier.bit() == 0) {
                        added.push(p);
                    }
                    pos = tree.previous(p, guard);
                }
                for p in added {
                    let (_, _, stats) = tree.release(self.pod, p, 1, tier.bit(), guard);
                    self.note_stats(&stats);
                }
            }
        }
        if per_block > 1 && !stored.held_before.is_empty() {
            let engine_blocks = EngineBlocks { hold_from, per_block, whole, tier_bit: tier.bit() };
            self.note_covers(tree, guard, &stored, engine_blocks);
        }
        for (j, &(pos, recorded)) in stored.ends.iter().enumerate().take(whole) {
            // A block recorded under its own engine hash, by a pod with no exceptions or
            // multi-block engine blocks, has nothing to settle (`claim` would look nothing up).
            let plain = recorded && per_block == 1 && self.exceptions.is_empty() && self.spans.is_empty();
            if !plain {
                self.claim(tree, guard, ends[j].1, pos, per_block as u32, recorded);
            }
        }
        if let Some(j) = whole.checked_sub(1) {
            self.note_end(tree, guard, ends[j].1, stored.ends[j].0);
        }
        if let Some(placed) = placed {
            placed.extend(stored.ends.iter().take(whole).map(|&(pos, _)| pos));
        }
        whole
    }

    fn maybe_check_hashes(
        &mut self,
        ctx: &IngestContext<'_>,
        ev: &BlockStored<'_>,
        tokens: &[u32],
        engine_bs: usize,
        report: &mut ApplyReport,
    ) {
        let Some(check) = ctx.hash_check else { return };
        self.stores_seen += 1;
        if check.every == 0 || !(self.stores_seen - 1).is_multiple_of(u64::from(check.every)) {
            return;
        }
        let hashes: Vec<PublishedHash<'_>> = ev.block_hashes.iter().map(published).collect();
        let parent = ev.parent_block_hash.as_ref().map_or(ParentRef::Root, |p| ParentRef::Published(published(p)));
        let carries_extra: Vec<bool> = (0..ev.block_hashes.len())
            .map(|i| {
                ev.lora_id.is_some()
                    || ev.lora_name.is_some()
                    || ev.lookahead_token_ids.is_some()
                    || ev.extra_keys.as_ref().and_then(|e| e.get(i)).is_some_and(|e| !matches!(e, Value::Nil))
            })
            .collect();
        let v = check.hasher.verify_chain(parent, tokens, engine_bs, &hashes, &carries_extra);
        self.hash_check.merge(&v);
        report.hash_check.merge(&v);
    }

    /// A store without tokens re-announces known blocks in another tier (vLLM's CPU offload).
    fn apply_reannounce(
        &mut self,
        tree: &Tree,
        guard: &Guard,
        ev: &BlockStored<'_>,
        tier: TierId,
        report: &mut ApplyReport,
    ) {
        for hash in &ev.block_hashes {
            let scoped = self.scoped(ev.group_idx, hash.key()).expect("group checked by caller");
            let Some(last) = self.resolve_or_index(tree, guard, scoped) else {
                report.skip(SkipReason::UnknownBlock, 1);
                continue;
            };
            let count = self.spans.get(&scoped).copied().unwrap_or(1);
            if self.units.note(ev.group_idx.unwrap_or(0) as u32, tier.0, count) {
                report.block_size_changes += 1;
            }
            let gains = count > 1 && !self.covers.is_empty() && tree.tiers_at(last, self.pod, guard) & tier.bit() == 0;
            let (stats, refused) = tree.retier(self.pod, last, count, tier.bit(), guard);
            self.note_stats(&stats);
            if gains {
                self.cover_gain(tree, guard, last, count, tier.bit());
            }
            if refused > 0 {
                report.skip(SkipReason::IndexFull, 1);
            } else {
                report.stored_blocks += 1;
            }
        }
    }

    fn apply_removed(
        &mut self,
        ctx: &IngestContext<'_>,
        tree: &Tree,
        guard: &Guard,
        ev: &BlockRemoved<'_>,
        report: &mut ApplyReport,
    ) {
        let blocks = ev.block_hashes.len() as u64;
        if self.scoped(ev.group_idx, 0).is_none() {
            report.skip(SkipReason::GroupOutOfRange, blocks);
            return;
        }
        // A removal never learns a name: no block can be held in a tier the table lacks.
        let tier = match ev.medium {
            None => TierId::GPU,
            Some(m) => match ctx.tiers.lookup(m) {
                Some(t) => t,
                None => {
                    report.removed_unknown += blocks;
                    return;
                }
            },
        };
        self.note_group(ev.group_idx, None, 0);
        for hash in &ev.block_hashes {
            let scoped = self.scoped(ev.group_idx, hash.key()).expect("group checked above");
            if self.forget_block(tree, guard, scoped, tier.bit()) {
                report.removed_blocks += 1;
            } else {
                report.removed_unknown += 1;
            }
        }
    }

    /// Removes `tier_mask` of one engine block; forgets its engine hash once no tier holds it.
    /// Returns whether the block was known.
    fn forget_block(&mut self, tree: &Tree, guard: &Guard, scoped: u64, tier_mask: u8) -> bool {
        let Some(last) = self.resolve_or_index(tree, guard, scoped) else { return false };
        let count = self.spans.get(&scoped).copied().unwrap_or(1);
        // The engine block before this one: the chain's end once this one is gone.
        let mut before = Some(last);
        for _ in 0..count {
            before = before.and_then(|p| tree.previous(p, guard));
        }
        let (_, left) = self.release_block(tree, guard, last, count, tier_mask);
        if left == 0 {
            self.forget_exception(scoped);
            self.spans.remove(&scoped);
            self.ends.remove(&scoped);
            if !tree.holds_any(last.seg, self.pod, guard) {
                self.segments.remove(last.seg);
            }
            if let Some(p) = before.filter(|&p| tree.tiers_at(p, self.pod, guard) != 0) {
                if let Some(key) = self.engine_hash_of(tree, guard, p) {
                    self.note_end(tree, guard, key, p);
                }
            }
        }
        true
    }
}

/// What an engine hash names: the pod's chain ends and exceptions, resolved to positions.
impl PodIngest {
    /// The block this pod holds for a scoped engine hash.
    fn resolve(&self, tree: &Tree, guard: &Guard, scoped: u64) -> Option<Pos> {
        if let Some(&(pos, first)) = self.ends.get(&scoped) {
            let pos = Pos::unpack(pos);
            if tree.first_key(pos, guard) == Some(first) && tree.tiers_at(pos, self.pod, guard) != 0 {
                return Some(pos);
            }
        }
        if let Some(&(pos, first)) = self.exceptions.get(&scoped) {
            let live = tree.first_key(pos, guard) == Some(first) && tree.tiers_at(pos, self.pod, guard) != 0;
            return live.then_some(pos);
        }
        tree.engine_block(scoped, guard).filter(|&p| tree.tiers_at(p, self.pod, guard) != 0)
    }

    /// The block this pod holds for a scoped engine hash; when nothing but the engine table
    /// could know it and this pod's blocks are not in it yet, indexes them first.
    fn resolve_or_index(&mut self, tree: &Tree, guard: &Guard, scoped: u64) -> Option<Pos> {
        if let Some(pos) = self.resolve(tree, guard, scoped) {
            return Some(pos);
        }
        if self.indexed {
            return None;
        }
        tree.index_pod(self.pod, self.segments.iter(), guard);
        self.indexed = true;
        self.resolve(tree, guard, scoped)
    }

    /// The block this pod holds for engine hash `engine` in any of its groups but `group`.
    fn resolve_in_other_group(&mut self, tree: &Tree, guard: &Guard, group: i64, engine: u64) -> Option<Pos> {
        for other in 0..self.groups.len() as i64 {
            if other != group && self.groups[other as usize].is_some() {
                let scoped = self.scoped(Some(other), engine)?;
                if let Some(pos) = self.resolve(tree, guard, scoped) {
                    return Some(pos);
                }
            }
        }
        None
    }

    /// Remembers that `scoped` names the chain end `pos` for this pod.
    fn note_end(&mut self, tree: &Tree, guard: &Guard, scoped: u64, pos: Pos) {
        let first = tree.first_key(pos, guard).unwrap_or(0);
        self.ends.insert(scoped, (pos.pack(), first));
    }

    /// Settles what `scoped` names for this pod after a store put its engine block at `last`
    /// (`count` canonical blocks ending there). If the engine reused the hash for another
    /// block this pod held, that claim is dropped first.
    fn claim(&mut self, tree: &Tree, guard: &Guard, scoped: u64, last: Pos, count: u32, recorded: bool) {
        // The common case (a new block, or one the fleet already knows under this engine hash)
        // needs no more lookups.
        let known = |m: &FxHashMap<u64, _>| !m.is_empty() && m.contains_key(&scoped);
        if !recorded || known(&self.exceptions) || (!self.spans.is_empty() && self.spans.contains_key(&scoped)) {
            let prior = match (self.exceptions.get(&scoped), self.ends.get(&scoped)) {
                (Some(&(pos, first)), _) => (tree.first_key(pos, guard) == Some(first)).then_some(pos),
                (None, Some(&(pos, first))) => {
                    let pos = Pos::unpack(pos);
                    (tree.first_key(pos, guard) == Some(first)).then_some(pos)
                }
                (None, None) if self.restoring => None,
                (None, None) => tree.engine_block(scoped, guard),
            }
            .filter(|&p| p != last && tree.tiers_at(p, self.pod, guard) != 0);
            let prior_count = self.spans.get(&scoped).copied().unwrap_or(1);
            if let Some(old) = prior {
                self.release_block(tree, guard, old, prior_count, 0xff);
            } else if prior_count > count {
                // Same last block, fewer canonical blocks now: the old engine block's first ones
                // leave it.
                let old = blocks_before(tree, guard, last, prior_count - 1);
                let dropped = old.get(count as usize - 1..).unwrap_or_default();
                let tiers = tree.tiers_at(last, self.pod, guard);
                self.release_inner(tree, guard, dropped, tiers, true, 0xff);
            }
            if recorded {
                self.forget_exception(scoped);
            } else if let Some(first) = tree.first_key(last, guard) {
                self.forget_exception(scoped);
                self.exceptions.insert(scoped, (last, first));
                self.exception_at.insert(last.pack(), scoped);
            }
            self.ends.remove(&scoped);
        }
        if count > 1 {
            self.spans.insert(scoped, count);
        } else if !self.spans.is_empty() {
            self.spans.remove(&scoped);
        }
    }

    /// The scoped engine hash this pod knows the block at `pos` by: its exception's, else the
    /// block's recorded one.
    fn engine_hash_of(&self, tree: &Tree, guard: &Guard, pos: Pos) -> Option<u64> {
        if !self.exception_at.is_empty() {
            if let Some(&scoped) = self.exception_at.get(&pos.pack()) {
                return Some(scoped);
            }
        }
        Some(tree.engine_at(pos, guard)).filter(|&e| e != 0)
    }

    /// Drops `scoped`'s exception, and its entry by block if that still names it.
    fn forget_exception(&mut self, scoped: u64) {
        if let Some((pos, _)) = self.exceptions.remove(&scoped) {
            if self.exception_at.get(&pos.pack()) == Some(&scoped) {
                self.exception_at.remove(&pos.pack());
            }
        }
    }
}

/// Sorts exceptions by position, least significant byte first (a stable counting sort per
/// byte of the packed position, skipping the bytes every position shares). A pod hashing unlike
/// the fleet has an exception for about a third of its blocks, and a comparison sort of them
/// was a fifth of its export's CPU; this one costs a few passes over them.
fn sort_by_position(items: &mut Vec<(Pos, u64, u64)>) {
    if items.len() < 64 {
        items.sort_unstable_by_key(|x| x.0.pack());
        return;
    }
    let mut counts = [[0usize; 256]; 8];
    for x in items.iter() {
        let key = x.0.pack();
        for (byte, count) in counts.iter_mut().enumerate() {
            count[(key >> (8 * byte)) as usize & 0xff] += 1;
        }
    }
    let mut from = std::mem::take(items);
    let mut to = Vec::with_capacity(from.len());
    for (byte, count) in counts.iter().enumerate() {
        if count.contains(&from.len()) {
            // Every position has this byte alike: nothing to order by it.
            continue;
        }
        let mut next = [0usize; 256];
        let mut at = 0;
        for (n, c) in next.iter_mut().zip(count) {
            *n = at;
            at += c;
        }
        to.clear();
        to.resize(from.len(), (Pos { seg: 0, off: 0 }, 0, 0));
        for &x in &from {
            let digit = (x.0.pack() >> (8 * byte)) as usize & 0xff;
            to[next[digit]] = x;
            next[digit] += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    *items = from;
}

/// The engine blocks of one store, as its chain holds them: from the chain's `hold_from`-th
/// block on, each covering `per_block` canonical blocks, the first `whole` applied in full, in
/// the tier `tier_bit`.
struct EngineBlocks {
    hold_from: usize,
    per_block: usize,
    whole: usize,
    tier_bit: u8,
}

/// Holding and releasing canonical blocks that several engine blocks cover.
impl PodIngest {
    /// Counts the canonical blocks of newly stored engine blocks (`engine_blocks`) that the
    /// pod already held through another engine block, and the tier a block stored again adds
    /// to the blocks it shares.
    fn note_covers(&mut self, tree: &Tree, guard: &Guard, stored: &Stored, engine_blocks: EngineBlocks) {
        let EngineBlocks { hold_from, per_block, whole, tier_bit } = engine_blocks;
        for (j, &(last, _)) in stored.ends.iter().enumerate().take(whole) {
            let end = hold_from + (j + 1) * per_block - 1;
            // Its last block held already: the same engine block stored again.
            let again = held_before(stored, end);
            if again.is_some_and(|tiers| tiers & tier_bit != 0) || (again.is_some() && self.covers.is_empty()) {
                continue;
            }
            let mut pos = Some(last);
            for idx in (end + 1 - per_block..end).rev() {
                pos = pos.and_then(|p| tree.previous(p, guard));
                let Some(p) = pos else { break };
                match (again, held_before(stored, idx)) {
                    // Stored again in a tier it lacked: one more holder in that tier.
                    (Some(_), _) => {
                        if let Some(c) = self.covers.get_mut(&p.pack()) {
                            c.gain(tier_bit);
                        }
                    }
                    // Held before through one engine block (in its tiers), or several.
                    (None, Some(tiers)) => {
                        self.covers.entry(p.pack()).or_insert_with(|| Cover::one(tiers)).add(tier_bit)
                    }
                    // Not held before: nothing may be remembered of it.
                    (None, None) => {
                        self.covers.remove(&p.pack());
                    }
                }
            }
        }
    }

    /// An engine block of `count` canonical blocks ending at `last` now holds `tier_bit` too,
    /// which it did not: one more holder in that tier of each inner block another covers.
    fn cover_gain(&mut self, tree: &Tree, guard: &Guard, last: Pos, count: u32, tier_bit: u8) {
        for p in blocks_before(tree, guard, last, count - 1) {
            if let Some(c) = self.covers.get_mut(&p.pack()) {
                c.gain(tier_bit);
            }
        }
    }

    /// Removes `mask` from the `count` canonical blocks of an engine block ending at `last`,
    /// keeping the ones another of this pod's engine blocks still covers, in the tiers it
    /// covers them in. Returns the tiers of `last` before and after.
    fn release_block(&mut self, tree: &Tree, guard: &Guard, last: Pos, count: u32, mask: u8) -> (u8, u8) {
        if count <= 1 || self.covers.is_empty() {
            let (before, after, stats) = tree.release(self.pod, last, count, mask, guard);
            self.note_stats(&stats);
            return (before, after);
        }
        let earlier = blocks_before(tree, guard, last, count - 1);
        let (before, after, stats) = tree.release(self.pod, last, 1, mask, guard);
        self.note_stats(&stats);
        self.release_inner(tree, guard, &earlier, before & !after, after == 0, mask);
        (before, after)
    }

    /// One engine block lost the tiers `lost` (and left entirely if `leaving`): its inner
    /// blocks `inner` lose them too, or all of the pod's tiers if it left, except where
    /// another engine block of the pod still covers a block in a tier.
    fn release_inner(&mut self, tree: &Tree, guard: &Guard, inner: &[Pos], lost: u8, leaving: bool, mask: u8) {
        for &p in inner {
            let strip = match self.covers.get_mut(&p.pack()) {
                Some(c) => {
                    c.lose(lost);
                    if leaving {
                        c.blocks = c.blocks.saturating_sub(1);
                    }
                    let keep = c.tiers();
                    if c.blocks <= 1 {
                        // One engine block left (holding it in `keep`), or none.
                        self.covers.remove(&p.pack());
                    }
                    !keep
                }
                None if leaving => 0xff,
                None => mask,
            };
            if tree.tiers_at(p, self.pod, guard) & strip != 0 {
                let (_, _, stats) = tree.release(self.pod, p, 1, strip, guard);
                self.note_stats(&stats);
            }
        }
    }
}

/// Snapshots and imports: what the pod holds by engine hash, and restoring it.
impl PodIngest {
    /// For the export facade: this pod's engine blocks, each held by the pod, as its scoped
    /// engine hash, the canonical blocks it spans, and its last block, in the order of their
    /// last blocks' positions (segment, then offset), so a chain's blocks come one after
    /// another and an engine block's end can be found by position with a binary search.
    ///
    /// One pass over the pod's segments: an exception (a block the pod names by another hash
    /// than the one it records) is taken where the pass meets its block, from the block the
    /// pass read anyway, instead of a lookup of its segment per exception and a set of the
    /// blocks they name.
    pub(super) fn engine_blocks(&self, tree: &Tree, guard: &Guard) -> Vec<(u64, u32, HeldBlock)> {
        // At most one per canonical block held: sized once, not grown by copying.
        let mut out = Vec::with_capacity(self.blocks as usize);
        self.each_engine_block(tree, guard, |engine, count, block| {
            out.push((engine, count, block));
            true
        });
        out
    }

    /// The engine blocks `engine_blocks` lists, handed to `f` one by one in the same order
    /// instead of collected (an export builds its columns as they come); `f` returning false
    /// stops the pass. Returns whether the pass went to the end.
    pub(super) fn each_engine_block(
        &self,
        tree: &Tree,
        guard: &Guard,
        mut f: impl FnMut(u64, u32, HeldBlock) -> bool,
    ) -> bool {
        // (position, scoped engine hash, the segment's first key when it was recorded).
        let mut exceptions: Vec<(Pos, u64, u64)> =
            self.exceptions.iter().map(|(&scoped, &(pos, first))| (pos, scoped, first)).collect();
        sort_by_position(&mut exceptions);
        let mut e = 0;
        let mut held = Vec::new();
        for seg in &self.segments {
            held.clear();
            let Some(first_key) = tree.held_in(seg, self.pod, guard, &mut held) else { continue };
            for &block in &held {
                // Exceptions at positions the pod does not hold name nothing it holds.
                while exceptions.get(e).is_some_and(|x| x.0 < block.pos) {
                    e += 1;
                }
                let mut named = false;
                while let Some(&(pos, scoped, first)) = exceptions.get(e).filter(|x| x.0 == block.pos) {
                    // A segment number reused since the exception was recorded: not this block.
                    if first == first_key {
                        named = true;
                        let named_block = HeldBlock { engine: scoped, ..block };
                        debug_assert_eq!(named_block.pos, pos);
                        if !f(scoped, self.spans.get(&scoped).copied().unwrap_or(1), named_block) {
                            return false;
                        }
                    }
                    e += 1;
                }
                let engine = block.engine;
                // Another pod's hash recorded on a block this pod holds inside one of its own
                // engine blocks (one block size per plain engine: its multi-block engine
                // blocks are all in `spans`) is not a name this pod uses.
                let ours = self.spans.is_empty() || self.spans.contains_key(&engine);
                if engine != 0
                    && ours
                    && !named
                    && (self.exceptions.is_empty() || !self.exceptions.contains_key(&engine))
                    && !f(
                        engine,
                        if self.spans.is_empty() { 1 } else { self.spans.get(&engine).copied().unwrap_or(1) },
                        block,
                    )
                {
                    return false;
                }
            }
        }
        true
    }

    /// The engine blocks as `engine_blocks` listed them before it took exceptions in order:
    /// the reference its tests compare it with.
    #[cfg(test)]
    pub(super) fn engine_blocks_by_lookup(&self, tree: &Tree, guard: &Guard) -> Vec<(u64, u32, HeldBlock)> {
        let mut out = Vec::with_capacity(self.blocks as usize);
        let mut named = rustc_hash::FxHashSet::default();
        for (&scoped, &(pos, first)) in &self.exceptions {
            let tiers = tree.tiers_at(pos, self.pod, guard);
            if tree.first_key(pos, guard) == Some(first) && tiers != 0 {
                if let Some(key) = tree.key_at(pos, guard) {
                    named.insert(pos);
                    let block = HeldBlock { pos, key, engine: scoped, tiers };
                    out.push((scoped, self.spans.get(&scoped).copied().unwrap_or(1), block));
                }
            }
        }
        let mut held = Vec::new();
        for seg in &self.segments {
            held.clear();
            tree.held_in(seg, self.pod, guard, &mut held);
            for &block in &held {
                let engine = block.engine;
                let ours = self.spans.is_empty() || self.spans.contains_key(&engine);
                if engine != 0
                    && ours
                    && (named.is_empty() || !named.contains(&block.pos))
                    && (self.exceptions.is_empty() || !self.exceptions.contains_key(&engine))
                {
                    out.push((engine, self.spans.get(&engine).copied().unwrap_or(1), block));
                }
            }
        }
        out
    }

    /// For the export facade's import: stores a chain of engine blocks of `per_block`
    /// canonical blocks each, `keys[hold_from..]` continuing `parent` (the keys before are
    /// path the pod does not hold), named by the scoped hashes of `ends` (the index in `keys`
    /// of each one's last block, in order), in the tiers of `mask`, through the same store the
    /// events use: one store for the whole chain, as for an event naming several blocks.
    /// Appends the position of each applied engine block's last block to `placed` (the bound
    /// may stop the chain early: what was held stays held, so this can only under-report) and
    /// returns whether every tier was restored.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn restore_run(
        &mut self,
        tree: &Tree,
        parent: ParentKey,
        keys: &[u64],
        hold_from: usize,
        ends: &[(usize, u64)],
        per_block: usize,
        mask: u8,
        placed: &mut Vec<Pos>,
    ) -> bool {
        let guard = tree.pin();
        let mut tiers = (0..MAX_TIERS as u8).map(TierId).filter(|t| mask & t.bit() != 0);
        let valid = per_block > 0
            && !ends.is_empty()
            && ends.iter().all(|&(_, scoped)| scoped != 0)
            && hold_from + ends.len() * per_block == keys.len()
            && ends.iter().enumerate().all(|(j, &(end, _))| end == hold_from + (j + 1) * per_block - 1);
        let Some(first) = tiers.next().filter(|_| valid) else { return false };
        let from = placed.len();
        self.restoring = true;
        let run = Run { tier: first, parent, keys, hold_from, ends };
        let whole = self.store_run(tree, &guard, run, per_block, Some(placed));
        self.restoring = false;
        let Some(&last) = placed[from..].last() else { return false };
        let mut all = whole == ends.len();
        let shares = per_block > 1 && !self.covers.is_empty();
        for tier in tiers {
            let gaining: SmallVec<[Pos; 8]> = if shares {
                let placed = &placed[from..];
                placed.iter().copied().filter(|&p| tree.tiers_at(p, self.pod, &guard) & tier.bit() == 0).collect()
            } else {
                SmallVec::new()
            };
            let (stats, refused) = tree.retier(self.pod, last, (whole * per_block) as u32, tier.bit(), &guard);
            self.note_stats(&stats);
            all &= refused == 0;
            for p in gaining {
                self.cover_gain(tree, &guard, p, per_block as u32, tier.bit());
            }
        }
        all
    }

    /// For the export facade's import: the KV-cache groups a snapshot recorded.
    pub(super) fn restore_groups(&mut self, groups: &[Option<GroupSpec>]) {
        if self.groups != groups {
            self.groups = groups.to_vec();
            self.groups_changed = true;
        }
    }

    /// For the export facade's import: the units a snapshot recorded (per group, tier id).
    pub(super) fn restore_unit(&mut self, group: u32, tier: TierId, blocks: u32) {
        self.units.note(group, tier.0, blocks);
    }

    /// For the export facade's import: `scoped` is no longer one of this pod's chain ends (a
    /// block another imported block continues), so `ends` stays as small as live ingest keeps
    /// it; a lookup that needs it falls back to indexing the pod, as it would live.
    pub(super) fn forget_end(&mut self, scoped: u64) {
        self.ends.remove(&scoped);
    }
}

/// One run of a pod's engine blocks to store ([`PodIngest::store_run`]): in `tier`, the chain of
/// `keys` continuing `parent`, held from `hold_from` on, its engine blocks ending at `ends`
/// (as [`HeldChain`] has them).
#[derive(Debug, Clone, Copy)]
struct Run<'a> {
    tier: TierId,
    parent: ParentKey,
    keys: &'a [u64],
    hold_from: usize,
    ends: &'a [(usize, u64)],
}

/// How a canonical block that several of a pod's engine blocks cover is held: by how many of
/// them, and by how many in each tier. The tree holds it in the union of their tiers, so it
/// loses a tier only when the last of them holding it there does.
#[derive(Debug, Clone, Copy, Default)]
struct Cover {
    blocks: u32,
    per_tier: [u32; MAX_TIERS],
}

impl Cover {
    /// Held through one engine block, in `tiers`.
    fn one(tiers: u8) -> Cover {
        let mut cover = Cover::default();
        cover.add(tiers);
        cover
    }

    /// One more engine block covers it, in `tiers`.
    fn add(&mut self, tiers: u8) {
        self.blocks += 1;
        self.gain(tiers);
    }

    /// A covering engine block now holds it in `tiers` too.
    fn gain(&mut self, tiers: u8) {
        for (t, n) in self.per_tier.iter_mut().enumerate() {
            *n += u32::from(tiers >> t & 1);
        }
    }

    /// A covering engine block no longer holds it in `tiers`.
    fn lose(&mut self, tiers: u8) {
        for (t, n) in self.per_tier.iter_mut().enumerate() {
            *n = n.saturating_sub(u32::from(tiers >> t & 1));
        }
    }

    /// The tiers some covering engine block still holds it in.
    fn tiers(&self) -> u8 {
        if self.blocks == 0 {
            return 0;
        }
        self.per_tier.iter().enumerate().filter(|(_, &n)| n > 0).fold(0, |m, (t, _)| m | 1 << t)
    }
}

/// The scoped engine hash of `engine` in a group of scope `scope`: a bijective mix of the two,
/// uniform bits for the engine table. Never 0: the index reserves it for "no engine hash".
#[inline]
fn scoped_in(scope: u64, engine: u64) -> u64 {
    let mut x = engine ^ scope;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)).max(1)
}

/// The `n` blocks of the chain before `last`, nearest first (fewer where the chain starts).
/// Found before anything is released: releasing a branch's last held block frees its segment,
/// and `previous` could not step out of it then.
fn blocks_before(tree: &Tree, guard: &Guard, last: Pos, n: u32) -> SmallVec<[Pos; 8]> {
    let mut out = SmallVec::new();
    let mut pos = last;
    for _ in 0..n {
        let Some(p) = tree.previous(pos, guard) else { break };
        out.push(p);
        pos = p;
    }
    out
}

/// The tiers a store's block `idx` was held in before it (None: not held).
fn held_before(stored: &Stored, idx: usize) -> Option<u8> {
    stored.held_before.iter().find(|&&(a, b, _)| a <= idx && idx < b).map(|&(_, _, tiers)| tiers)
}

/// Separates engine-hash scopes from key namespaces derived from the same model name.
const SCOPE_SALT: u64 = 0x656e_6769_6e65_5f68; // "engine_h"

fn published<'a>(h: &EngineHash<'a>) -> PublishedHash<'a> {
    match *h {
        EngineHash::Uint(v) => PublishedHash::Int(v),
        EngineHash::Int(v) => PublishedHash::Int(v as u64),
        EngineHash::Bytes(b) => PublishedHash::Bytes(b),
    }
}

/// Whether a store names fewer blocks than its tokens cover: a sliding-window (or Mamba) group
/// of a hybrid model keeps only some blocks of the range it caches, and vLLM sends the hashes
/// of those alone with the token ids of the whole range (`parent_block_hash` names the block
/// before the range, as for a dense store).
fn is_sparse(s: &BlockStored<'_>) -> bool {
    let tokens = s.token_ids.as_ref().map_or(0, Vec::len);
    match usize::try_from(s.block_size.unwrap_or(0)) {
        Ok(bs) if bs > 0 && tokens > 0 && tokens.is_multiple_of(bs) => s.block_hashes.len() < tokens / bs,
        _ => false,
    }
}

/// The dense store of another KV-cache group in the same batch that covers exactly the same
/// tokens after the same parent: vLLM caches a request's blocks in every group in the same
/// step, and a block's hash is the same in every group, so its hash list says which blocks of
/// the range a sparse store's hashes are.
fn dense_sibling<'b, 'a>(events: &'b [Event<'a>], at: usize, sparse: &BlockStored<'_>) -> Option<&'b BlockStored<'a>> {
    let tokens = sparse.token_ids.as_deref()?;
    let bs = usize::try_from(sparse.block_size?).ok().filter(|&b| b > 0)?;
    let parent = sparse.parent_block_hash.as_ref().map(EngineHash::key);
    events.iter().enumerate().find_map(|(i, e)| match e {
        Event::BlockStored(d)
            if i != at
                && d.group_idx.unwrap_or(0) != sparse.group_idx.unwrap_or(0)
                && d.block_size == sparse.block_size
                && d.lora_name == sparse.lora_name
                && d.lora_id == sparse.lora_id
                && d.block_hashes.len().checked_mul(bs) == Some(tokens.len())
                && d.parent_block_hash.as_ref().map(EngineHash::key) == parent
                && d.token_ids.as_deref() == Some(tokens) =>
        {
            Some(d)
        }
        _ => None,
    })
}

/// The block indices (in `dense`'s order) of `sparse`'s hashes, into `held`; false unless
/// every hash is found, in increasing order.
fn sparse_positions(sparse: &BlockStored<'_>, dense: &BlockStored<'_>, held: &mut SmallVec<[usize; 16]>) -> bool {
    held.clear();
    let mut from = 0;
    for h in &sparse.block_hashes {
        let Some(i) = dense.block_hashes[from..].iter().position(|d| d.key() == h.key()) else { return false };
        held.push(from + i);
        from += i + 1;
    }
    !held.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exceptions_sort_by_position_as_a_comparison_sort_would() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for n in [0usize, 1, 63, 64, 65, 1000, 20_000] {
            // Segments across shards and offsets across bytes, with repeated positions.
            let items: Vec<(Pos, u64, u64)> = (0..n)
                .map(|i| {
                    let r = next();
                    let pos = Pos { seg: (r as u32) & 0x00ff_ffff, off: ((r >> 32) as u32) & 0x3ff };
                    (pos, i as u64, r)
                })
                .collect();
            let mut sorted = items.clone();
            sort_by_position(&mut sorted);
            let mut expected = items.clone();
            expected.sort_unstable_by_key(|x| (x.0.pack(), x.1));
            assert!(sorted.windows(2).all(|w| w[0].0.pack() <= w[1].0.pack()), "{n} items in position order");
            sorted.sort_unstable_by_key(|x| (x.0.pack(), x.1));
            assert_eq!(sorted, expected, "{n} items: the same items");
        }
    }
}
