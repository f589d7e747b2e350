//! A stream's engine rules: what a decoded batch must go through, by its engine's family,
//! before it reaches the index. vLLM's and TensorRT-LLM's batches key as they come; SGLang's
//! keep only the pages SGLang would serve (`PageRules`: a partial last page and unkeyable
//! pages never credit) and have pages smaller than a canonical block rewritten into canonical
//! blocks (`SmallPages`, whose chain memory is per stream and starts over on every clear), and
//! their published page ids sampled against SGLang's own page hash first ([`SampledPageCheck`],
//! as published, before any rewrite; it never changes what is keyed).
//! Both drivers of the stream table (the live worker and `kvindex replay`) apply every batch
//! through the stream's rules, so they key SGLang the same way.

use kvindex::index::SkipReason;
use kvindex::sglang::{PageRules, SmallPages};
use kvindex::vllm_hash::Verification;
use kvindex::wire::{Engine, EventBatch};
use kvindex::{ApplyReport, KvIndex};

use super::sglang_check::SampledPageCheck;
use crate::config::SglangCheckConfig;

/// SGLang's default `--page-size`: a source that names no page size is taken to use it.
pub const SGLANG_DEFAULT_PAGE_SIZE: usize = 1;

/// One stream's engine rules (and, for SGLang, its small-page chain memory).
#[derive(Debug, Clone)]
pub struct EngineRules {
    engine: Engine,
    page_size: Option<usize>,
    block_size: usize,
    /// SGLang only.
    small_pages: Option<SmallPages>,
    /// SGLang only, when the check is on for the source.
    page_check: Option<SampledPageCheck>,
}

/// Engine blocks the rules kept out of the index, by the index's skip reasons.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RulesReport {
    pub partial_page: u64,
    pub unkeyable_tokens: u64,
    pub parent_unknown: u64,
    pub block_size_mismatch: u64,
    /// SGLang's sampled page-hash cross-check of the batch (counted as vLLM's check is).
    pub hash_check: Verification,
    /// The batch made the source's sampled ids all-mismatching (reported once).
    pub newly_misconfigured: bool,
}

impl RulesReport {
    /// The counts, as `(reason, blocks)` of the index's `kvindex_skipped_blocks_total`.
    pub fn skipped(&self) -> [(SkipReason, u64); 4] {
        [
            (SkipReason::PartialPage, self.partial_page),
            (SkipReason::UnkeyableTokens, self.unkeyable_tokens),
            (SkipReason::ParentUnknown, self.parent_unknown),
            (SkipReason::BlockSizeMismatch, self.block_size_mismatch),
        ]
    }
}

