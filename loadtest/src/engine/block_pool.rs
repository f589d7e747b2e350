//! The paged KV cache with prefix caching, as vLLM v1's `BlockPool`.
//!
//! Blocks are reference counted by the running requests that hold them. A block whose count
//! drops to zero goes to the back of the [`FreeQueue`] but keeps its hash, so a later request
//! can hit it; allocation takes blocks from the front and only then evicts their hashes,
//! emitting one `BlockRemoved` per hash. Block 0 is vLLM's reserved null block and is never
//! handed out, so a pool of N blocks offers N − 1.
//!
//! As in vLLM, two blocks may carry the same hash (a block-aligned prompt whose last block is
//! recomputed because of the `prompt_len − 1` rule): both are published as stored, and evicting
//! either publishes a removal even though the other copy stays. That is vLLM's behaviour, so
//! the simulator keeps it.

use std::collections::HashMap;

use kvindex::vllm_hash::InternalHash;

use super::block_id::BlockId;
use super::event::KvEvent;
use super::free_queue::FreeQueue;

const NULL_BLOCK: BlockId = 0;

#[derive(Debug, Clone, Copy)]
struct CachedHash {
    internal: InternalHash,
    published: u64,
}

#[derive(Debug, Clone, Default)]
struct Block {
    ref_cnt: u32,
    hash: Option<CachedHash>,
}

/// A block's full hash and the value vLLM publishes for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHash {
    pub internal: InternalHash,
    pub published: u64,
}

#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<Block>,
    free: FreeQueue,
    cached: HashMap<InternalHash, Vec<BlockId>>,
    events: Vec<KvEvent>,
    block_size: usize,
}

impl BlockPool {
    /// `num_blocks` includes the null block; at least 2 are needed to hold anything.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        let num_blocks = num_blocks.clamp(2, u32::MAX as usize);
        let mut free = FreeQueue::with_capacity(num_blocks);
        for block in 1..num_blocks as BlockId {
            free.push_back(block);
        }
        let mut blocks = vec![Block::default(); num_blocks];
        blocks[NULL_BLOCK as usize].ref_cnt = 1;
        BlockPool { blocks, free, cached: HashMap::new(), events: Vec::new(), block_size }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks a request can ever use (all but the null block).
    pub fn usable_blocks(&self) -> usize {
        self.blocks.len() - 1
    }

    /// Free blocks, cached-but-evictable ones included (vLLM counts them as free).
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// `vllm:kv_cache_usage_perc`: the fraction of usable blocks held by running requests.
    pub fn usage(&self) -> f64 {
        1.0 - self.free.len() as f64 / self.usable_blocks() as f64
    }

    /// Distinct hashes currently cached (held or evictable).
    pub fn cached_hashes(&self) -> usize {
        self.cached.len()
    }

    /// A block holding this hash, if any (`get_cached_block`).
    pub fn lookup(&self, hash: &InternalHash) -> Option<BlockId> {
        self.cached.get(hash).and_then(|blocks| blocks.first().copied())
    }

    fn ref_cnt(&self, block: BlockId) -> u32 {
        self.blocks.get(block as usize).map_or(0, |b| b.ref_cnt)
    }

    /// How many of `blocks` are evictable now (they stop counting as free once touched).
    pub fn count_evictable(&self, blocks: &[BlockId]) -> usize {
        blocks.iter().filter(|&&block| self.ref_cnt(block) == 0).count()
    }

    /// Takes a reference on cache hits, pulling evictable ones out of the free queue.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &block in blocks {
            if self.ref_cnt(block) == 0 {
                self.free.remove(block);
            }
            if let Some(entry) = self.blocks.get_mut(block as usize) {
                entry.ref_cnt += 1;
            }
        }
    }

    /// `get_new_blocks`: the `count` least recently freed blocks, their old hashes evicted.
    pub fn allocate(&mut self, count: usize) -> Option<Vec<BlockId>> {
        if count > self.free.len() {
            return None;
        }
        let mut taken = Vec::with_capacity(count);
        for _ in 0..count {
            let block = self.free.pop_front()?;
            self.evict(block);
            self.blocks[block as usize].ref_cnt = 1;
            taken.push(block);
        }
        Some(taken)
    }

    fn evict(&mut self, block: BlockId) {
        let Some(hash) = self.blocks[block as usize].hash.take() else {
            return;
        };
        if let Some(holders) = self.cached.get_mut(&hash.internal) {
            holders.retain(|&b| b != block);
            if holders.is_empty() {
                self.cached.remove(&hash.internal);
            }
        }
        self.events.push(KvEvent::BlockRemoved { block_hashes: vec![hash.published] });
    }

    /// Drops one reference per block, in the order given; blocks reaching zero join the back
    /// of the free queue. Callers pass a request's blocks tail first, as vLLM does, so that a
    /// sequence's last blocks are evicted before its (more shareable) first ones.
    pub fn free(&mut self, blocks_tail_first: impl IntoIterator<Item = BlockId>) {
        for block in blocks_tail_first {
            let Some(entry) = self.blocks.get_mut(block as usize) else {
                continue;
            };
            if block == NULL_BLOCK || entry.ref_cnt == 0 {
                continue;
            }
            entry.ref_cnt -= 1;
            if entry.ref_cnt == 0 {
                self.free.push_back(block);
            }
        }
    }

    /// `cache_full_blocks`: blocks `from..to` of a request just became full; they get their
    /// hashes and one `BlockStored` covers them all, chained to block `from − 1`.
    pub fn cache_full_blocks(
        &mut self,
        request_blocks: &[BlockId],
        hashes: &[BlockHash],
        tokens: &[u32],
        from: usize,
        to: usize,
    ) {
        let bs = self.block_size;
        let to = to.min(request_blocks.len()).min(hashes.len()).min(tokens.len() / bs.max(1));
        if from >= to {
            return;
        }
        let mut published = Vec::with_capacity(to - from);
        for index in from..to {
            let block = request_blocks[index];
            let hash = hashes[index];
            let entry = &mut self.blocks[block as usize];
            if entry.hash.is_none() {
                entry.hash = Some(CachedHash { internal: hash.internal, published: hash.published });
                self.cached.entry(hash.internal).or_default().push(block);
            }
            published.push(hash.published);
        }
        if published.is_empty() {
            return;
        }
        self.events.push(KvEvent::BlockStored {
            block_hashes: published,
            parent_block_hash: from.checked_sub(1).map(|parent| hashes[parent].published),
            token_ids: tokens[from * bs..to * bs].to_vec(),
            block_size: bs as u32,
        });
    }

    /// `reset_prefix_cache`: only possible when no request holds a block. Forgets every hash
    /// and queues `AllBlocksCleared` for the next published batch.
    pub fn reset(&mut self) -> bool {
        let held = self.blocks.iter().skip(1).any(|b| b.ref_cnt > 0);
        if held {
            return false;
        }
        for block in &mut self.blocks {
            block.hash = None;
        }
        self.cached.clear();
        self.events.push(KvEvent::AllBlocksCleared);
        true
    }

    /// The events queued since the last call, in the order they happened.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    #[cfg(test)]
    pub fn free_order(&self) -> Vec<BlockId> {
        self.free.iter().collect()
    }
}
