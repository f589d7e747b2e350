//! Applying one pod's decoded events to the index.
//!
//! Each pod keeps a map from the engine's block hash (per KV-cache group) to our prefix keys.
//! It resolves `parent_block_hash` and `BlockRemoved`, and it doubles as the pod's reverse
//! index: clearing a pod walks only that pod's blocks. Nothing is guessed: a store whose
//! parent is unknown, whose sizes disagree, or whose tier cannot be named is skipped and
//! counted, which can only under-report.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::extra_keys::encode_block_extras;
use crate::index::Index;
use crate::keys::{block_key, namespace_root, Extras, PrefixKey};
use crate::pods::PodId;
use crate::tiers::{TierId, Tiers, MAX_TIERS};
use crate::vllm_hash::{BlockHasher, ParentRef, PublishedHash, Verification};
use crate::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch, Value};

/// KV-cache groups a pod may use (hybrid models have a handful).
pub const MAX_GROUPS: usize = 64;

/// Why a stored or removed block was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// `parent_block_hash` names a block this pod never stored (or we missed).
    ParentUnknown,
    /// The engine block size is not a multiple of the canonical one (or is a partial block).
    BlockSizeMismatch,
    /// `token_ids` does not cover exactly `block_hashes.len() * block_size` tokens.
    TokenCountMismatch,
    /// A tier re-announcement (no tokens) of a block we do not know.
    UnknownBlock,
    /// More distinct tiers than a residency can record.
    TooManyTiers,
    /// `group_idx` out of range.
    GroupOutOfRange,
    /// The index is at its memory bound.
    IndexFull,
}

impl SkipReason {
    pub const ALL: [SkipReason; 7] = [
        SkipReason::ParentUnknown,
        SkipReason::BlockSizeMismatch,
        SkipReason::TokenCountMismatch,
        SkipReason::UnknownBlock,
        SkipReason::TooManyTiers,
        SkipReason::GroupOutOfRange,
        SkipReason::IndexFull,
    ];

    /// Stable metric label.
    pub fn label(self) -> &'static str {
        match self {
            SkipReason::ParentUnknown => "parent_unknown",
            SkipReason::BlockSizeMismatch => "block_size_mismatch",
            SkipReason::TokenCountMismatch => "token_count_mismatch",
            SkipReason::UnknownBlock => "unknown_block",
            SkipReason::TooManyTiers => "too_many_tiers",
            SkipReason::GroupOutOfRange => "group_out_of_range",
            SkipReason::IndexFull => "index_full",
        }
    }
}

/// What applying events did, for metrics and logs. Counts are in engine blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub stored_events: u64,
    pub removed_events: u64,
    pub cleared_events: u64,
    pub unknown_events: u64,
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    /// Removals of blocks this pod is not known to hold (stored before we subscribed, say).
    pub removed_unknown: u64,
    pub skipped: [u64; SkipReason::ALL.len()],
    /// Sampled recomputation of the engine's own block hashes (see [`HashCheck`]).
    pub hash_check: Verification,
}

impl ApplyReport {
    fn skip(&mut self, reason: SkipReason, blocks: u64) {
        self.skipped[reason as usize] += blocks;
    }

    pub fn skipped(&self, reason: SkipReason) -> u64 {
        self.skipped[reason as usize]
    }

    pub fn merge(&mut self, other: &ApplyReport) {
        self.stored_events += other.stored_events;
        self.removed_events += other.removed_events;
        self.cleared_events += other.cleared_events;
        self.unknown_events += other.unknown_events;
        self.stored_blocks += other.stored_blocks;
        self.removed_blocks += other.removed_blocks;
        self.removed_unknown += other.removed_unknown;
        for (a, b) in self.skipped.iter_mut().zip(other.skipped) {
            *a += b;
        }
        self.hash_check.merge(&other.hash_check);
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

/// The shared pieces every pod's ingest needs.
pub struct IngestContext<'a> {
    pub index: &'a Index,
    pub tiers: &'a Tiers,
    /// Canonical block size of our keys.
    pub block_size: usize,
    pub hash_check: Option<&'a HashCheck>,
}

/// Engine hash → prefix keys, for one KV-cache group.
#[derive(Default)]
struct EngineMap {
    /// Engine block → key of its (last) canonical block.
    last: FxHashMap<u64, PrefixKey>,
    /// Engine blocks spanning several canonical blocks: every key but the last.
    leading: FxHashMap<u64, Box<[PrefixKey]>>,
}

impl EngineMap {
    fn keys(&self, engine: u64) -> Option<impl Iterator<Item = PrefixKey> + '_> {
        let last = *self.last.get(&engine)?;
        let leading = self.leading.get(&engine).map(|k| &k[..]).unwrap_or(&[]);
        Some(leading.iter().copied().chain(std::iter::once(last)))
    }

