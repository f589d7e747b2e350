//! The index's logical content, out and back in: what snapshots persist for warm restarts.
//!
//! A pod's residencies are exported as *engine blocks*: the scoped engine hash a pod's events
//! name the block by (0 for a block held without one), and its canonical prefix keys in chain
//! order with the tiers the pod holds each in. That is what the events established, independent
//! of how the index lays it out in memory, so a snapshot written by one layout loads into
//! another. Keys chain (each key hashes its parent's), so the parent links are in the keys;
//! token ids are never part of it.
//!
//! Importing is replaying that content through the same writer the events use: the entry bound
//! still holds (a refused residency is counted and only under-reports), and engine-hash
//! resolution (for later `parent_block_hash` and `BlockRemoved`) comes back as it was.

use roaring::RoaringBitmap;

use super::table::SlotId;
use super::tiers::{TierId, MAX_TIERS};
use super::KvIndex;
use crate::keys::PrefixKey;

/// One pod's residencies, as events established them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodExport {
    pub pod: String,
    pub model: String,
    /// Tier names by bit position of the masks in `blocks`.
    pub tiers: Vec<String>,
    pub blocks: Vec<BlockExport>,
}

/// One engine block: its scoped engine hash (0 = held without one) and its canonical blocks in
/// chain order, each with the pod's tier mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockExport {
    pub engine: u64,
    pub keys: Vec<(PrefixKey, u8)>,
}

/// What an import restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImportReport {
    pub blocks: u64,
    /// Engine blocks the entry bound (or an unnameable tier) refused, whole or in part.
    pub refused: u64,
}

impl PodExport {
    /// Canonical (block, tier) residencies, counted once per key and tier bit.
    pub fn residencies(&self) -> u64 {
        self.blocks.iter().flat_map(|b| &b.keys).map(|(_, t)| u64::from(t.count_ones())).sum()
    }
}

impl KvIndex {
    /// The residencies of `pod`, or `None` if it has no ingest state. Holds the pod's lock and
    /// the table's writer while it runs: the export is one point in the pod's event order.
    pub fn export_pod(&self, pod: &str) -> Option<PodExport> {
        let id = self.pods.get(pod)?;
        let state = self.states.read().get(&id).cloned()?;
        let state = state.lock();
        let w = self.table.writer();
        let (slots, exceptions, leading) = state.residency_parts();
        let entry = |slot: SlotId| w.key_of(slot).map(|key| (key, self.table.tiers_of(key, id)));
        let mut covered = RoaringBitmap::new();
        let mut blocks = Vec::new();
        let mut engine_block = |engine: u64, last: SlotId| {
            let mut keys = Vec::new();
            for &slot in leading.get(&engine).into_iter().flatten().chain(std::iter::once(&last)) {
                if let Some(e) = entry(slot) {
                    covered.insert(slot.0);
                    keys.push(e);
                }
            }
            if !keys.is_empty() {
                blocks.push(BlockExport { engine, keys });
            }
        };
        for slot in slots.iter().map(SlotId) {
            let engine = w.engine_of(slot);
            if engine != 0 && !exceptions.contains_key(&engine) {
                engine_block(engine, slot);
            }
        }
        for (&engine, &slot) in exceptions {
            engine_block(engine, slot);
        }
        for slot in slots.iter().filter(|s| !covered.contains(*s)).map(SlotId) {
            if let Some(e) = entry(slot) {
                blocks.push(BlockExport { engine: 0, keys: vec![e] });
            }
        }
        let tiers = (0..self.tiers.count() as u8).map(|t| self.tiers.name(TierId(t))).collect();
        Some(PodExport { pod: pod.to_string(), model: state.model().to_string(), tiers, blocks })
    }

    /// Every pod's residencies, by pod name.
    pub fn export_all(&self) -> Vec<PodExport> {
        self.pod_names().iter().filter_map(|p| self.export_pod(p)).collect()
    }

    /// Replaces what `export.pod` holds with `export`'s residencies.
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
        let mut state = state.lock();
        let mut w = self.table.writer();
        let mut keys = Vec::new();
        for block in &export.blocks {
            keys.clear();
            let mut lost_tier = false;
            for &(key, mask) in &block.keys {
                let mut tiers = 0;
                for (bit, to) in remap.iter().enumerate() {
                    if mask & (1 << bit) != 0 {
                        match to {
                            Some(to) => tiers |= to,
                            None => lost_tier = true,
                        }
                    }
                }
                lost_tier |= mask & !known != 0;
                keys.push((key, tiers));
            }
            if state.restore_block(&mut w, block.engine, &keys) && !lost_tier {
                report.blocks += 1;
            } else {
                report.refused += 1;
            }
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
                let names: Vec<String> = r
                    .matches
                    .iter()
                    .map(|m| format!("{}:{}:{}", index.pods().name(m.pod).unwrap(), m.matched_blocks, m.weighted_score))
                    .collect();
                format!("{}/{}", r.total_blocks, names.join(","))
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
    }

    /// Events after the restore that only resolve if engine hashes came back.
    fn later(index: &KvIndex) {
        let t = |a: u32, n: u32| (a..a + n).collect::<Vec<u32>>();
        index.apply("a", "m", &batch(vec![stored(&[4], Some(3), t(12, 4), 4, None), removed(&[1], None)]));
        index.apply("b", "m", &batch(vec![stored(&[104], Some(102), t(4, 2), 2, None)]));
        index.apply("a", "m", &batch(vec![removed(&[2], Some("CPU"))]));
        index.apply("c", "m", &batch(vec![removed(&[1], Some("STORAGE"))]));
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
        for pod in ["a", "b", "c"] {
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
}
