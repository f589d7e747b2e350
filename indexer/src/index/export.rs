//! The index's logical content, out and back in: what snapshots persist for warm restarts.
//!
//! A pod's residencies are exported as *engine blocks*: the scoped engine hash a pod's events
//! name the block by, its canonical block keys (key recipe 3: each covers only its own tokens)
//! in chain order with the tiers the pod holds each in, and where its chain continues: a
//! namespace root, or an earlier engine block of the same export, with the keys of any path
//! between them that the pod does not hold as an engine block of its own. That is what the
//! events established, independent of how the tree lays it out in memory (segment numbers,
//! branch links), so a snapshot written by one process loads into another. Token ids are never
//! part of it.
//!
//! Importing replays that content through the store the events use (`PodIngest::store_run`):
//! the entry bound still holds (a refused block is counted and only under-reports), a block
//! whose parent was refused is refused too, and engine-hash resolution (for later
//! `parent_block_hash` and `BlockRemoved`) comes back as it was.
//!
//! A hybrid engine's KV-cache groups (sliding-window or Mamba groups holding blocks off paths
//! they do not hold) are carried too: each group's kind and block size, which scoring needs,
//! and its engine blocks under the group's own namespace root, with the path they hang off.
//!
//! So are the pod's engine units (see `units`): the block sizes its events stored per group
//! and tier since it was last cleared, which may be larger than its remaining blocks show (a
//! stream that changed block size). A restored pod is never credited at a smaller unit than
//! before. An export without units (written before they were recorded) is restored with the
//! units its engine blocks' spans show, as the live index would have learnt them from their
//! stores.

pub use super::engine_blocks::ChainParent;
use super::engine_blocks::EngineBlocks;
use super::groups::{GroupKind, GroupSpec, MAX_GROUPS};
use super::ingest::PodIngest;
use super::kv_index::KvIndex;
use super::pods::PodId;
use super::tiers::{TierId, MAX_TIERS};
use super::tree::{HeldBlock, ParentKey, Pos};
use super::units::lcm;
use crate::keys::BlockKey;
use crossbeam_epoch::Guard;

/// One pod's residencies, as events established them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodExport {
    pub pod: String,
    pub model: String,
    /// Tier names by bit position of the masks in `blocks`.
    pub tiers: Vec<String>,
    /// Engine blocks, every block after the one its parent names (see [`EngineBlocks`]).
    pub blocks: EngineBlocks,
    /// What the engine said about each KV-cache group, by index (None = never seen). Empty
    /// or one full-attention group: a plain engine.
    pub groups: Vec<Option<GroupExport>>,
    /// The engine units per KV-cache group and tier (empty: an export made before units were
    /// recorded; restored from the blocks' spans).
    pub units: Vec<UnitExport>,
}

/// The engine unit of one KV-cache group in one tier: the least common multiple of the engine
/// block sizes (in canonical blocks) the pod stored there since it was last cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitExport {
    pub group: u32,
    pub tier: String,
    pub blocks: u32,
}

/// One KV-cache group, as the engine described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupExport {
    /// `full`, `sliding_window`, `mamba`, `as_full` (full attention as far as scoring goes, or
    /// a kind the engine did not name) or `unscored`; another name imports as `unscored`.
    pub kind: String,
    /// A sliding window's tokens (0 otherwise).
    pub window: u32,
    /// The group's block size in tokens (0 = none stored yet).
    pub block_tokens: u32,
}

impl GroupExport {
    fn of(spec: &GroupSpec) -> Self {
        let (kind, window) = match spec.kind {
            GroupKind::Full => ("full", 0),
            GroupKind::SlidingWindow { tokens } => ("sliding_window", tokens),
            GroupKind::Mamba => ("mamba", 0),
            GroupKind::AsFull => ("as_full", 0),
            GroupKind::Unscored => ("unscored", 0),
        };
        GroupExport { kind: kind.to_string(), window, block_tokens: spec.block_tokens }
    }

    /// The group's spec; a kind this build does not know is not scored, never guessed.
    fn spec(&self) -> GroupSpec {
        let kind = match (self.kind.as_str(), self.window) {
            ("full", _) => GroupKind::Full,
            ("sliding_window", tokens) if tokens > 0 => GroupKind::SlidingWindow { tokens },
            ("mamba", _) => GroupKind::Mamba,
            ("as_full", _) => GroupKind::AsFull,
            _ => GroupKind::Unscored,
        };
        GroupSpec { kind, block_tokens: self.block_tokens }
    }
}

/// What an import restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImportReport {
    pub blocks: u64,
    /// Engine blocks the entry bound, an unnameable tier or a refused parent refused, whole
    /// or in part.
    pub refused: u64,
}

impl PodExport {
    /// Canonical (block, tier) residencies, counted once per key and tier bit.
    pub fn residencies(&self) -> u64 {
        self.blocks.residencies()
    }
}

/// An export's scratch: every engine block's keys, tiers and path, one after another.
#[derive(Default)]
struct Buffers {
    keys: Vec<BlockKey>,
    tiers: Vec<u8>,
    paths: Vec<BlockKey>,
}

/// An engine block's export, before its parent's index is known: its keys and tiers, and its
/// path, as ranges of the [`Buffers`].
#[derive(Clone, Copy)]
struct Planned {
    keys: (u32, u32),
    path: (u32, u32),
    /// The namespace root, or the end (index into the pod's engine blocks) it continues.
    parent: Result<u64, u32>,
}

