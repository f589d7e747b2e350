//! Tier names (`medium`) are peer-supplied and the tier table has eight slots: junk names from
//! publishers must never take the slot of a predefined or operator-configured tier. Each source
//! is held to its own allowance, learned names to their share, and every refusal is counted in
//! the apply report (the server's `kvindex_skipped_blocks_total`).

use kvindex::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch};
use kvindex::{ApplyReport, KvIndex, KvIndexConfig, ScoreQuery, SkipReason, TierLimits};

const BS: usize = 4;

fn store(index: &KvIndex, pod: &str, hash: u64, content: u32, medium: &str) -> ApplyReport {
    let event = Event::BlockStored(BlockStored {
        block_hashes: vec![EngineHash::Uint(hash)],
        token_ids: Some(vec![content; BS]),
        block_size: Some(BS as i64),
        medium: Some(medium),
        ..Default::default()
    });
    index.apply(pod, "m", &EventBatch { ts: 0.0, events: vec![event], data_parallel_rank: Some(0) })
}

fn remove(index: &KvIndex, pod: &str, hash: u64, medium: &str) -> ApplyReport {
    let event = Event::BlockRemoved(BlockRemoved {
        block_hashes: vec![EngineHash::Uint(hash)],
        medium: Some(medium),
        ..Default::default()
    });
    index.apply(pod, "m", &EventBatch { ts: 0.0, events: vec![event], data_parallel_rank: Some(0) })
}

fn skipped(report: &ApplyReport, reason: SkipReason) -> u64 {
    report.skipped[reason as usize]
}

/// Which tiers (by name) `pod` holds the block of `content` in, from a score.
fn held_in(index: &KvIndex, pod: &str, content: u32) -> Vec<String> {
    // One token past the block: the engine computes a prompt's last token.
    let tokens = vec![content; BS + 1];
    let r = index.score(&ScoreQuery { model: "m", lora_name: None, cache_salt: None, token_ids: &tokens, pods: None });
    let Some(m) = r.matches.iter().find(|m| index.pods().name(m.pod).as_deref() == Some(pod)) else { return vec![] };
    (0..index.tiers().count())
        .filter(|&t| m.by_tier[t] > 0)
        .map(|t| index.tiers().name(kvindex::index::tiers::TierId(t as u8)))
        .collect()
}

fn index(limits: TierLimits) -> KvIndex {
    KvIndex::new(KvIndexConfig { block_size: BS, shards: 2, tier_limits: limits, ..Default::default() })
}

#[test]
fn one_source_spraying_names_is_stopped_at_its_own_allowance() {
    let index = index(TierLimits::default());
    // GPU + CPU, then two new names fill this pod's allowance of four.
    for (i, medium) in ["GPU", "CPU", "junk0", "junk1"].iter().enumerate() {
        let r = store(&index, "attacker", i as u64 + 1, 10 + i as u32, medium);
        assert_eq!(r.stored_blocks, 1, "{medium}");
    }
    for i in 2..40u32 {
        let r = store(&index, "attacker", 100 + u64::from(i), 100 + i, &format!("junk{i}"));
        assert_eq!((r.stored_blocks, skipped(&r, SkipReason::SourceTierLimit)), (0, 1), "junk{i}");
    }
    assert_eq!(index.tiers().count(), 5, "GPU, CPU, STORAGE and the two names it was allowed");
    assert!(index.tiers().lookup("junk2").is_none(), "a refused name is not learned");
    // Another engine still gets every tier it uses, a new legitimate name included.
    for (i, medium) in ["GPU", "STORAGE", "LOCAL_DISK"].iter().enumerate() {
        let r = store(&index, "engine", 1000 + i as u64, 50, medium);
        assert_eq!(r.stored_blocks, 1, "{medium}");
    }
    let mut tiers = held_in(&index, "engine", 50);
    tiers.sort();
    assert_eq!(tiers, ["GPU", "LOCAL_DISK", "STORAGE"]);
}

#[test]
fn junk_from_many_sources_never_takes_a_predefined_or_configured_tier() {
    // The operator configured DISK and allows no learned names beyond two.
    let index = index(TierLimits { max_per_source: 4, max_learned: 2 });
    index.tiers().set_weight("DISK", 0.5).unwrap();
    for s in 0..20u32 {
        let r = store(&index, &format!("sprayer{s}"), u64::from(s) + 1, s, &format!("junk{s}"));
        let refused = skipped(&r, SkipReason::TooManyTiers);
        assert_eq!(r.stored_blocks + refused, 1);
        assert_eq!(refused, u64::from(s >= 2), "sprayer{s}: only two names may be learned");
    }
    let r = store(&index, "sprayer0", 99, 99, "bad name\n\u{1b}[31m");
    assert_eq!(skipped(&r, SkipReason::BadTierName), 1);
    // The real engine's tiers all have a slot.
    for (i, medium) in ["GPU", "cpu", "STORAGE", "disk"].iter().enumerate() {
        let r = store(&index, "engine", 1000 + i as u64, 77, medium);
        assert_eq!(r.stored_blocks, 1, "{medium}");
    }
    let mut tiers = held_in(&index, "engine", 77);
    tiers.sort();
    assert_eq!(tiers, ["CPU", "DISK", "GPU", "STORAGE"]);
    assert_eq!(index.tiers().weights()[index.tiers().lookup("DISK").unwrap().0 as usize], 0.5);
}

#[test]
fn a_removal_never_learns_a_name() {
    let index = index(TierLimits::default());
    assert_eq!(store(&index, "p", 1, 5, "GPU").stored_blocks, 1);
    let before = index.tiers().count();
    for i in 0..20 {
        let r = remove(&index, "p", 1, &format!("ghost{i}"));
        assert_eq!((r.removed_blocks, r.removed_unknown), (0, 1));
    }
    assert_eq!(index.tiers().count(), before);
    assert_eq!(held_in(&index, "p", 5), ["GPU"], "removing a tier the pod never had leaves the block");
}