    fn forget(&mut self, engine: u64) {
        self.last.remove(&engine);
        self.leading.remove(&engine);
    }

    fn len(&self) -> usize {
        self.last.len()
    }
}

/// One pod's view of its engine: the engine-hash maps and per-tier block counts.
pub struct PodIngest {
    pod: PodId,
    model: Arc<str>,
    groups: Vec<EngineMap>,
    /// Canonical blocks resident per tier (for `/debug/sources`).
    tier_blocks: [u64; MAX_TIERS],
    extras: Extras,
    keys_scratch: Vec<PrefixKey>,
    stores_seen: u64,
    hash_check: Verification,
}

impl PodIngest {
    pub fn new(pod: PodId, model: Arc<str>) -> Self {
        PodIngest {
            pod,
            model,
            groups: Vec::new(),
            tier_blocks: [0; MAX_TIERS],
            extras: Extras::new(),
            keys_scratch: Vec::new(),
            stores_seen: 0,
            hash_check: Verification::default(),
        }
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

    /// Engine blocks this pod is known to hold, over all groups.
    pub fn engine_blocks(&self) -> usize {
        self.groups.iter().map(EngineMap::len).sum()
    }

    /// Applies a batch's events in order.
    pub fn apply_batch(&mut self, ctx: &IngestContext<'_>, batch: &EventBatch<'_>) -> ApplyReport {
        let mut report = ApplyReport::default();
        for event in &batch.events {
            self.apply_event(ctx, event, &mut report);
        }
        report
    }

    pub fn apply_event(&mut self, ctx: &IngestContext<'_>, event: &Event<'_>, report: &mut ApplyReport) {
        match event {
            Event::BlockStored(s) => {
                report.stored_events += 1;
                self.apply_stored(ctx, s, report);
            }
            Event::BlockRemoved(r) => {
                report.removed_events += 1;
                self.apply_removed(ctx, r, report);
            }
            Event::AllBlocksCleared { .. } => {
                report.cleared_events += 1;
                self.clear(ctx.index);
            }
            Event::Unknown { .. } => report.unknown_events += 1,
        }
    }

    fn group(&mut self, group_idx: Option<i64>) -> Option<&mut EngineMap> {
        let g = usize::try_from(group_idx.unwrap_or(0)).ok().filter(|g| *g < MAX_GROUPS)?;
        if self.groups.len() <= g {
            self.groups.resize_with(g + 1, EngineMap::default);
        }
        Some(&mut self.groups[g])
    }

    fn apply_stored(&mut self, ctx: &IngestContext<'_>, ev: &BlockStored<'_>, report: &mut ApplyReport) {
        let blocks = ev.block_hashes.len() as u64;
        let Some(tier) = ctx.tiers.intern(ev.medium) else {
            return report.skip(SkipReason::TooManyTiers, blocks);
        };
        let group = ev.group_idx.unwrap_or(0);
        if self.group(ev.group_idx).is_none() {
            return report.skip(SkipReason::GroupOutOfRange, blocks);
        }
        let tokens = ev.token_ids.as_deref().unwrap_or(&[]);
        if tokens.is_empty() {
            return self.apply_reannounce(ctx, ev, tier, report);
        }
        let engine_bs = match usize::try_from(ev.block_size.unwrap_or(0)) {
            Ok(bs) if bs > 0 => bs,
            _ => return report.skip(SkipReason::BlockSizeMismatch, blocks),
        };
        if engine_bs % ctx.block_size != 0 {
            return report.skip(SkipReason::BlockSizeMismatch, blocks);
        }
        if Some(tokens.len()) != ev.block_hashes.len().checked_mul(engine_bs) {
            return report.skip(SkipReason::TokenCountMismatch, blocks);
        }
        self.maybe_check_hashes(ctx, ev, tokens, engine_bs, report);
        let mut parent = match &ev.parent_block_hash {
            None => namespace_root(&namespace_of(&self.model, ev.lora_name, ev.lora_id), group as u32),
            Some(h) => match self.group(ev.group_idx).and_then(|m| m.last.get(&h.key()).copied()) {
                Some(key) => key,
                None => return report.skip(SkipReason::ParentUnknown, blocks),
            },
        };
        let mut extras = std::mem::take(&mut self.extras);
        let mut keys = std::mem::take(&mut self.keys_scratch);
        for (i, (hash, chunk)) in ev.block_hashes.iter().zip(tokens.chunks_exact(engine_bs)).enumerate() {
            extras.clear();
            if let Some(entry) = ev.extra_keys.as_ref().and_then(|e| e.get(i)) {
                encode_block_extras(entry, ev.lora_name, ev.lora_id, &mut extras);
            }
            if let Some(lookahead) = ev.lookahead_token_ids.as_ref().and_then(|l| l.get(i)) {
                // Lookahead hashing makes the engine's block depend on tokens past it; a query
                // cannot reproduce that, so such blocks must never match a plain prefix.
                extras.push_tokens(lookahead);
            }
            keys.clear();
            for (j, sub) in chunk.chunks_exact(ctx.block_size).enumerate() {
                // Extras fold into the engine block's first canonical block; the chain carries
                // them to the rest.
                parent = block_key(parent, sub, if j == 0 { extras.as_bytes() } else { &[] });
                keys.push(parent);
            }
            self.record(ctx, group, hash.key(), &keys, tier, report);
        }
        self.extras = extras;
        self.keys_scratch = keys;
    }

    fn maybe_check_hashes(&mut self, ctx: &IngestContext<'_>, ev: &BlockStored<'_>, tokens: &[u32], engine_bs: usize, report: &mut ApplyReport) {
        let Some(check) = ctx.hash_check else { return };
        self.stores_seen += 1;
        if check.every == 0 || (self.stores_seen - 1) % u64::from(check.every) != 0 {
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

    /// Stores one engine block's canonical keys, replacing a different earlier mapping.
    fn record(&mut self, ctx: &IngestContext<'_>, group: i64, engine: u64, keys: &[PrefixKey], tier: TierId, report: &mut ApplyReport) {
        let Some(&last) = keys.last() else { return };
        let map = self.group(Some(group)).expect("group checked by caller");
        let same = map.last.get(&engine) == Some(&last)
            && map.leading.get(&engine).map(|k| &k[..]).unwrap_or(&[]) == &keys[..keys.len() - 1];
        if !same && map.last.contains_key(&engine) {
            // The engine reused a hash for different content: drop the old claim first.
            self.forget_block(ctx.index, group, engine, 0xff);
        }
        let map = self.group(Some(group)).expect("group checked by caller");
        map.last.insert(engine, last);
        if keys.len() > 1 {
            map.leading.insert(engine, keys[..keys.len() - 1].into());
        }
        let mut full = false;
        for &key in keys {
            match ctx.index.insert(key, self.pod, tier.bit()) {
                Some(prev) if prev & tier.bit() == 0 => self.tier_blocks[tier.0 as usize] += 1,
                Some(_) => {}
                None => full = true,
            }
        }
        if full {
            report.skip(SkipReason::IndexFull, 1);
        } else {
            report.stored_blocks += 1;
        }
    }

    /// A store without tokens re-announces known blocks in another tier (vLLM's CPU offload).
    fn apply_reannounce(&mut self, ctx: &IngestContext<'_>, ev: &BlockStored<'_>, tier: TierId, report: &mut ApplyReport) {
        let pod = self.pod;
        let Some(map) = self.group(ev.group_idx) else { return };
        let mut added = 0u64;
        for hash in &ev.block_hashes {
            let Some(keys) = map.keys(hash.key()) else {
                report.skip(SkipReason::UnknownBlock, 1);
                continue;
            };
            let mut full = false;
            for key in keys {
                match ctx.index.insert(key, pod, tier.bit()) {
                    Some(prev) if prev & tier.bit() == 0 => added += 1,
                    Some(_) => {}
                    None => full = true,
                }
            }
            if full {
                report.skip(SkipReason::IndexFull, 1);
            } else {
                report.stored_blocks += 1;
            }
        }
        self.tier_blocks[tier.0 as usize] += added;
    }

    fn apply_removed(&mut self, ctx: &IngestContext<'_>, ev: &BlockRemoved<'_>, report: &mut ApplyReport) {
        let blocks = ev.block_hashes.len() as u64;
        let Some(tier) = ctx.tiers.intern(ev.medium) else {
            return report.skip(SkipReason::TooManyTiers, blocks);
        };
        let group = ev.group_idx.unwrap_or(0);
        if self.group(ev.group_idx).is_none() {
            return report.skip(SkipReason::GroupOutOfRange, blocks);
        }
        for hash in &ev.block_hashes {
            if self.forget_block(ctx.index, group, hash.key(), tier.bit()) {
                report.removed_blocks += 1;
            } else {
                report.removed_unknown += 1;
            }
        }
    }

    /// Removes `tier_mask` of one engine block; forgets the block once no tier holds it.
    /// Returns whether the block was known.
    fn forget_block(&mut self, index: &Index, group: i64, engine: u64, tier_mask: u8) -> bool {
        let pod = self.pod;
        let Some(map) = self.group(Some(group)) else { return false };
        let Some(keys) = map.keys(engine) else { return false };
        let mut removed = [0u64; MAX_TIERS];
        let mut still_held = false;
        for key in keys {
            let (prev, left) = index.remove(key, pod, tier_mask);
            count_removed_tiers(&mut removed, prev & !left);
            still_held |= left != 0;
        }
        if !still_held {
            map.forget(engine);
        }
        for (count, r) in self.tier_blocks.iter_mut().zip(removed) {
            *count = count.saturating_sub(r);
        }
        true
    }

    /// Drops everything this pod holds: `AllBlocksCleared`, a restart, an unrecoverable gap,
    /// or unregistration. Costs O(this pod's blocks).
    pub fn clear(&mut self, index: &Index) -> u64 {
        let pod = self.pod;
        let mut entries = 0;
        for map in &mut self.groups {
            for (engine, &last) in &map.last {
                let leading = map.leading.get(engine).map(|k| &k[..]).unwrap_or(&[]);
                for &key in leading.iter().chain(std::iter::once(&last)) {
                    if index.remove(key, pod, 0xff).0 != 0 {
                        entries += 1;
                    }
                }
            }
        }
        self.groups.clear();
        self.tier_blocks = [0; MAX_TIERS];
        entries
    }
}

fn published<'a>(h: &EngineHash<'a>) -> PublishedHash<'a> {
    match *h {
        EngineHash::Uint(v) => PublishedHash::Int(v),
        EngineHash::Int(v) => PublishedHash::Int(v as u64),
        EngineHash::Bytes(b) => PublishedHash::Bytes(b),
    }
}

fn count_removed_tiers(removed: &mut [u64; MAX_TIERS], mask: u8) {
    for (i, r) in removed.iter_mut().enumerate() {
        if mask & (1 << i) != 0 {
            *r += 1;
        }
    }
}

/// The key namespace of a block: its LoRA name, else the model. A LoRA known only by its
/// integer id (vLLM before 0.14) gets a namespace no query can name, so it never matches the
/// base model by accident.
pub fn namespace_of<'a>(model: &'a str, lora_name: Option<&'a str>, lora_id: Option<i64>) -> std::borrow::Cow<'a, str> {
    match (lora_name, lora_id) {
        (Some(name), _) if !name.is_empty() => name.into(),
        (_, Some(id)) => format!("{model}\u{0}lora-id:{id}").into(),
        _ => model.into(),
    }
}
