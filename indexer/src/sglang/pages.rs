//! Which SGLang stores may credit blocks. SGLang serves a prefix in whole pages only
//! (`match_prefix` page-aligns the key), yet publishes a node's partial last page (its
//! `block_size` is the page's length); it publishes EAGLE bigram pages, whose key depends on
//! the token after the page. Neither may ever credit a block, so both are kept out of the
//! index and counted (`partial_page`, `unkeyable_tokens`). Pages smaller than a canonical
//! block (page size 1, SGLang's default) are whole pages here; [`super::small_pages`] then
//! rewrites them into canonical blocks.

use crate::wire::{BlockStored, Event, EventBatch};

/// What a source's configuration says about its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PageRules {
    /// SGLang's `--page-size` for this source. Unknown: only stores of exactly the canonical
    /// block size are taken as whole pages (a partial page of a larger page size could not be
    /// told apart otherwise).
    pub page_size: Option<usize>,
}

/// What a store may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageVerdict {
    /// Whole pages of plain token ids: keyed as usual.
    Credit,
    /// A partial last page: never served, never credited.
    PartialPage,
    /// Ids no prompt can name (bigram pairs, ids past u32).
    Unkeyable,
}

impl PageRules {
    /// The verdict on one store, for an index whose canonical block is `block_size` tokens.
    pub fn verdict(&self, store: &BlockStored<'_>, block_size: usize) -> PageVerdict {
        if store.odd_token_ids.is_some() {
            return PageVerdict::Unkeyable;
        }
        let page = self.page_size.unwrap_or(block_size);
        let whole = store.block_size.and_then(|b| usize::try_from(b).ok()) == Some(page)
            && store.token_ids.as_ref().is_some_and(|t| t.len() == page * store.block_hashes.len());
        if whole {
            PageVerdict::Credit
        } else {
            PageVerdict::PartialPage
        }
    }

    /// Drops the stores that may not credit anything from `batch`; returns the engine blocks
    /// dropped per verdict (`(partial_page, unkeyable)`), for the caller to count.
    pub fn keep_servable(&self, batch: &mut EventBatch<'_>, block_size: usize) -> (u64, u64) {
        let (mut partial, mut unkeyable) = (0u64, 0u64);
        batch.events.retain(|event| {
            let Event::BlockStored(store) = event else { return true };
            if store.token_ids.is_none() && store.odd_token_ids.is_none() {
                // A tier re-announcement (no tokens): it names blocks already keyed.
                return true;
            }
            match self.verdict(store, block_size) {
                PageVerdict::Credit => true,
                PageVerdict::PartialPage => {
                    partial += store.block_hashes.len() as u64;
                    false
                }
                PageVerdict::Unkeyable => {
                    unkeyable += store.block_hashes.len() as u64;
                    false
                }
            }
        });
        (partial, unkeyable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{EngineHash, OddTokens};

    fn store(hashes: usize, block_size: i64, tokens: usize) -> BlockStored<'static> {
        BlockStored {
            block_hashes: (0..hashes as i64).map(EngineHash::Int).collect(),
            token_ids: Some((0..tokens as u32).collect()),
            block_size: Some(block_size),
            ..Default::default()
        }
    }

    #[test]
    fn only_whole_pages_of_the_configured_size_credit() {
        let p64 = PageRules { page_size: Some(64) };
        assert_eq!(p64.verdict(&store(2, 64, 128), 16), PageVerdict::Credit);
        // A 48-token last page of a 64-token page size: a multiple of the canonical block,
        // still never served.
        assert_eq!(p64.verdict(&store(1, 48, 48), 16), PageVerdict::PartialPage);
        let unknown = PageRules::default();
        assert_eq!(unknown.verdict(&store(1, 16, 16), 16), PageVerdict::Credit);
        assert_eq!(unknown.verdict(&store(1, 48, 48), 16), PageVerdict::PartialPage);
        assert_eq!(unknown.verdict(&store(1, 7, 7), 16), PageVerdict::PartialPage);
        let mut bigram = store(1, 16, 0);
        bigram.token_ids = None;
        bigram.odd_token_ids = Some(OddTokens::Pairs(vec![[1, 2]; 16]));
        assert_eq!(unknown.verdict(&bigram, 16), PageVerdict::Unkeyable);
    }

    #[test]
    fn keep_servable_drops_and_counts() {
        let mut batch = EventBatch {
            ts: 0.0,
            events: vec![
                Event::BlockStored(store(2, 16, 32)),
                Event::BlockStored(store(1, 5, 5)),
                Event::AllBlocksCleared { other: vec![] },
            ],
            data_parallel_rank: Some(0),
        };
        assert_eq!(PageRules { page_size: Some(16) }.keep_servable(&mut batch, 16), (1, 0));
        assert_eq!(batch.events.len(), 2);
    }
}
