//! Applying one pod's decoded events to the index.
//!
//! Each pod resolves the engine's block hashes (per KV-cache group) to the index's block slots,
//! for `parent_block_hash` and `BlockRemoved`, and keeps the set of slots it holds as its reverse
//! index: clearing a pod walks only that pod's blocks. Nothing is guessed: a store whose
//! parent is unknown, whose sizes disagree, or whose tier cannot be named is skipped and
//! counted, which can only under-report.

use std::sync::Arc;

use roaring::RoaringBitmap;
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::pods::PodId;
use super::report::{ApplyReport, SkipReason};
use super::table::{SlotId, Writer};
use super::tiers::{TierId, Tiers, MAX_TIERS};
use crate::keys::extra_keys::encode_block_extras;
use crate::keys::{block_key, namespace_of, namespace_root, Extras, PrefixKey};
use crate::vllm_hash::{BlockHasher, ParentRef, PublishedHash, Verification};
use crate::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch, Value};

/// KV-cache groups a pod may use (hybrid models have a handful).
pub const MAX_GROUPS: usize = 64;

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
    pub tiers: &'a Tiers,
    /// Canonical block size of our keys.
    pub block_size: usize,
    pub hash_check: Option<&'a HashCheck>,
}

/// One pod's view of its engine: which blocks it holds, how its engine hashes resolve, and
/// per-tier block counts.
///
/// Engine hashes are scoped by the pod's model and KV-cache group (`scope`) before they reach
/// the index's shared engine table, so two models that happen to hash the same tokens alike
/// never resolve to each other's blocks.
pub struct PodIngest {
    pod: PodId,
    model: Arc<str>,
    /// Every slot this pod holds in at least one tier: the reverse index for clears.
    slots: RoaringBitmap,
    /// Scoped engine hashes whose slot recorded another engine hash (a pod hashing differently
    /// from the first holder, or a LoRA path the key does not see).
    exceptions: FxHashMap<u64, SlotId>,
    /// Engine blocks spanning several canonical blocks: every slot but the last.
    leading: FxHashMap<u64, Box<[SlotId]>>,
    /// Scope seed per KV-cache group.
    scopes: Vec<u64>,
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
            slots: RoaringBitmap::new(),
            exceptions: FxHashMap::default(),
            leading: FxHashMap::default(),
            scopes: Vec::new(),
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

    /// Canonical blocks this pod holds in any tier.
    pub fn blocks(&self) -> u64 {
        self.slots.len()
    }

    /// Applies a batch's events in order.
    pub fn apply_batch(&mut self, ctx: &IngestContext<'_>, w: &mut Writer<'_>, batch: &EventBatch<'_>) -> ApplyReport {
        let mut report = ApplyReport::default();
        for event in &batch.events {
            self.apply_event(ctx, w, event, &mut report);
        }
        report
    }

    pub fn apply_event(
        &mut self,
        ctx: &IngestContext<'_>,
        w: &mut Writer<'_>,
        event: &Event<'_>,
        report: &mut ApplyReport,
    ) {
        match event {
            Event::BlockStored(s) => {
                report.stored_events += 1;
                self.apply_stored(ctx, w, s, report);
            }
            Event::BlockRemoved(r) => {
                report.removed_events += 1;
                self.apply_removed(ctx, w, r, report);
            }
            Event::AllBlocksCleared { .. } => {
                report.cleared_events += 1;
                self.clear(w);
            }
            Event::Unknown { .. } => report.unknown_events += 1,
        }
    }

    /// The scoped engine hash of `engine` in KV-cache group `group_idx`; `None` when the group
    /// is out of range.
    fn scoped(&mut self, group_idx: Option<i64>, engine: u64) -> Option<u64> {
        let g = usize::try_from(group_idx.unwrap_or(0)).ok().filter(|g| *g < MAX_GROUPS)?;
        while self.scopes.len() <= g {
            let group = self.scopes.len() as u32;
            self.scopes.push(namespace_root(&self.model, group) ^ SCOPE_SALT);
        }
        // Never 0: the index reserves it for "no engine hash".
        Some(xxh3_64_with_seed(&engine.to_le_bytes(), self.scopes[g]).max(1))
    }