impl EngineRules {
    /// `page_size`: the source's page size as configured (SGLang; none: SGLang's default).
    /// `block_size`: the index's canonical block. `check`: SGLang's page-hash cross-check for
    /// this source (none: off).
    pub fn new(
        engine: Engine,
        page_size: Option<usize>,
        check: Option<SglangCheckConfig>,
        block_size: usize,
    ) -> EngineRules {
        let sglang = engine == Engine::Sglang;
        let small_pages = sglang.then(|| SmallPages::new(block_size));
        let page_check = check.filter(|_| sglang).and_then(SampledPageCheck::new);
        EngineRules { engine, page_size, block_size, small_pages, page_check }
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Whether these are the rules for `engine` with `page_size` (else the stream's source was
    /// re-registered with other ones).
    pub fn is_for(&self, engine: Engine, page_size: Option<usize>) -> bool {
        self.engine == engine && self.page_size == page_size
    }

    /// Follows a re-registration's SGLang check (another release or format, learned later by
    /// discovery, say): a new check, keeping the keying rules' chain memory, which does not
    /// depend on it.
    pub fn follow_check(&mut self, check: Option<SglangCheckConfig>) {
        let wanted = check.filter(|&c| self.engine == Engine::Sglang && SampledPageCheck::is_on(c));
        if self.page_check.as_ref().map(|c| c.spec()) != wanted {
            self.page_check = wanted.and_then(SampledPageCheck::new);
        }
    }

    /// SGLang's page-hash cross-check of this stream, when it is on.
    pub fn page_check(&self) -> Option<&SampledPageCheck> {
        self.page_check.as_ref()
    }

    /// The batch as the index must take it, and what was kept out.
    pub fn prepare<'a>(&mut self, batch: &EventBatch<'a>) -> (Option<EventBatch<'a>>, RulesReport) {
        let mut report = RulesReport::default();
        let Some(small_pages) = self.small_pages.as_mut() else { return (None, report) };
        if let Some(check) = self.page_check.as_mut() {
            let checked = check.check(batch);
            (report.hash_check, report.newly_misconfigured) = (checked.verification, checked.newly_misconfigured);
        }
        let rules = PageRules { page_size: Some(self.page_size.unwrap_or(SGLANG_DEFAULT_PAGE_SIZE)) };
        let mut servable = batch.clone();
        let unplaceable = kvindex::sglang::builtin_ids::drop_unplaceable(&mut servable);
        (report.partial_page, report.unkeyable_tokens) = rules.keep_servable(&mut servable, self.block_size);
        let (rewritten, small) = small_pages.rewrite(&servable);
        report.parent_unknown = small.parent_unknown + unplaceable;
        report.block_size_mismatch = small.block_size_mismatch;
        (Some(rewritten), report)
    }

    /// Applies `batch` to `pod`'s entries in `index` through these rules: prepared first
    /// ([`prepare`](Self::prepare)), then keyed as its engine's family is: vLLM's ids with the
    /// index's sampled hash check, the others' (not vLLM's recipe) without it. What the index
    /// did, and what the rules kept out.
    pub fn apply(
        &mut self,
        index: &KvIndex,
        pod: &str,
        model: &str,
        batch: &EventBatch<'_>,
    ) -> (ApplyReport, RulesReport) {
        let (prepared, kept_out) = self.prepare(batch);
        let batch = prepared.as_ref().unwrap_or(batch);
        let applied = match self.engine {
            Engine::Vllm => index.apply(pod, model, batch),
            Engine::Sglang | Engine::Trtllm => index.apply_not_vllm(pod, model, batch),
        };
        (applied, kept_out)
    }

    /// The stream's pod was cleared: no chain it remembers is held any more.
    pub fn clear(&mut self) {
        if let Some(small_pages) = self.small_pages.as_mut() {
            small_pages.clear();
        }
        if let Some(check) = self.page_check.as_mut() {
            check.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvindex::sglang::{event_id, page_digests, ChainTokens, EventFormat};
    use kvindex::wire::{BlockStored, EngineHash, Event};

    fn spec(release: &str) -> SglangCheckConfig {
        SglangCheckConfig { release: release.parse().unwrap(), format: EventFormat::Default, every: 1 }
    }

    /// Pages `from..to` (one token each) of one chain as SGLang 0.5.6+ publishes them: 32 pages,
    /// then their 16-page continuation.
    fn stored(from: usize, to: usize) -> EventBatch<'static> {
        let tokens: Vec<u64> = (1..=48).collect();
        let ids: Vec<i64> =
            page_digests(None, ChainTokens::Plain(&tokens), 1, false).unwrap().iter().map(event_id).collect();
        let store = BlockStored {
            block_hashes: ids[from..to].iter().map(|&i| EngineHash::Int(i)).collect(),
            parent_block_hash: from.checked_sub(1).map(|p| EngineHash::Int(ids[p])),
            token_ids: Some(tokens[from..to].iter().map(|&t| t as u32).collect()),
            block_size: Some(1),
            ..Default::default()
        };
        EventBatch { ts: 0.0, events: vec![Event::BlockStored(store)], data_parallel_rank: None }
    }

    fn batch() -> EventBatch<'static> {
        stored(0, 32)
    }

    #[test]
    fn the_check_reads_the_batch_as_published_and_keys_nothing_differently() {
        let mut checked = EngineRules::new(Engine::Sglang, None, Some(spec("0.5.23")), 16);
        let mut unchecked = EngineRules::new(Engine::Sglang, None, None, 16);
        let (with, report) = checked.prepare(&batch());
        let (without, plain) = unchecked.prepare(&batch());
        assert_eq!(with, without, "matching never depends on the check");
        assert_eq!((report.hash_check.checked, report.hash_check.matched), (32, 32), "the 32 pages as published");
        assert_eq!(plain.hash_check, Verification::default());
        // Only SGLang streams are checked, and only releases whose ids can be recomputed.
        assert!(EngineRules::new(Engine::Vllm, None, Some(spec("0.5.23")), 16).page_check().is_none());
        assert!(EngineRules::new(Engine::Sglang, None, Some(spec("0.5.5")), 16).page_check().is_none());
        // A re-registration with another release makes a new check, and keeps the rest.
        checked.follow_check(Some(spec("0.5.19")));
        assert_eq!(checked.page_check().map(|c| c.release().to_string()), Some("0.5.19".into()));
        assert_eq!(checked.page_check().unwrap().totals(), Verification::default());
        unchecked.follow_check(Some(spec("0.5.5")));
        assert!(unchecked.page_check().is_none(), "off either way");
        // The small-page chain memory survives it: the continuation still finds its parent.
        let (continued, report) = checked.prepare(&stored(32, 48));
        assert_eq!((report.parent_unknown, report.hash_check.checked), (0, 0), "{report:?}");
        let Some(Event::BlockStored(block)) = continued.as_ref().map(|b| &b.events[0]) else { panic!("{continued:?}") };
        assert_eq!(block.block_hashes.len(), 1, "the third canonical block");
    }
}
