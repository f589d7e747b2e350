//! An SGLang stream's sampled page-hash cross-check: the live side of
//! [`kvindex::sglang::PageChainCheck`]. Matching never depends on it (keys come from tokens);
//! it tells an operator that a source's configured release, event format or page size is not
//! what the engine runs, before anyone wonders why its ids look foreign.
//!
//! Sampling follows vLLM's check (`hash_check_every`: one in that many stores), with one
//! difference SGLang's events force: a store names its parent by the first 8 bytes of the
//! parent's digest, so a store can only be recomputed when the check remembers its parent's
//! full digest, that is, when it checked the parent. A sampled chain is therefore followed:
//! a store continuing a page the check matched is checked too, within a page budget of one in
//! `every` of the stream's pages plus [`BURST_PAGES`] (a chain that outruns it is dropped, and a
//! later sample starts another). The hashing cost stays that of vLLM's check, one page in
//! `every`, give or take the burst.

use kvindex::sglang::{EventFormat, PageChainCheck, SglangRelease};
use kvindex::vllm_hash::Verification;
use kvindex::wire::{Event, EventBatch};

use crate::config::SglangCheckConfig;

/// Checked pages, all mismatched, after which a source is reported as misconfigured.
pub const MISCONFIGURED_AFTER_PAGES: u32 = 8;

/// Pages the check may hash ahead of its one-in-`every` budget, so that a sampled chain is
/// followed through a burst of continuations (some milliseconds of SHA-256). Also the most
/// pages one store may have to be checked: a longer one is not sampled (the cost of one
/// message's check stays bounded).
pub const BURST_PAGES: u64 = 65_536;

/// Page digests one stream's check remembers (for the stores that continue a checked page);
/// past it the memory starts over. About 400 KiB per stream at most.
pub const MAX_REMEMBERED_PER_STREAM: usize = 8192;

/// One SGLang stream's check and its totals.
#[derive(Debug, Clone)]
pub struct SampledPageCheck {
    spec: SglangCheckConfig,
    chain: PageChainCheck,
    stores_seen: u64,
    pages_seen: u64,
    pages_hashed: u64,
    totals: Verification,
    reported: bool,
}

/// What one batch's check found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCheck {
    pub verification: Verification,
    /// This batch made the source's sampled ids all-mismatching past
    /// [`MISCONFIGURED_AFTER_PAGES`] (reported once per stream, until it is cleared).
    pub newly_misconfigured: bool,
}

impl SampledPageCheck {
    /// The check of a source configured as `spec`; `None` when it is off (`every` 0, or a
    /// release before 0.5.6, whose ids are Python's `hash()`).
    pub fn new(spec: SglangCheckConfig) -> Option<SampledPageCheck> {
        Self::is_on(spec).then(|| SampledPageCheck {
            spec,
            chain: PageChainCheck::with_limit(spec.release, spec.format, MAX_REMEMBERED_PER_STREAM),
            stores_seen: 0,
            pages_seen: 0,
            pages_hashed: 0,
            totals: Verification::default(),
            reported: false,
        })
    }

    /// Whether a source configured as `spec` is checked.
    pub fn is_on(spec: SglangCheckConfig) -> bool {
        spec.every > 0 && spec.release.hash_reproducible()
    }

    pub fn spec(&self) -> SglangCheckConfig {
        self.spec
    }

    pub fn release(&self) -> SglangRelease {
        self.spec.release
    }

    pub fn format(&self) -> EventFormat {
        self.spec.format
    }

    /// The stream's totals since it was made (kept across clears, as vLLM's are).
    pub fn totals(&self) -> Verification {
        self.totals
    }

    /// Whether the source's sampled ids all mismatch (past [`MISCONFIGURED_AFTER_PAGES`]).
    pub fn misconfigured(&self) -> bool {
        self.totals.matched == 0 && self.totals.mismatched >= MISCONFIGURED_AFTER_PAGES
    }

    /// Checks the sampled stores of a batch as the engine published it (before any rewrite).
    pub fn check(&mut self, batch: &EventBatch<'_>) -> BatchCheck {
        let mut out = BatchCheck::default();
        let every = u64::from(self.spec.every);
        for event in &batch.events {
            let Event::BlockStored(store) = event else { continue };
            if store.token_ids.is_none() {
                continue; // a tier re-announcement: no tokens to recompute from
            }
            let pages = store.block_hashes.len() as u64;
            self.stores_seen += 1;
            self.pages_seen += pages;
            let sampled = (self.stores_seen - 1).is_multiple_of(every);
            let within_budget = self.pages_hashed <= self.pages_seen / every + BURST_PAGES;
            if !(sampled || self.chain.continues(store)) || !within_budget || pages > BURST_PAGES {
                continue;
            }
            let v = self.chain.check(store);
            if v.checked > 0 {
                self.pages_hashed += u64::from(v.checked);
            }
            out.verification.merge(&v);
        }
        self.totals.merge(&out.verification);
        if !self.reported && self.misconfigured() {
            self.reported = true;
            out.newly_misconfigured = true;
        }
        out
    }