impl KvIndex {
    /// The residencies of `pod`, or `None` if it has no ingest state. Holds the pod's lock
    /// while it runs: the export is one point in the pod's event order.
    pub fn export_pod(&self, pod: &str) -> Option<PodExport> {
        let id = self.pods.get(pod)?;
        let state = self.states.read().get(&id).cloned()?;
        let state = state.lock();
        let guard = self.tree.pin();
        let blocks =
            self.blocks_in_one_pass(&state, id, &guard).unwrap_or_else(|| self.blocks_by_plan(&state, id, &guard));
        let tiers = (0..self.tiers.count() as u8).map(|t| self.tiers.name(TierId(t))).collect();
        let groups = state.groups().iter().map(|g| g.as_ref().map(GroupExport::of)).collect();
        let units = state
            .units()
            .slots()
            .iter()
            .map(|&(group, tier, blocks)| UnitExport { group, tier: self.tiers.name(TierId(tier)), blocks })
            .collect();
        Some(PodExport { pod: pod.to_string(), model: state.model().to_string(), tiers, blocks, groups, units })
    }

    /// The pod's engine blocks, built as the pass over its segments meets them (see
    /// `PodIngest::each_engine_block`): in position order a chain's engine blocks come one
    /// after another, so nearly every block's parent is the block just pushed, and any other
    /// earlier one is found by position with a binary search. Nothing is held per block but
    /// the columns themselves and each block's position.
    ///
    /// `None` when a block's chain continues a position after its own (a segment number
    /// reused for a chain that continues a later one: its parent is not listed yet), or the
    /// tree does not have what the pod's maps name (never the case under the pod's lock):
    /// then `blocks_by_plan` exports the pod, in any order.
    fn blocks_in_one_pass(&self, state: &PodIngest, id: PodId, guard: &Guard) -> Option<EngineBlocks> {
        let tree = &self.tree;
        let capacity = state.blocks() as usize;
        let mut blocks = EngineBlocks::with_capacity(capacity, capacity);
        // The packed position of every pushed engine block's last block, increasing.
        let mut ends: Vec<u64> = Vec::with_capacity(capacity);
        let (mut keys, mut tiers, mut path) = (Vec::new(), Vec::new(), Vec::new());
        let complete = state.each_engine_block(tree, guard, |engine, count, last| {
            let end = last.pos.pack();
            debug_assert!(ends.last().is_none_or(|&e| e <= end), "engine blocks come in position order");
            // The usual engine block: one canonical block right after the one pushed before it
            // in the same segment (the offset before it packs to `end - 1`).
            if count == 1 && last.pos.off > 0 && ends.last() == Some(&(end - 1)) {
                if blocks.push_continuing(engine, last.key, last.tiers).is_err() {
                    return false;
                }
                ends.push(end);
                return true;
            }
            keys.clear();
            tiers.clear();
            let Some(mut first) = self.engine_block_keys(id, &last, count, guard, &mut keys, &mut tiers) else {
                return false;
            };
            path.clear();
            let parent = loop {
                let Some(p) = tree.previous(first, guard) else {
                    match tree.root_of(first.seg, guard) {
                        Some(root) => break ChainParent::Root(root),
                        None => return false,
                    }
                };
                let at = p.pack();
                if at >= end {
                    // Possibly an engine block not listed yet.
                    return false;
                }
                if ends.last() == Some(&at) {
                    break ChainParent::Block(ends.len() as u32 - 1);
                }
                if let Ok(j) = ends.binary_search(&at) {
                    break ChainParent::Block(j as u32);
                }
                // Every engine block before this one is listed: `p` is on the path.
                let Some(key) = tree.key_at(p, guard) else { return false };
                path.push(key);
                first = p;
            };
            path.reverse();
            if blocks.push(engine, parent, &path, &keys, &tiers).is_err() {
                return false;
            }
            ends.push(end);
            true
        });
        complete.then_some(blocks)
    }

    /// Appends the keys of the engine block ending at `last` (`count` canonical blocks) and the
    /// pod's tiers of them, in chain order; returns the position of its first block. `None`
    /// when a block is gone (never the case under the pod's lock).
    fn engine_block_keys(
        &self,
        id: PodId,
        last: &HeldBlock,
        count: u32,
        guard: &Guard,
        keys: &mut Vec<BlockKey>,
        tiers: &mut Vec<u8>,
    ) -> Option<Pos> {
        let from = keys.len();
        keys.push(last.key);
        tiers.push(last.tiers);
        let mut at = last.pos;
        for _ in 1..count {
            at = self.tree.previous(at, guard)?;
            keys.push(self.tree.key_at(at, guard)?);
            tiers.push(self.tree.tiers_at(at, id, guard));
        }
        keys[from..].reverse();
        tiers[from..].reverse();
        Some(at)
    }

