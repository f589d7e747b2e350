//! One request's state inside the simulated engine: its tokens, the blocks it holds, its
//! incrementally computed block hashes and the timestamps the timing model reports.

use kvindex::vllm_hash::BlockHasher;

use super::block_id::BlockId;
use super::block_pool::BlockHash;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// What a client submits.
#[derive(Debug, Clone)]
pub struct NewRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
}

#[derive(Debug, Clone)]
pub(super) struct Request {
    pub id: RequestId,
    pub arrival: f64,
    /// Prompt, then every sampled token.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub max_tokens: usize,
    /// Tokens whose KV is computed (or was found in the cache).
    pub num_computed: usize,
    /// Blocks held, in sequence order.
    pub blocks: Vec<BlockId>,
    /// Hashes of every full block of `tokens`, chained from the first.
    pub hashes: Vec<BlockHash>,
    /// Leading blocks already hashed into the pool (stored, or found there).
    pub num_cached_blocks: usize,
    /// Prompt tokens served from the cache at first scheduling (`cached_tokens`).
    pub cached_tokens: Option<usize>,
    pub first_token_at: Option<f64>,
    pub preemptions: u32,
    pub output_seed: u64,
}

impl Request {
    pub fn new(
        id: RequestId,
        arrival: f64,
        new: NewRequest,
        output_seed: u64,
        hasher: &BlockHasher,
        block_size: usize,
    ) -> Self {
        let mut request = Request {
            id,
            arrival,
            prompt_len: new.prompt.len(),
            tokens: new.prompt,
            max_tokens: new.max_tokens,
            num_computed: 0,
            blocks: Vec::new(),
            hashes: Vec::new(),
            num_cached_blocks: 0,
            cached_tokens: None,
            first_token_at: None,
            preemptions: 0,
            output_seed,
        };
        request.extend_hashes(hasher, block_size);
        request
    }

    pub fn num_outputs(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Hashes blocks that became full since the last call (vLLM's `request.block_hashes`).
    pub fn extend_hashes(&mut self, hasher: &BlockHasher, block_size: usize) {
        if block_size == 0 {
            return;
        }
        let mut scratch = Vec::new();
        while (self.hashes.len() + 1) * block_size <= self.tokens.len() {
            let index = self.hashes.len();
            let parent = index.checked_sub(1).map(|p| self.hashes[p].internal);
            let block_tokens = &self.tokens[index * block_size..(index + 1) * block_size];
            let internal = hasher.hash_block_with(&mut scratch, parent.as_ref(), block_tokens, None);
            // sha256_cbor always yields a 32-byte digest, whose low 64 bits are published.
            let published = internal.published_u64().unwrap_or_default();
            self.hashes.push(BlockHash { internal, published });
        }
    }
}

/// splitmix64: a tiny, well-mixed, dependency-free generator for the simulated outputs.
pub fn splitmix64(mut state: u64) -> u64 {
    state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