    /// The tier of an event's `medium`, after checking its tier and group can be recorded;
    /// `None` (with the event's blocks counted as skipped) when they cannot.
    fn event_tier(
        &mut self,
        ctx: &IngestContext<'_>,
        medium: Option<&str>,
        group_idx: Option<i64>,
        blocks: u64,
        report: &mut ApplyReport,
    ) -> Option<TierId> {
        let Some(tier) = ctx.tiers.intern(medium) else {
            report.skip(SkipReason::TooManyTiers, blocks);
            return None;
        };
        if self.scoped(group_idx, 0).is_none() {
            report.skip(SkipReason::GroupOutOfRange, blocks);
            return None;
        }
        Some(tier)
    }

    /// The slot this pod holds for a scoped engine hash.
    fn resolve(&self, w: &Writer<'_>, scoped: u64) -> Option<SlotId> {
        if let Some(&slot) = self.exceptions.get(&scoped) {
            return Some(slot);
        }
        w.slot_of_engine(scoped).filter(|s| self.slots.contains(s.0))
    }

    fn apply_stored(
        &mut self,
        ctx: &IngestContext<'_>,
        w: &mut Writer<'_>,
        ev: &BlockStored<'_>,
        report: &mut ApplyReport,
    ) {
        let blocks = ev.block_hashes.len() as u64;
        let Some(tier) = self.event_tier(ctx, ev.medium, ev.group_idx, blocks, report) else { return };
        let tokens = ev.token_ids.as_deref().unwrap_or(&[]);
        if tokens.is_empty() {
            return self.apply_reannounce(w, ev, tier, report);
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
        let group = ev.group_idx.unwrap_or(0);
        let mut parent = match &ev.parent_block_hash {
            None => namespace_root(&namespace_of(&self.model, ev.lora_name, ev.lora_id), group as u32),
            Some(h) => {
                let scoped = self.scoped(ev.group_idx, h.key()).expect("group checked above");
                match self.resolve(w, scoped).and_then(|s| w.key_of(s)) {
                    Some(key) => key,
                    None => return report.skip(SkipReason::ParentUnknown, blocks),
                }
            }
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
            let scoped = self.scoped(ev.group_idx, hash.key()).expect("group checked above");
            if self.record(w, scoped, &keys, tier) {
                report.stored_blocks += 1;
            } else {
                report.skip(SkipReason::IndexFull, 1);
            }
        }
        self.extras = extras;
        self.keys_scratch = keys;
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

    /// Records one engine block (its canonical keys, in order) for this pod. A different
    /// block this pod held under the same engine hash is dropped first. Returns false when the
    /// index's entry bound refused a block (then the engine hash is left unresolvable).
    fn record(&mut self, w: &mut Writer<'_>, scoped: u64, keys: &[PrefixKey], tier: TierId) -> bool {
        let Some((&last, leading_keys)) = keys.split_last() else { return true };
        let mut leading = Vec::with_capacity(leading_keys.len());
        for &key in leading_keys {
            match self.hold(w, key, 0, tier) {
                Some(slot) => leading.push(slot),
                None => {
                    self.release(w, &leading, tier.bit());
                    return false;
                }
            }
        }
        let Some(ins) = w.insert(last, scoped, self.pod, tier.bit()) else {
            self.release(w, &leading, tier.bit());
            return false;
        };
        // The common case (a new block, or one the fleet already knows under this engine hash)
        // needs no more lookups. Otherwise this pod may hold an older, different block under
        // the same engine hash (the engine reused it): drop that claim.
        if !ins.engine_recorded || self.exceptions.contains_key(&scoped) || self.leading.contains_key(&scoped) {
            let prior = self
                .exceptions
                .get(&scoped)
                .copied()
                .or_else(|| w.slot_of_engine(scoped).filter(|s| *s != ins.slot && self.slots.contains(s.0)));
            let prior_leading = self.leading.get(&scoped).map(|l| l.to_vec()).unwrap_or_default();
            if prior.is_some_and(|p| p != ins.slot) || prior_leading != leading {
                if let Some(old) = prior.filter(|p| *p != ins.slot) {
                    self.drop_tiers(w, old, 0xff);
                }
                let stale: Vec<SlotId> = prior_leading.into_iter().filter(|s| !leading.contains(s)).collect();
                self.release(w, &stale, 0xff);
                self.leading.remove(&scoped);
            }
            if ins.engine_recorded {
                self.exceptions.remove(&scoped);
            } else {
                self.exceptions.insert(scoped, ins.slot);
            }
        }
        self.note_held(ins.slot, ins.prev_tiers, tier);
        if !leading.is_empty() {
            self.leading.insert(scoped, leading.into_boxed_slice());
        }
        true
    }

    /// Holds one canonical block without an engine hash of its own.
    fn hold(&mut self, w: &mut Writer<'_>, key: PrefixKey, engine: u64, tier: TierId) -> Option<SlotId> {
        let ins = w.insert(key, engine, self.pod, tier.bit())?;
        self.note_held(ins.slot, ins.prev_tiers, tier);
        Some(ins.slot)
    }

    fn note_held(&mut self, slot: SlotId, prev_tiers: u8, tier: TierId) {
        if prev_tiers & tier.bit() == 0 {
            self.tier_blocks[tier.0 as usize] += 1;
        }
        if prev_tiers == 0 {
            self.slots.insert(slot.0);
        }
    }

    /// Undoes `hold` for blocks of an engine block that could not be recorded whole.
    fn release(&mut self, w: &mut Writer<'_>, slots: &[SlotId], tier_mask: u8) {
        for &slot in slots {
            self.drop_tiers(w, slot, tier_mask);
        }
    }

    /// Removes tiers of one slot; returns the tiers left.
    fn drop_tiers(&mut self, w: &mut Writer<'_>, slot: SlotId, tier_mask: u8) -> u8 {
        let (prev, left) = w.remove(slot, self.pod, tier_mask);
        let gone = prev & !left;
        for (i, count) in self.tier_blocks.iter_mut().enumerate() {
            if gone & (1 << i) != 0 {
                *count = count.saturating_sub(1);
            }
        }
        if prev != 0 && left == 0 {
            self.slots.remove(slot.0);
        }
        left
    }

    /// A store without tokens re-announces known blocks in another tier (vLLM's CPU offload).
    fn apply_reannounce(&mut self, w: &mut Writer<'_>, ev: &BlockStored<'_>, tier: TierId, report: &mut ApplyReport) {
        for hash in &ev.block_hashes {
            let scoped = self.scoped(ev.group_idx, hash.key()).expect("group checked by caller");
            let Some(last) = self.resolve(w, scoped) else {
                report.skip(SkipReason::UnknownBlock, 1);
                continue;
            };
            let leading: Vec<SlotId> = self.leading.get(&scoped).map(|s| s.to_vec()).unwrap_or_default();
            let mut full = false;
            for slot in leading.into_iter().chain(std::iter::once(last)) {
                match w.key_of(slot).and_then(|key| w.insert(key, 0, self.pod, tier.bit())) {
                    Some(ins) => self.note_held(ins.slot, ins.prev_tiers, tier),
                    None => full = true,
                }
            }
            if full {
                report.skip(SkipReason::IndexFull, 1);
            } else {
                report.stored_blocks += 1;
            }
        }
    }

    fn apply_removed(
        &mut self,
        ctx: &IngestContext<'_>,
        w: &mut Writer<'_>,
        ev: &BlockRemoved<'_>,
        report: &mut ApplyReport,
    ) {
        let blocks = ev.block_hashes.len() as u64;
        let Some(tier) = self.event_tier(ctx, ev.medium, ev.group_idx, blocks, report) else { return };
        for hash in &ev.block_hashes {
            let scoped = self.scoped(ev.group_idx, hash.key()).expect("group checked above");
            if self.forget_block(w, scoped, tier.bit()) {
                report.removed_blocks += 1;
            } else {
                report.removed_unknown += 1;
            }
        }
    }

    /// Removes `tier_mask` of one engine block; forgets its engine hash once no tier holds it.
    /// Returns whether the block was known.
    fn forget_block(&mut self, w: &mut Writer<'_>, scoped: u64, tier_mask: u8) -> bool {
        let Some(last) = self.resolve(w, scoped) else { return false };
        let leading: Vec<SlotId> = self.leading.get(&scoped).map(|s| s.to_vec()).unwrap_or_default();
        for slot in leading {
            self.drop_tiers(w, slot, tier_mask);
        }
        if self.drop_tiers(w, last, tier_mask) == 0 {
            self.exceptions.remove(&scoped);
            self.leading.remove(&scoped);
        }
        true
    }

    /// What the export facade (`index::export`) reads: every slot held, the engine hashes
    /// resolved through an exception, and the leading slots of engine blocks spanning several
    /// canonical blocks.
    pub(super) fn residency_parts(&self) -> ResidencyParts<'_> {
        (&self.slots, &self.exceptions, &self.leading)
    }

    /// Restores one engine block for the export facade: `keys` in chain order with this pod's
    /// tier bits; the last carries the scoped engine hash `scoped` (0: held without one).
    /// Returns false when the entry bound refused a residency (what was held stays held: the
    /// pod did hold it, so this can only under-report).
    pub(super) fn restore_block(&mut self, w: &mut Writer<'_>, scoped: u64, keys: &[(PrefixKey, u8)]) -> bool {
        let mut leading = Vec::new();
        for (i, &(key, tiers)) in keys.iter().enumerate() {
            let last = i + 1 == keys.len();
            let engine = if last { scoped } else { 0 };
            for tier in (0..MAX_TIERS as u8).map(TierId).filter(|t| tiers & t.bit() != 0) {
                let Some(ins) = w.insert(key, engine, self.pod, tier.bit()) else { return false };
                self.note_held(ins.slot, ins.prev_tiers, tier);
                if last && scoped != 0 && !ins.engine_recorded {
                    self.exceptions.insert(scoped, ins.slot);
                }
                if !last && leading.last() != Some(&ins.slot) {
                    leading.push(ins.slot);
                }
            }
        }
        if scoped != 0 && !leading.is_empty() {
            self.leading.insert(scoped, leading.into_boxed_slice());
        }
        true
    }

    /// Drops everything this pod holds: `AllBlocksCleared`, a restart, an unrecoverable gap,
    /// or unregistration. Costs O(this pod's blocks). Returns the entries removed.
    pub fn clear(&mut self, w: &mut Writer<'_>) -> u64 {
        let mut entries = 0;
        for slot in &self.slots {
            if w.remove(SlotId(slot), self.pod, 0xff).0 != 0 {
                entries += 1;
            }
        }
        self.slots.clear();
        self.exceptions = FxHashMap::default();
        self.leading = FxHashMap::default();
        self.tier_blocks = [0; MAX_TIERS];
        entries
    }
}

/// A pod's held slots, exception engine hashes and leading slots (see `residency_parts`).
pub(super) type ResidencyParts<'a> = (&'a RoaringBitmap, &'a FxHashMap<u64, SlotId>, &'a FxHashMap<u64, Box<[SlotId]>>);

/// Separates engine-hash scopes from key namespaces derived from the same model name.
const SCOPE_SALT: u64 = 0x656e_6769_6e65_5f68; // "engine_h"

fn published<'a>(h: &EngineHash<'a>) -> PublishedHash<'a> {
    match *h {
        EngineHash::Uint(v) => PublishedHash::Int(v),
        EngineHash::Int(v) => PublishedHash::Int(v as u64),
        EngineHash::Bytes(b) => PublishedHash::Bytes(b),
    }
}
