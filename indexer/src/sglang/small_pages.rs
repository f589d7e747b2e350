//! SGLang pages smaller than kvindex's canonical block (page size 1, SGLang's default): stores
//! rewritten into whole canonical blocks, so they key like any engine's.
//!
//! A canonical block of `B` tokens is held exactly when the engine holds all its pages, which
//! it does once it holds the block's last page (the radix cache holds a node's path). So each
//! canonical block is named by the id of its **last page**: a store emits the blocks it
//! completes, named so, with the previous block's name as parent; the pages after the last
//! whole block (the tail) are remembered at the chain's end for the store that continues it.
//! Removals need no rewrite: SGLang removes a node's pages, and a block whose last page goes
//! is named in the removal; a block that ended before the node survives, as it should.
//!
//! Nothing is guessed: a store continuing a page that ended no store (a node split since) has
//! no known position in its blocks and is dropped (counted by the caller), as is a store whose
//! page size does not divide `B`. Remembered ends are bounded; past the bound they start over
//! (later continuations under-report).

use rustc_hash::FxHashMap;

use crate::wire::{BlockStored, EngineHash, Event, EventBatch};

/// Chain ends remembered per source; past it the memory starts over.
pub const MAX_CHAIN_ENDS: usize = 1 << 20;

/// Where a chain of small pages stands at one of its ends.
#[derive(Debug, Clone, Default)]
struct ChainEnd {
    /// Tokens after the last whole canonical block (fewer than `B`).
    tail: Vec<u32>,
    /// The name of the last whole canonical block (`None`: the chain has none yet).
    last_block: Option<u64>,
}

/// One source's small-page state.
#[derive(Debug, Clone)]
pub struct SmallPages {
    block_size: usize,
    ends: FxHashMap<u64, ChainEnd>,
}

/// What a rewrite dropped, in engine pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmallPagesReport {
    /// Continuations of a page that ended no remembered store.
    pub parent_unknown: u64,
    /// Pages whose size does not divide the canonical block.
    pub block_size_mismatch: u64,
}

impl SmallPages {
    /// For an index whose canonical block is `block_size` tokens.
    pub fn new(block_size: usize) -> Self {
        SmallPages { block_size: block_size.max(1), ends: FxHashMap::default() }
    }

    /// Whether a store's pages are smaller than a canonical block (and so need this rewrite).
    pub fn applies_to(&self, store: &BlockStored<'_>) -> bool {
        store.block_size.is_some_and(|p| p > 0 && (p as usize) < self.block_size)
    }

    /// `batch` with its small-page stores rewritten into canonical blocks.
    pub fn rewrite<'a>(&mut self, batch: &EventBatch<'a>) -> (EventBatch<'a>, SmallPagesReport) {
        let mut report = SmallPagesReport::default();
        let mut events = Vec::with_capacity(batch.events.len());
        for event in &batch.events {
            match event {
                Event::BlockStored(s) if self.applies_to(s) => {
                    if let Some(rewritten) = self.store(s, &mut report) {
                        events.push(Event::BlockStored(rewritten));
                    }
                }
                Event::BlockRemoved(r) => {
                    for h in &r.block_hashes {
                        self.ends.remove(&h.key());
                    }
                    events.push(event.clone());
                }
                Event::AllBlocksCleared { .. } => {
                    self.ends.clear();
                    events.push(event.clone());
                }
                other => events.push(other.clone()),
            }
        }
        (EventBatch { ts: batch.ts, events, data_parallel_rank: batch.data_parallel_rank }, report)
    }

    /// Forgets every chain (the source's pod was cleared).
    pub fn clear(&mut self) {
        self.ends.clear();
    }

    fn store<'a>(&mut self, s: &BlockStored<'a>, report: &mut SmallPagesReport) -> Option<BlockStored<'a>> {
        let pages = s.block_hashes.len() as u64;
        let page = s.block_size.and_then(|p| usize::try_from(p).ok()).unwrap_or(0);
        let tokens = s.token_ids.as_deref().unwrap_or(&[]);
        if page == 0 || !self.block_size.is_multiple_of(page) || tokens.len() != s.block_hashes.len() * page {
            report.block_size_mismatch += pages;
            return None;
        }
        let mut end = match &s.parent_block_hash {
            None => ChainEnd::default(),
            Some(parent) => match self.ends.get(&parent.key()) {
                Some(end) => end.clone(),
                None => {
                    report.parent_unknown += pages;
                    return None;
                }
            },
        };
        let first_parent = end.last_block;
        let mut names = Vec::new();
        let mut whole = Vec::new();
        for (hash, page_tokens) in s.block_hashes.iter().zip(tokens.chunks(page)) {
            end.tail.extend_from_slice(page_tokens);
            if end.tail.len() == self.block_size {
                names.push(*hash);
                whole.append(&mut end.tail);
                end.last_block = Some(hash.key());
            }
        }
        if let Some(last) = s.block_hashes.last() {
            if self.ends.len() >= MAX_CHAIN_ENDS {
                self.ends.clear();
            }
            self.ends.insert(last.key(), end);
        }
        // SGLang repeats a request's salt on every store, so a chain's first whole block
        // (parent `None`) carries it even when an earlier store held only its first pages.
        (!names.is_empty()).then(|| BlockStored {
            block_hashes: names,
            parent_block_hash: first_parent.map(EngineHash::Uint),
            token_ids: Some(whole),
            block_size: Some(self.block_size as i64),
            ..s.clone()
        })
    }
}