    /// The stream was cleared: no page it remembers is held any more.
    pub fn clear(&mut self) {
        self.chain.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvindex::sglang::namespace::cache_salt_seed;
    use kvindex::sglang::{event_id, page_digests, ChainTokens};
    use kvindex::wire::{BlockStored, EngineHash};

    fn spec(every: u32, release: &str, format: EventFormat) -> SglangCheckConfig {
        SglangCheckConfig { release: release.parse().unwrap(), format, every }
    }

    /// A chain of `stores` stores of `pages` pages of size 1 each, ids as SGLang 0.5.23
    /// (default format) publishes them for requests salted with `salt`.
    fn chain(stores: usize, pages: usize, salt: Option<&'static str>) -> Vec<EventBatch<'static>> {
        let tokens: Vec<u64> = (1..=(stores * pages) as u64).collect();
        let seed = salt.map(cache_salt_seed);
        let digests = page_digests(seed.as_ref(), ChainTokens::Plain(&tokens), 1, false).unwrap();
        let ids: Vec<i64> = digests.iter().map(event_id).collect();
        (0..stores)
            .map(|s| {
                let span = s * pages..(s + 1) * pages;
                let store = BlockStored {
                    block_hashes: ids[span.clone()].iter().map(|&i| EngineHash::Int(i)).collect(),
                    parent_block_hash: (s > 0).then(|| EngineHash::Int(ids[s * pages - 1])),
                    token_ids: Some(tokens[span].iter().map(|&t| t as u32).collect()),
                    block_size: Some(1),
                    cache_salt: salt,
                    ..Default::default()
                };
                EventBatch { ts: 0.0, events: vec![Event::BlockStored(store)], data_parallel_rank: None }
            })
            .collect()
    }

    #[test]
    fn a_sampled_chain_is_followed_within_one_page_in_every() {
        let mut check = SampledPageCheck::new(spec(4, "0.5.23", EventFormat::Default)).unwrap();
        let mut total = Verification::default();
        for b in &chain(40, 4, None) {
            total.merge(&check.check(b).verification);
        }
        assert_eq!((total.matched, total.mismatched), (160, 0), "the root was sampled and the chain followed");
        // A long chain outruns the budget: then only one page in four, plus the burst.
        let mut check = SampledPageCheck::new(spec(4, "0.5.23", EventFormat::Default)).unwrap();
        let mut total = Verification::default();
        let stores = 2 * BURST_PAGES as usize;
        for b in &chain(stores, 1, None) {
            total.merge(&check.check(b).verification);
        }
        assert_eq!(total.mismatched, 0);
        assert!(total.matched >= BURST_PAGES as u32, "{total:?}");
        assert!(u64::from(total.checked) <= stores as u64 / 4 + BURST_PAGES + 1, "one page in four: {total:?}");
        assert!(!check.misconfigured());
        assert_eq!(check.totals(), total);
    }

    #[test]
    fn a_wrong_format_mismatches_and_is_reported_once() {
        // Dynamo's format namespaces every salted id: the engine published default-format ids.
        let mut check = SampledPageCheck::new(spec(1, "0.5.23", EventFormat::Dynamo)).unwrap();
        let batches = chain(6, 4, Some("tenant"));
        let reports: Vec<BatchCheck> = batches.iter().map(|b| check.check(b)).collect();
        assert_eq!(reports[0].verification.mismatched, 4);
        // Mismatched pages are not remembered: their continuations are unverifiable.
        assert_eq!(reports[1].verification.unverifiable, 4);
        assert_eq!(reports.iter().filter(|r| r.newly_misconfigured).count(), 0, "4 pages: not yet");
        let mut more = chain(3, 4, Some("tenant"));
        for b in more.iter_mut() {
            // More roots (each store its own chain) add mismatches.
            if let Event::BlockStored(s) = &mut b.events[0] {
                s.parent_block_hash = None;
            }
        }
        let flagged: Vec<bool> = more.iter().map(|b| check.check(b).newly_misconfigured).collect();
        assert_eq!(flagged, [true, false, false], "reported once, when it first holds");
        assert!(check.misconfigured());
    }

    #[test]
    fn unsalted_ids_are_alike_from_0_5_6_and_salted_ones_tell_releases_apart() {
        for (release, format) in [("0.5.6", EventFormat::Default), ("0.5.23", EventFormat::Dynamo)] {
            let mut check = SampledPageCheck::new(spec(1, release, format)).unwrap();
            let v = check.check(&chain(1, 4, None)[0]).verification;
            assert_eq!(v.matched, 4, "{release} {format:?}");
        }
        let mut before_salts = SampledPageCheck::new(spec(1, "0.5.18", EventFormat::Default)).unwrap();
        assert_eq!(before_salts.check(&chain(1, 4, Some("t"))[0]).verification.mismatched, 4);
        let mut salted = SampledPageCheck::new(spec(1, "0.5.19", EventFormat::Default)).unwrap();
        assert_eq!(salted.check(&chain(1, 4, Some("t"))[0]).verification.matched, 4);
    }

    #[test]
    fn off_before_0_5_6_and_when_every_is_0() {
        assert!(SampledPageCheck::new(spec(16, "0.5.5", EventFormat::Default)).is_none());
        assert!(SampledPageCheck::new(spec(0, "0.5.23", EventFormat::Default)).is_none());
        assert!(SampledPageCheck::new(spec(16, "0.5.6", EventFormat::Default)).is_some());
    }
}