    /// The pod's engine blocks in any position order: every engine block's keys, tiers and
    /// path first, its parent found among all of them by position, then emitted depth first
    /// from every end when a parent comes after its child.
    fn blocks_by_plan(&self, state: &PodIngest, id: PodId, guard: &Guard) -> EngineBlocks {
        let tree = &self.tree;
        let ends = state.engine_blocks(tree, guard);
        debug_assert!(ends.windows(2).all(|w| w[0].2.pos <= w[1].2.pos));
        let end_at = |i: usize, p: Pos| -> Option<u32> {
            if i > 0 && ends[i - 1].2.pos == p {
                return Some(i as u32 - 1);
            }
            ends.binary_search_by_key(&p, |e| e.2.pos).ok().map(|j| j as u32)
        };
        // Every engine block's keys, tiers and path, into flat buffers (no allocation per block).
        let spanned: usize = ends.iter().map(|e| e.1 as usize).sum();
        let mut buf =
            Buffers { keys: Vec::with_capacity(spanned), tiers: Vec::with_capacity(spanned), paths: Vec::new() };
        let plan = |buf: &mut Buffers, i: usize| -> Option<Planned> {
            let (_, count, last) = ends[i];
            let from = buf.keys.len();
            let mut first = self.engine_block_keys(id, &last, count, guard, &mut buf.keys, &mut buf.tiers)?;
            let path_from = buf.paths.len();
            let parent = loop {
                match tree.previous(first, guard) {
                    None => break Ok(tree.root_of(first.seg, guard)?),
                    Some(p) => match end_at(i, p) {
                        Some(j) => break Err(j),
                        None => {
                            buf.paths.push(tree.key_at(p, guard)?);
                            first = p;
                        }
                    },
                }
            };
            buf.paths[path_from..].reverse();
            let range = |a: usize, b: usize| (a as u32, b as u32);
            Some(Planned { keys: range(from, buf.keys.len()), path: range(path_from, buf.paths.len()), parent })
        };
        let plans: Vec<Option<Planned>> = (0..ends.len())
            .map(|i| {
                let (k, p) = (buf.keys.len(), buf.paths.len());
                let planned = plan(&mut buf, i);
                if planned.is_none() {
                    // A block gone under us (never the case under the pod's lock): left out.
                    buf.keys.truncate(k);
                    buf.tiers.truncate(k);
                    buf.paths.truncate(p);
                }
                planned
            })
            .collect();
        let mut blocks = EngineBlocks::with_capacity(ends.len(), spanned);
        let r = |(a, b): (u32, u32)| a as usize..b as usize;
        let mut index: Vec<Option<u32>> = vec![None; ends.len()];
        let emit = |blocks: &mut EngineBlocks, index: &mut [Option<u32>], i: usize| {
            let Some(p) = plans[i] else { return };
            let parent = match p.parent {
                Ok(root) => ChainParent::Root(root),
                // A parent left out, or not a chain (never the case): left out too.
                Err(j) => match index[j as usize] {
                    Some(at) => ChainParent::Block(at),
                    None => return,
                },
            };
            let (path, keys, tiers) = (&buf.paths[r(p.path)], &buf.keys[r(p.keys)], &buf.tiers[r(p.keys)]);
            if blocks.push(ends[i].0, parent, path, keys, tiers).is_ok() {
                index[i] = Some(blocks.len() as u32 - 1);
            }
        };
        let mut visited = vec![false; ends.len()];
        let mut stack = Vec::new();
        for start in 0..ends.len() {
            let mut i = start;
            while !visited[i] {
                visited[i] = true;
                stack.push(i);
                match plans[i] {
                    Some(Planned { parent: Err(j), .. }) => i = j as usize,
                    _ => break,
                }
            }
            while let Some(i) = stack.pop() {
                emit(&mut blocks, &mut index, i);
            }
        }
        blocks
    }

    /// Every exported pod's residencies (see `export_pod`), by pod name.
    pub fn export_all(&self) -> Vec<PodExport> {
        self.pod_names().iter().filter_map(|p| self.export_pod(p)).collect()
    }

