//! The engine: vLLM v1's scheduler loop over the [`BlockPool`], stepped on a simulated clock.
//!
//! See the module documentation of [`crate::engine`] for the model. Everything here is pure:
//! the caller passes `now` in and gets the step's duration, events and request updates back.

use std::collections::VecDeque;

use kvindex::vllm_hash::{BlockHasher, VllmHashError};

use super::block_id::BlockId;
use super::block_pool::BlockPool;
use super::config::EngineConfig;
use super::event::KvEvent;
use super::request::{splitmix64, NewRequest, Request, RequestId};

/// Why a request cannot be accepted at all (it would wait forever).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RejectReason {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    NoOutput,
    #[error("prompt ({prompt} tokens) + max_tokens ({max_tokens}) exceeds the maximum model length {max_model_len}")]
    TooLong { prompt: usize, max_tokens: usize, max_model_len: usize },
}

/// What happened to a request during a step. Times are on the simulated clock.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestUpdate {
    /// First admission: how many prompt tokens came from the prefix cache.
    Scheduled {
        id: RequestId,
        cached_tokens: usize,
    },
    /// A sampled token, available at `at` (the end of the step).
    Token {
        id: RequestId,
        token: u32,
        at: f64,
    },
    Finished {
        id: RequestId,
        summary: RequestSummary,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct RequestSummary {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub arrival: f64,
    pub first_token_at: f64,
    pub finished_at: f64,
    pub preemptions: u32,
}

impl RequestSummary {
    pub fn ttft(&self) -> f64 {
        self.first_token_at - self.arrival
    }
}

#[derive(Debug, Clone, Default)]
pub struct StepOutcome {
    /// Simulated seconds the step's compute takes; 0 when nothing was scheduled.
    pub duration: f64,
    /// The step's events in the order the block pool produced them (one published batch).
    pub events: Vec<KvEvent>,
    pub updates: Vec<RequestUpdate>,
    /// Requests that computed tokens in this step.
    pub scheduled: usize,
}

/// A snapshot for `/metrics` and load-aware policies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineStats {
    pub num_waiting: usize,
    pub num_running: usize,
    pub kv_usage: f64,
    /// `vllm:prefix_cache_queries`: prompt tokens of first-scheduled requests.
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits`: of those, tokens served from the cache.
    pub prefix_cache_hits: u64,
    pub num_gpu_blocks: usize,
    pub block_size: usize,
    pub preemptions: u64,
    pub steps: u64,
}

pub struct Engine {
    config: EngineConfig,
    hasher: BlockHasher,
    pool: BlockPool,
    waiting: VecDeque<Request>,
    running: Vec<Request>,
    next_id: u64,
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
    preemptions: u64,
    steps: u64,
}

impl Engine {
    pub fn new(mut config: EngineConfig) -> Result<Self, VllmHashError> {
        // Degenerate sizes would stall or divide by zero; the smallest meaningful values instead.
        config.block_size = config.block_size.max(1);
        config.max_num_seqs = config.max_num_seqs.max(1);
        config.max_num_batched_tokens = config.max_num_batched_tokens.max(1);
        let hasher = BlockHasher::new(&config.hash_config())?;
        let pool = BlockPool::new(config.num_gpu_blocks, config.block_size);
        Ok(Engine {
            config,
            hasher,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            preemptions: 0,
            steps: 0,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn hasher(&self) -> &BlockHasher {
        &self.hasher
    }

    /// Queues a request that arrived at `now`.
    pub fn submit(&mut self, new: NewRequest, now: f64) -> Result<RequestId, RejectReason> {
        if new.prompt.is_empty() {
            return Err(RejectReason::EmptyPrompt);
        }
        if new.max_tokens == 0 {
            return Err(RejectReason::NoOutput);
        }
        let max_model_len = self.config.effective_max_model_len();
        if new.prompt.len().saturating_add(new.max_tokens) > max_model_len {
            return Err(RejectReason::TooLong { prompt: new.prompt.len(), max_tokens: new.max_tokens, max_model_len });
        }
        let id = RequestId(self.next_id);
        self.next_id += 1;
        let output_seed = splitmix64(self.config.output_seed ^ splitmix64(id.0));
        let request = Request::new(id, now, new, output_seed, &self.hasher, self.config.block_size);
        self.waiting.push_back(request);
        Ok(id)
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// `/reset_prefix_cache`: refused while any request holds blocks, as in vLLM. On success
    /// `AllBlocksCleared` goes out with the next step's events.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset()
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            num_waiting: self.waiting.len(),
            num_running: self.running.len(),
            kv_usage: self.pool.usage(),
            prefix_cache_queries: self.prefix_cache_queries,
            prefix_cache_hits: self.prefix_cache_hits,
            num_gpu_blocks: self.config.num_gpu_blocks,
            block_size: self.config.block_size,
            preemptions: self.preemptions,
            steps: self.steps,
        }
    }

    /// Tokens a prompt would get from this engine's cache right now (an oracle's view; no
    /// side effects): whole cached blocks from the start, at most `prompt_len − 1` tokens.
    pub fn peek_cached_tokens(&self, prompt: &[u32]) -> usize {
        let bs = self.config.block_size;
        if prompt.is_empty() || bs == 0 {
            return 0;
        }
        let max_blocks = (prompt.len() - 1) / bs;
        let hashes = self.hasher.hash_chain(None, &prompt[..max_blocks * bs], bs, &[]);
        hashes.iter().take_while(|hash| self.pool.lookup(hash).is_some()).count() * bs
    }

    /// Leading blocks of a prompt's chain (from [`BlockHasher::hash_chain`], limited by the
    /// caller to the `prompt_len − 1` rule) cached here now. Lets an oracle hash a prompt once
    /// for every pod.
    pub fn cached_prefix_blocks(&self, hashes: &[kvindex::vllm_hash::InternalHash]) -> usize {
        hashes.iter().take_while(|hash| self.pool.lookup(hash).is_some()).count()
    }

    /// One engine step at simulated time `now`: schedule, "compute", sample, free.
    pub fn step(&mut self, now: f64) -> StepOutcome {
        self.steps += 1;
        let mut budget = self.config.max_num_batched_tokens;
        let mut prefill_tokens = 0usize;
        let mut decodes = 0usize;
        // (request id, tokens computed this step), in scheduling order.
        let mut scheduled: Vec<(RequestId, usize)> = Vec::new();
        let mut updates = Vec::new();
        let mut preempted_any = false;

        // Running requests first, in admission order; under KV pressure the newest is preempted.
        let mut index = 0;
        while index < self.running.len() && budget > 0 {
            let remaining = self.running[index].tokens.len() - self.running[index].num_computed;
            let num_new = remaining.min(budget);
            let mut self_preempted = false;
            while !allocate_slots(&mut self.pool, &mut self.running[index], num_new, &[]) {
                let last = self.running.len() - 1;
                self.preempt(last);
                preempted_any = true;
                if last == index {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                break;
            }
            let request = &self.running[index];
            if request.num_outputs() > 0 && request.num_computed + num_new == request.tokens.len() && num_new == 1 {
                decodes += 1;
            } else {
                prefill_tokens += num_new;
            }
            budget -= num_new;
            scheduled.push((request.id, num_new));
            index += 1;
        }

        // Then waiting requests, first come first served, unless this step had to preempt.
        while !preempted_any && budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(request) = self.waiting.front() else {
                break;
            };
            let hits = self.longest_cache_hit(request);
            let hit_tokens = hits.len() * self.config.block_size;
            let num_new = (request.tokens.len() - hit_tokens).min(budget);
            let Some(mut request) = self.waiting.pop_front() else {
                break;
            };
            if !allocate_slots(&mut self.pool, &mut request, num_new, &hits) {
                self.waiting.push_front(request);
                break;
            }
            if request.cached_tokens.is_none() {
                request.cached_tokens = Some(hit_tokens);
                self.prefix_cache_queries += request.prompt_len as u64;
                self.prefix_cache_hits += hit_tokens as u64;
                updates.push(RequestUpdate::Scheduled { id: request.id, cached_tokens: hit_tokens });
            }
            prefill_tokens += num_new;
            budget -= num_new;
            scheduled.push((request.id, num_new));
            self.running.push(request);
        }

        let duration = prefill_tokens as f64 / self.config.prefill_tokens_per_s.max(f64::MIN_POSITIVE)
            + if decodes > 0 { self.config.decode_s_per_token } else { 0.0 };
        let end = now + duration;

        // "Compute": advance, sample where a sequence reached its end, finish and free.
        let mut finished: Vec<RequestId> = Vec::new();
        for (id, num_new) in &scheduled {
            let Some(request) = self.running.iter_mut().find(|r| r.id == *id) else {
                continue;
            };
            request.num_computed += num_new;
            if request.num_computed < request.tokens.len() {
                continue; // a prefill chunk: nothing sampled yet
            }
            let position = request.num_outputs() as u64;
            let alphabet = &self.config.output_alphabet;
            let token = if alphabet.is_empty() {
                0
            } else {
                alphabet[(splitmix64(request.output_seed.wrapping_add(position)) % alphabet.len() as u64) as usize]
            };
            request.tokens.push(token);
            request.extend_hashes(&self.hasher, self.config.block_size);
            if request.first_token_at.is_none() {
                request.first_token_at = Some(end);
            }
            updates.push(RequestUpdate::Token { id: *id, token, at: end });
            if request.num_outputs() >= request.max_tokens {
                finished.push(*id);
            }
        }
        for id in finished {
            let Some(position) = self.running.iter().position(|r| r.id == id) else {
                continue;
            };
            let request = self.running.remove(position);
            self.pool.free(request.blocks.iter().rev().copied());
            updates.push(RequestUpdate::Finished {
                id,
                summary: RequestSummary {
                    prompt_tokens: request.prompt_len,
                    cached_tokens: request.cached_tokens.unwrap_or(0),
                    completion_tokens: request.num_outputs(),
                    arrival: request.arrival,
                    first_token_at: request.first_token_at.unwrap_or(end),
                    finished_at: end,
                    preemptions: request.preemptions,
                },
            });
        }

        StepOutcome { duration, events: self.pool.take_events(), updates, scheduled: scheduled.len() }
    }

    /// `find_longest_cache_hit`: leading cached blocks, at most `num_tokens − 1` tokens' worth.
    fn longest_cache_hit(&self, request: &Request) -> Vec<BlockId> {
        let bs = self.config.block_size;
        let max_blocks = request.tokens.len().saturating_sub(1) / bs;
        request.hashes.iter().take(max_blocks).map_while(|hash| self.pool.lookup(&hash.internal)).collect()
    }

    /// Recompute-style preemption: the request frees everything and goes back to the front of
    /// the queue; its full blocks stay cached, so re-admission usually hits them.
    fn preempt(&mut self, index: usize) {
        let mut request = self.running.remove(index);
        self.pool.free(request.blocks.iter().rev().copied());
        request.blocks.clear();
        request.num_computed = 0;
        request.num_cached_blocks = 0;
        request.preemptions += 1;
        self.preemptions += 1;
        self.waiting.push_front(request);
    }
}

/// `allocate_slots`: takes the hit blocks, allocates what `num_new` more tokens need, and
/// caches every block the step fills (one `BlockStored`). Refuses, changing nothing, when the
/// free queue cannot supply the blocks.
fn allocate_slots(pool: &mut BlockPool, request: &mut Request, num_new: usize, hits: &[BlockId]) -> bool {
    let bs = pool.block_size();
    let computed = request.num_computed + hits.len() * bs;
    let total = computed + num_new;
    let required = total.div_ceil(bs);
    let to_allocate = required.saturating_sub(request.blocks.len() + hits.len());
    let available = pool.num_free() - pool.count_evictable(hits);
    if to_allocate > available {
        return false;
    }
    pool.touch(hits);
    request.blocks.extend_from_slice(hits);
    if !hits.is_empty() {
        request.num_computed = computed;
        request.num_cached_blocks = request.num_cached_blocks.max(request.blocks.len());
    }
    let Some(fresh) = pool.allocate(to_allocate) else {
        return false;
    };
    request.blocks.extend(fresh);
    let full = (total / bs).min(request.hashes.len());
    if full > request.num_cached_blocks {
        pool.cache_full_blocks(&request.blocks, &request.hashes, &request.tokens, request.num_cached_blocks, full);
        request.num_cached_blocks = full;
    }
    true
}
