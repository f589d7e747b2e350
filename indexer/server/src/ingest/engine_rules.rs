//! A stream's engine rules: what a decoded batch must go through, by its engine's family,
//! before it reaches the index. vLLM's and TensorRT-LLM's batches key as they come; SGLang's
//! keep only the pages SGLang would serve (`PageRules`: a partial last page and unkeyable
//! pages never credit) and have pages smaller than a canonical block rewritten into canonical
//! blocks (`SmallPages`, whose chain memory is per stream and starts over on every clear).
//! Both drivers of the stream table (the live worker and `kvindex replay`) apply every batch
//! through the stream's rules, so they key SGLang the same way.

use kvindex::index::SkipReason;
use kvindex::sglang::{PageRules, SmallPages};
use kvindex::wire::{Engine, EventBatch};

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
}

/// Engine blocks the rules kept out of the index, by the index's skip reasons.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RulesReport {
    pub partial_page: u64,
    pub unkeyable_tokens: u64,
    pub parent_unknown: u64,
    pub block_size_mismatch: u64,
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
    /// `block_size`: the index's canonical block.
    pub fn new(engine: Engine, page_size: Option<usize>, block_size: usize) -> EngineRules {
        let small_pages = (engine == Engine::Sglang).then(|| SmallPages::new(block_size));
        EngineRules { engine, page_size, block_size, small_pages }
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Whether these are the rules for `engine` with `page_size` (else the stream's source
    /// was re-registered with other ones).
    pub fn is_for(&self, engine: Engine, page_size: Option<usize>) -> bool {
        self.engine == engine && self.page_size == page_size
    }

    /// The batch as the index must take it, and what was kept out.
    pub fn prepare<'a>(&mut self, batch: &EventBatch<'a>) -> (Option<EventBatch<'a>>, RulesReport) {
        let mut report = RulesReport::default();
        let Some(small_pages) = self.small_pages.as_mut() else { return (None, report) };
        let rules = PageRules { page_size: Some(self.page_size.unwrap_or(SGLANG_DEFAULT_PAGE_SIZE)) };
        let mut servable = batch.clone();
        let unplaceable = kvindex::sglang::builtin_ids::drop_unplaceable(&mut servable);
        (report.partial_page, report.unkeyable_tokens) = rules.keep_servable(&mut servable, self.block_size);
        let (rewritten, small) = small_pages.rewrite(&servable);
        report.parent_unknown = small.parent_unknown + unplaceable;
        report.block_size_mismatch = small.block_size_mismatch;
        (Some(rewritten), report)
    }

    /// The stream's pod was cleared: no chain it remembers is held any more.
    pub fn clear(&mut self) {
        if let Some(small_pages) = self.small_pages.as_mut() {
            small_pages.clear();
        }
    }
}