    /// Replaces what `export.pod` holds with `export`'s residencies.
    ///
    /// Consecutive engine blocks that continue one another directly (the export lists a
    /// chain's blocks in order), of one size and in the same tiers, go to the store as one
    /// chain, as an event naming several blocks would: one shard lock and one walk per chain
    /// instead of per block.
    pub fn import_pod(&self, export: &PodExport) -> ImportReport {
        let mut report = ImportReport::default();
        self.clear_pod(&export.pod);
        let Some(state) = self.state(&export.pod, &export.model) else {
            report.refused = export.blocks.len() as u64;
            return report;
        };
        // Tier bits of the export, renamed to this index's bits (`None`: no room for the tier).
        let remap: Vec<Option<u8>> =
            export.tiers.iter().take(MAX_TIERS).map(|n| self.tiers.intern(Some(n)).map(TierId::bit)).collect();
        let known = ((1u16 << remap.len()) - 1) as u8;
        // Per exported tier mask: this index's tiers, and whether a tier could not be named here.
        let renamed: Vec<(u8, bool)> = (0..=255u8)
            .map(|m| {
                let mut tiers = 0;
                let mut lost = m & !known != 0;
                for (bit, to) in remap.iter().enumerate() {
                    if m & (1 << bit) != 0 {
                        match to {
                            Some(to) => tiers |= to,
                            None => lost = true,
                        }
                    }
                }
                (tiers, lost)
            })
            .collect();
        let blocks: Vec<_> = export.blocks.iter().collect();
        // Per engine block: the tiers every one of its blocks is held in (a tier held for only
        // some of them is left out), and whether a tier could not be named here.
        let masks: Vec<(u8, bool)> = blocks
            .iter()
            .map(|block| {
                block.tiers.iter().fold((0xff, false), |(mask, lost), &m| {
                    let (tiers, l) = renamed[m as usize];
                    (mask & tiers, lost | l)
                })
            })
            .collect();
        let mut state = state.lock();
        self.stamp(&mut state);
        // The groups first, so that no block of a hybrid pod is scored as plain.
        let groups: Vec<Option<GroupSpec>> =
            export.groups.iter().take(MAX_GROUPS).map(|g| g.as_ref().map(GroupExport::spec)).collect();
        state.restore_groups(&groups);
        if state.take_groups_changed() {
            self.publish_plan(state.pod(), Some(state.groups()));
        }
        // The units before any block, so that no block is scored at a smaller one.
        if export.units.is_empty() {
            // Per tier, the spans of the blocks held there (group 0: an export without units
            // does not say which group a block is in; a hybrid pod aligns to every group's).
            let mut spans: [u32; MAX_TIERS] = [0; MAX_TIERS];
            for (block, &(mask, _)) in blocks.iter().zip(&masks) {
                for (t, unit) in spans.iter_mut().enumerate() {
                    if mask & (1 << t) != 0 {
                        *unit = lcm(*unit, block.keys.len().max(1) as u32);
                    }
                }
            }
            for (t, &unit) in spans.iter().enumerate().filter(|(_, &u)| u > 0) {
                state.restore_unit(0, TierId(t as u8), unit);
            }
        }
        for unit in &export.units {
            // A tier that cannot be named here holds nothing here; its unit still counts (a
            // larger unit only under-reports).
            let tier = self.tiers.intern(Some(&unit.tier)).unwrap_or(TierId::GPU);
            state.restore_unit(unit.group.min(MAX_GROUPS as u32 - 1), tier, unit.blocks);
        }
        if let Some(cut) = state.take_cut_change() {
            self.publish_cut(&mut state, cut);
        }
        let tree = &self.tree;
        let id = state.pod();
        // Where each imported block's last block went, with its segment's first key (a check
        // that it is still the block this pod holds before a child hangs off it).
        let mut placed: Vec<Option<(Pos, u64)>> = Vec::with_capacity(blocks.len());
        let mut positions = Vec::new();
        let mut keys = Vec::new();
        let mut ends = Vec::new();
        // Blocks that a later chain continues directly: not chain ends (see `forget_end`). The
        // blocks inside one chain's store never were (the store notes only its last one).
        let mut continued = vec![false; blocks.len()];
        let mut i = 0;
        while i < blocks.len() {
            let block = &blocks[i];
            let (mask, _) = masks[i];
            let per_block = block.keys.len();
            // The chain of blocks that continue `block` directly, alike in size and tiers.
            let mut j = i + 1;
            while j < blocks.len()
                && mask != 0
                && blocks[j].parent == ChainParent::Block(j as u32 - 1)
                && blocks[j].path.is_empty()
                && blocks[j].keys.len() == per_block
                && masks[j].0 == mask
            {
                j += 1;
            }
            let guard = tree.pin();
            let parent = match block.parent {
                ChainParent::Root(root) => Some(ParentKey::Root(root)),
                ChainParent::Block(p) => placed
                    .get(p as usize)
                    .copied()
                    .flatten()
                    .filter(|&(p, first)| tree.first_key(p, &guard) == Some(first) && tree.tiers_at(p, id, &guard) != 0)
                    .map(|(p, _)| ParentKey::Block(p.pack())),
            };
            drop(guard);
            keys.clear();
            keys.extend_from_slice(block.path);
            ends.clear();
            for b in &blocks[i..j] {
                keys.extend_from_slice(b.keys);
                ends.push((keys.len() - 1, b.engine));
            }
            positions.clear();
            let all_tiers = match parent {
                Some(parent) if mask != 0 => {
                    state.restore_run(tree, parent, &keys, block.path.len(), &ends, per_block, mask, &mut positions)
                }
                _ => false,
            };
            let guard = tree.pin();
            if let (false, ChainParent::Block(p), true) = (positions.is_empty(), block.parent, block.path.is_empty()) {
                continued[p as usize] = true;
            }
            for (k, &(_, lost_tier)) in masks[i..j].iter().enumerate() {
                let at = positions.get(k).copied();
                placed.push(at.and_then(|p| tree.first_key(p, &guard).map(|f| (p, f))));
                if at.is_some() && all_tiers && !lost_tier {
                    report.blocks += 1;
                } else {
                    report.refused += 1;
                }
            }
            i = j;
        }
        for (block, _) in blocks.iter().zip(&continued).filter(|(_, c)| **c) {
            state.forget_end(block.engine);
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch};
    use crate::{KvIndexConfig, ScoreQuery};

    fn batch(events: Vec<Event<'static>>) -> EventBatch<'static> {
        EventBatch { ts: 0.0, events, data_parallel_rank: None }
    }

    fn stored(
        hashes: &[u64],
        parent: Option<u64>,
        tokens: Vec<u32>,
        bs: i64,
        medium: Option<&'static str>,
    ) -> Event<'static> {
        Event::BlockStored(BlockStored {
            block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
            parent_block_hash: parent.map(EngineHash::Uint),
            token_ids: (!tokens.is_empty()).then_some(tokens),
            block_size: Some(bs),
            medium,
            ..Default::default()
        })
    }

    fn removed(hashes: &[u64], medium: Option<&'static str>) -> Event<'static> {
        Event::BlockRemoved(BlockRemoved {
            block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
            medium,
            ..Default::default()
        })
    }

    fn scores(index: &KvIndex, prompts: &[Vec<u32>]) -> Vec<String> {
        prompts
            .iter()
            .map(|p| {
                let q = ScoreQuery { model: "m", lora_name: None, cache_salt: None, token_ids: p, pods: None };
                let r = index.score(&q);
                let mut names: Vec<String> = r
                    .matches
                    .iter()
                    .map(|m| format!("{}:{}:{}", index.pods().name(m.pod).unwrap(), m.matched_blocks, m.weighted_score))
                    .collect();
                names.sort(); // pod ids are interned in another order after a restore
                format!("{}/{}", r.total_blocks, names.join(","))
            })
            .collect()
    }

    /// Per prompt, each pod's matched blocks (tiers aside: an engine block held in a tier for
    /// only some of its blocks is restored without that tier, which only under-reports).
    fn matched(index: &KvIndex, prompts: &[Vec<u32>]) -> Vec<Vec<(String, u32)>> {
        prompts
            .iter()
            .map(|p| {
                let q = ScoreQuery { model: "m", lora_name: None, cache_salt: None, token_ids: p, pods: None };
                let mut m: Vec<(String, u32)> = index
                    .score(&q)
                    .matches
                    .iter()
                    .map(|m| (index.pods().name(m.pod).unwrap().to_string(), m.matched_blocks))
                    .collect();
                m.sort();
                m
            })
            .collect()
    }

    /// Two pods sharing a chain, one hashing differently, engine blocks of two canonical
    /// blocks, a CPU copy, a removal.
    fn history(index: &KvIndex) {
        let t = |a: u32, n: u32| (a..a + n).collect::<Vec<u32>>();
        index.apply("a", "m", &batch(vec![stored(&[1, 2], None, t(0, 8), 4, None)]));
        index.apply("a", "m", &batch(vec![stored(&[3], Some(2), t(8, 4), 4, None)]));
        index.apply("a", "m", &batch(vec![stored(&[2], None, vec![], 4, Some("CPU"))]));
        index.apply("b", "m", &batch(vec![stored(&[101, 102, 103], None, t(0, 6), 2, None)]));
        index.apply("b", "m", &batch(vec![removed(&[103], None)]));
        index.apply("c", "m", &batch(vec![stored(&[1], None, t(0, 4), 4, Some("STORAGE"))]));
        // Hashing differently from b, and evicting out of chain order: 203 continues a path
        // (202's block) the pod no longer holds.
        index.apply("d", "m", &batch(vec![stored(&[201, 202, 203], None, t(0, 6), 2, None)]));
        index.apply("d", "m", &batch(vec![removed(&[202], None)]));
    }

    /// Events after the restore that only resolve if engine hashes came back.
    fn later(index: &KvIndex) {
        let t = |a: u32, n: u32| (a..a + n).collect::<Vec<u32>>();
        index.apply("a", "m", &batch(vec![stored(&[4], Some(3), t(12, 4), 4, None), removed(&[1], None)]));
        index.apply("b", "m", &batch(vec![stored(&[104], Some(102), t(4, 2), 2, None)]));
        index.apply("a", "m", &batch(vec![removed(&[2], Some("CPU"))]));
        index.apply("c", "m", &batch(vec![removed(&[1], Some("STORAGE"))]));
        index.apply("d", "m", &batch(vec![stored(&[204], Some(203), t(6, 2), 2, None), removed(&[201], None)]));
    }

    #[test]
    fn export_then_import_answers_as_before_and_resolves_later_events() {
        let config = KvIndexConfig { block_size: 2, shards: 4, ..Default::default() };
        let prompts: Vec<Vec<u32>> = (0..=16).map(|n| (0..n).collect()).collect();
        let original = KvIndex::new(config.clone());
        history(&original);
        let restored = KvIndex::new(config);
        restored.tiers().intern(Some("DISK")); // tier bits need not line up
        for pod in original.export_all() {
            let r = restored.import_pod(&pod);
            assert_eq!(r.refused, 0, "{pod:?}");
        }
        assert_eq!(scores(&restored, &prompts), scores(&original, &prompts));
        assert_eq!(restored.table().entries(), original.table().entries());
        for pod in ["a", "b", "c", "d"] {
            assert_eq!(restored.pod_stats(pod).map(|s| s.blocks), original.pod_stats(pod).map(|s| s.blocks));
        }
        later(&original);
        later(&restored);
        assert_eq!(scores(&restored, &prompts), scores(&original, &prompts));
        assert_eq!(restored.table().entries(), original.table().entries());
    }

    #[test]
    fn import_respects_the_entry_bound_and_only_under_reports() {
        let original = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        history(&original);
        let small = KvIndex::new(KvIndexConfig { block_size: 2, max_entries: 3, ..Default::default() });
        let refused: u64 = original.export_all().iter().map(|p| small.import_pod(p).refused).sum();
        assert!(refused > 0);
        assert!(small.table().entries() <= 3);
        let prompts: Vec<Vec<u32>> = (0..=16).map(|n| (0..n).collect()).collect();
        for p in &prompts {
            let q = ScoreQuery { model: "m", lora_name: None, cache_salt: None, token_ids: p, pods: None };
            let full = original.score(&q);
            for m in small.score(&q).matches {
                let name = small.pods().name(m.pod);
                let f =
                    full.matches.iter().find(|f| original.pods().name(f.pod) == name).expect("a pod the original has");
                assert!(m.matched_blocks <= f.matched_blocks);
            }
        }
    }

    #[test]
    fn a_chain_gap_is_carried_as_path() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        history(&index);
        let d = index.export_pod("d").expect("d has state");
        let blocks: Vec<_> = d.blocks.iter().collect();
        assert_eq!(blocks.len(), 2);
        assert!(matches!(blocks[0].parent, ChainParent::Root(_)));
        assert_eq!(blocks[1].parent, ChainParent::Block(0));
        assert_eq!(blocks[1].path.len(), 1, "202's block: path d no longer holds");
        assert_eq!(d.residencies(), 2);
    }

    #[test]
    fn hybrid_pods_come_back_with_their_groups() {
        let config = KvIndexConfig { block_size: 2, ..Default::default() };
        let index = KvIndex::new(config.clone());
        history(&index);
        let t: Vec<u32> = (0..4).collect();
        // Group 0 a 2-token sliding window keeping only the last block, group 1 full attention.
        let mut window = stored(&[8], None, t.clone(), 2, None);
        let mut full = stored(&[7, 8], None, t, 2, None);
        if let (Event::BlockStored(w), Event::BlockStored(f)) = (&mut window, &mut full) {
            w.group_idx = Some(0);
            w.kv_cache_spec_kind = Some("sliding_window");
            w.kv_cache_spec_sliding_window = Some(2);
            f.group_idx = Some(1);
            f.kv_cache_spec_kind = Some("full_attention");
        }
        index.apply("h", "m", &batch(vec![window, full]));
        let h = index.export_pod("h").expect("h has state");
        assert_eq!(h.groups.len(), 2);
        assert_eq!(h.groups[0].as_ref().map(|g| (g.kind.as_str(), g.window)), Some(("sliding_window", 2)));
        let restored = KvIndex::new(config);
        for pod in index.export_all() {
            assert_eq!(restored.import_pod(&pod).refused, 0, "{pod:?}");
        }
        let prompts: Vec<Vec<u32>> = (0..=8).map(|n| (0..n).collect()).collect();
        assert_eq!(scores(&restored, &prompts), scores(&index, &prompts));
        assert!(scores(&index, &prompts).iter().any(|s| s.contains("h:2")), "the hybrid pod scores its prefix");
        assert_eq!(restored.pod_stats("h").map(|s| s.blocks), index.pod_stats("h").map(|s| s.blocks));
        // An unknown kind imports as not scored: the pod under-reports, never guesses.
        let mut odd = h.clone();
        odd.pod = "h2".into();
        odd.groups[0] = Some(GroupExport { kind: "from_the_future".into(), window: 0, block_tokens: 2 });
        restored.import_pod(&odd);
        assert!(scores(&restored, &prompts).iter().all(|s| !s.contains("h2:")));
    }

    #[test]
    fn a_block_whose_parent_was_refused_is_refused_too() {
        let original = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        history(&original);
        let d = original.export_pod("d").expect("d has state");
        // The first engine block held in no tier: nothing to restore, so its child hangs off
        // nothing the pod holds.
        let mut blocks = EngineBlocks::default();
        for (k, b) in d.blocks.iter().enumerate() {
            let tiers: Vec<u8> = b.tiers.iter().map(|&t| if k == 0 { 0 } else { t }).collect();
            blocks.push(b.engine, b.parent, b.path, b.keys, &tiers).unwrap();
        }
        let e = PodExport { pod: "e".into(), blocks, ..d.clone() };
        let restored = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        let r = restored.import_pod(&e);
        assert_eq!(r, ImportReport { blocks: 0, refused: d.blocks.len() as u64 });
        assert_eq!(restored.pod_stats("e").map(|s| s.blocks), Some(0));
        assert_eq!(restored.table().entries(), 0);
    }

    #[test]
    fn a_pod_version_moves_with_every_change_and_never_comes_back() {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, ..Default::default() });
        assert_eq!(index.pod_version("a"), None);
        history(&index);
        let mut seen = vec![index.pod_version("a").expect("a has state")];
        let export = index.export_pod("a").expect("a has state");
        assert_eq!(index.pod_version("a"), Some(seen[0]), "reading and exporting change nothing");
        let mut changed = |index: &KvIndex| {
            let v = index.pod_version("a").expect("a has state");
            assert!(v > *seen.last().unwrap(), "a new version, never an old one");
            seen.push(v);
        };
        index.apply("a", "m", &batch(vec![removed(&[3], None)]));
        changed(&index);
        index.clear_pod("a");
        changed(&index);
        index.import_pod(&export);
        changed(&index);
        assert!(index.remove_pod("a"));
        assert_eq!(index.pod_version("a"), None);
        index.apply("a", "m", &batch(vec![removed(&[3], None)]));
        changed(&index);
    }

    /// A random history of many pods: chains sharing prefixes, branching, engine blocks of
    /// one or two canonical blocks, CPU copies, removals anywhere (out of chain order too).
    fn random_history(index: &KvIndex, seed: u64, steps: usize) {
        random_history_hashed(index, seed, steps, false)
    }

    /// `random_history`; with `own_seeds`, every pod hashes with a seed of its own (engines
    /// with different hash seeds), so every block a pod shares with another is named by an
    /// exception in one of them.
    fn random_history_hashed(index: &KvIndex, seed: u64, steps: usize, own_seeds: bool) {
        let mut x = seed | 1;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let pods = ["p0", "p1", "p2", "p3"];
        // Per pod: engine hashes stored so far (for parents and removals); engine block size
        // per pod is fixed (a plain engine has one).
        let mut stored_hashes: Vec<Vec<u64>> = vec![Vec::new(); pods.len()];
        for step in 0..steps {
            let p = next(pods.len() as u64) as usize;
            let bs = if p.is_multiple_of(2) { 2 } else { 4 };
            let pod = pods[p];
            match next(10) {
                0..=5 => {
                    // A chain of 1..6 engine blocks from the root, tokens from a small
                    // alphabet of prefixes so chains are shared and branch.
                    let n = 1 + next(6) as u32;
                    let family = next(3) as u32;
                    let fork = next(4) as u32;
                    let tokens: Vec<u32> = (0..n * bs as u32)
                        .map(
                            |t| if t < fork * 2 { family * 1000 + t } else { family * 1000 + t + 100 * (p as u32 + 1) },
                        )
                        .collect();
                    // Engine hashes: the token content and the pod's block size (pods that
                    // hash alike share names), chained by position.
                    let hashes: Vec<u64> = (0..n as u64)
                        .map(|b| {
                            let chunk = &tokens[..((b + 1) as usize * bs as usize)];
                            let seed = bs as u64 * 0x9e37 + if own_seeds { p as u64 * 0x51_7cc1 } else { 0 };
                            chunk.iter().fold(seed, |h, &t| (h ^ t as u64).wrapping_mul(0x100_0000_01b3)) | 1
                        })
                        .collect();
                    let medium = if next(5) == 0 { Some("CPU") } else { None };
                    index.apply(pod, "m", &batch(vec![stored(&hashes, None, tokens, bs, medium)]));
                    stored_hashes[p].extend(hashes);
                }
                6..=8 if !stored_hashes[p].is_empty() => {
                    let h = stored_hashes[p][next(stored_hashes[p].len() as u64) as usize];
                    let medium = if next(4) == 0 { Some("CPU") } else { None };
                    index.apply(pod, "m", &batch(vec![removed(&[h], medium)]));
                }
                _ if step % 7 == 0 => {
                    index.apply(pod, "m", &batch(vec![Event::AllBlocksCleared { other: Vec::new() }]));
                    stored_hashes[p].clear();
                }
                _ => {}
            }
        }
    }

    /// The round-trip property of one random history (see `random_histories_round_trip`).
    fn round_trip(seed: u64, steps: usize, bound: u64) -> Result<(), proptest::test_runner::TestCaseError> {
        round_trip_hashed(seed, steps, bound, false)
    }

    fn round_trip_hashed(
        seed: u64,
        steps: usize,
        bound: u64,
        own_seeds: bool,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let config = KvIndexConfig { block_size: 2, shards: 4, ..Default::default() };
        let prompts: Vec<Vec<u32>> = (0..3u32)
            .flat_map(|f| {
                (0..4u32).flat_map(move |p| {
                    (0..=24u32).step_by(2).map(move |n| {
                        (0..n).map(|t| if t < 2 { f * 1000 + t } else { f * 1000 + t + 100 * (p + 1) }).collect()
                    })
                })
            })
            .chain((0..3u32).map(|f| (0..24).map(|t| f * 1000 + t).collect()))
            .collect();
        let original = KvIndex::new(config.clone());
        random_history_hashed(&original, seed, steps, own_seeds);
        let restored = KvIndex::new(config);
        for pod in original.export_all() {
            let r = restored.import_pod(&pod);
            proptest::prop_assert_eq!(r.refused, 0);
        }
        proptest::prop_assert_eq!(matched(&restored, &prompts), matched(&original, &prompts));
        proptest::prop_assert_eq!(restored.table().entries(), original.table().entries());
        for pod in original.pod_names() {
            let (r, o) = (restored.pod_stats(&pod).unwrap(), original.pod_stats(&pod).unwrap());
            proptest::prop_assert_eq!(r.blocks, o.blocks);
            proptest::prop_assert!(r.tier_blocks.iter().zip(&o.tier_blocks).all(|(r, o)| r <= o));
        }
        // Later events resolve engine hashes the same way in both.
        random_history_hashed(&original, seed ^ 0x5555, steps, own_seeds);
        random_history_hashed(&restored, seed ^ 0x5555, steps, own_seeds);
        proptest::prop_assert_eq!(matched(&restored, &prompts), matched(&original, &prompts));
        proptest::prop_assert_eq!(restored.table().entries(), original.table().entries());
        // Under a bound, an import only under-reports.
        let small = KvIndex::new(KvIndexConfig { block_size: 2, shards: 4, max_entries: bound, ..Default::default() });
        for pod in original.export_all() {
            small.import_pod(&pod);
        }
        proptest::prop_assert!(small.table().entries() <= bound);
        for p in &prompts {
            let q = ScoreQuery { model: "m", lora_name: None, cache_salt: None, token_ids: p, pods: None };
            let full = original.score(&q);
            for m in small.score(&q).matches {
                let name = small.pods().name(m.pod);
                let f = full.matches.iter().find(|f| original.pods().name(f.pod) == name);
                proptest::prop_assert!(f.is_some_and(|f| m.matched_blocks <= f.matched_blocks));
            }
        }
        Ok(())
    }

    /// Each engine block of an export as what it means, whatever the order or parent links
    /// that say it: its engine hash, its namespace root, every block key from that root to its
    /// last block, and the pod's tiers of its own blocks. Sorted.
    fn resolved(blocks: &EngineBlocks) -> Vec<(u64, u64, Vec<u64>, Vec<u8>)> {
        let mut chains: Vec<(u64, Vec<u64>)> = Vec::new();
        let mut out = Vec::new();
        for b in blocks.iter() {
            let (root, mut keys) = match b.parent {
                ChainParent::Root(root) => (root, Vec::new()),
                ChainParent::Block(j) => chains[j as usize].clone(),
            };
            keys.extend_from_slice(b.path);
            keys.extend_from_slice(b.keys);
            out.push((b.engine, root, keys.clone(), b.tiers.to_vec()));
            chains.push((root, keys));
        }
        out.sort();
        out
    }

    /// The same, read straight from the tree for the engine blocks the pod's maps name (looked
    /// up one by one, as exports did before they took exceptions in position order): the
    /// reference an export must equal.
    fn resolved_from_tree(index: &KvIndex, pod: &str) -> Vec<(u64, u64, Vec<u64>, Vec<u8>)> {
        let id = index.pods.get(pod).expect("a pod");
        let state = index.states.read().get(&id).cloned().expect("a pod with state");
        let state = state.lock();
        let tree = &index.tree;
        let guard = tree.pin();
        let mut out = Vec::new();
        for (engine, count, last) in state.engine_blocks_by_lookup(tree, &guard) {
            let keys = tree.path_keys(last.pos, &guard);
            let mut first = last.pos;
            while let Some(p) = tree.previous(first, &guard) {
                first = p;
            }
            let root = tree.root_of(first.seg, &guard).expect("a chain hangs off a root");
            let mut tiers = vec![last.tiers];
            let mut at = last.pos;
            for _ in 1..count {
                at = tree.previous(at, &guard).expect("an engine block's blocks are on its chain");
                tiers.push(tree.tiers_at(at, id, &guard));
            }
            tiers.reverse();
            out.push((engine, root, keys, tiers));
        }
        out.sort();
        out
    }

    /// A pod's engine blocks built in one pass (None: it needs the plan) and by plan.
    fn both_ways(index: &KvIndex, pod: &str) -> (Option<EngineBlocks>, EngineBlocks) {
        let id = index.pods.get(pod).expect("a pod");
        let state = index.states.read().get(&id).cloned().expect("a pod with state");
        let state = state.lock();
        let guard = index.tree.pin();
        (index.blocks_in_one_pass(&state, id, &guard), index.blocks_by_plan(&state, id, &guard))
    }

    /// The one-pass export leaves a pod to the plan only when a chain continues a later
    /// position; random histories with segment numbers reused have such pods, and there both
    /// ways still name exactly what the tree holds (`exports_match_the_tree`).
    #[test]
    fn chains_continuing_a_later_segment_are_exported_by_plan() {
        let (mut one_pass, mut by_plan_only) = (0, 0);
        for seed in 1..400u64 {
            let index = KvIndex::new(KvIndexConfig { block_size: 2, shards: 4, ..Default::default() });
            random_history_hashed(&index, seed, 150, seed % 2 == 0);
            for pod in index.pod_names() {
                let expected = resolved_from_tree(&index, &pod);
                let (one, plan) = both_ways(&index, &pod);
                assert_eq!(resolved(&plan), expected, "seed {seed}, pod {pod}: by plan");
                match one {
                    Some(one) => {
                        assert_eq!(resolved(&one), expected, "seed {seed}, pod {pod}: in one pass");
                        one_pass += 1;
                    }
                    None => by_plan_only += 1,
                }
            }
        }
        assert!(
            one_pass > 0 && by_plan_only > 0,
            "both ways exercised: {one_pass} in one pass, {by_plan_only} by plan"
        );
    }

    /// Exports name exactly the engine blocks, chains and tiers the index holds for each pod:
    /// none lost, none invented, none twice (against the reference read block by block from
    /// the tree), over random histories with shared hashes and with a hash seed per pod.
    fn export_matches_the_tree(
        seed: u64,
        steps: usize,
        own_seeds: bool,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let index = KvIndex::new(KvIndexConfig { block_size: 2, shards: 4, ..Default::default() });
        random_history_hashed(&index, seed, steps, own_seeds);
        for pod in index.pod_names() {
            let export = index.export_pod(&pod).expect("a pod with state");
            let blocks = index.pod_stats(&pod).expect("a pod").blocks;
            let expected = resolved_from_tree(&index, &pod);
            proptest::prop_assert_eq!(resolved(&export.blocks), expected.clone(), "pod {}", pod);
            // Both ways of building the columns, whichever the export took.
            let (one_pass, by_plan) = both_ways(&index, &pod);
            if let Some(one_pass) = one_pass {
                proptest::prop_assert_eq!(resolved(&one_pass), expected.clone(), "pod {} in one pass", pod);
            }
            proptest::prop_assert_eq!(resolved(&by_plan), expected, "pod {} by plan", pod);
            let keys: std::collections::HashSet<u64> = export.blocks.iter().flat_map(|b| b.keys.to_vec()).collect();
            proptest::prop_assert!(keys.len() as u64 <= blocks, "pod {}: more blocks exported than held", pod);
        }
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn exports_match_the_tree(seed in 1u64.., steps in 1usize..200, own_seeds: bool) {
            export_matches_the_tree(seed, steps, own_seeds)?;
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        #[test]
        fn random_histories_round_trip(seed in 1u64.., steps in 1usize..120, bound in 8u64..200) {
            round_trip(seed, steps, bound)?;
        }

        #[test]
        fn random_histories_with_a_hash_seed_per_pod_round_trip(seed in 1u64.., steps in 1usize..120, bound in 8u64..200) {
            round_trip_hashed(seed, steps, bound, true)?;
        }
    }

    /// The property's shrunk case (`proptest-regressions/index/export.txt` re-runs
    /// the case proptest first drew, which shrank to this one; this pins the small one). The
    /// restored index lacked one block of p3 (engine blocks of 4 tokens) that the live index
    /// credited: the live index was wrong. p3 held the prompt's first block [2000, 2001] only
    /// through two engine blocks, one in CPU ([2000, 2001, 2402, 2403], removed from CPU at
    /// step 69) and one in GPU ([2000..2004), removed at step 77), so it holds nothing of the
    /// prompt; the live index kept a tier the evicted block alone held (fixed in 5cc0cdd, per-
    /// tier cover counts), and the import, which stores only what the export names, was right.
    #[test]
    fn random_history_6079943832119677690_round_trips_and_never_credits_an_evicted_block() {
        let (seed, steps) = (6079943832119677690, 78);
        let original = KvIndex::new(KvIndexConfig { block_size: 2, shards: 4, ..Default::default() });
        random_history(&original, seed, steps);
        let prompt: Vec<u32> = (0..24).map(|t| 2000 + t).collect();
        let credited = matched(&original, &[prompt]).remove(0);
        assert!(credited.iter().all(|(pod, _)| pod != "p3"), "p3 holds no block of the prompt: {credited:?}");
        round_trip(seed, steps, 8).unwrap();
    }
}
