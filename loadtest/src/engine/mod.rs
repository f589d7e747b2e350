//! The simulated pod core: a vLLM v1 engine reduced to what routing and indexing observe.
//! Pure: no I/O, no clocks, no async. The caller owns time and passes it in.
//!
//! # Prefix cache ([`block_pool`])
//! A paged KV cache of `num_gpu_blocks` blocks of `block_size` tokens (block 0 is vLLM's null
//! block, so N − 1 are usable). Every *full* block of a request is hashed with vLLM's own
//! recipe, `sha256_cbor` of `(parent digest, tokens, None)` chained from NONE_HASH, through
//! [`kvindex::vllm_hash::BlockHasher`] (vLLM 0.33 rules, `PYTHONHASHSEED` = `hash_seed`).
//! Events publish the low 64 bits of each digest. Running requests hold their blocks by
//! reference count. A finished (or preempted) request releases its blocks tail first onto the
//! back of the free queue, hashes kept, so the free queue is the LRU order of evictable blocks:
//! allocation takes from the front and evicts the old hash there. Blocks that fill up during
//! decode carry generated tokens and are cached like prompt blocks. The last sampled token is
//! never in the KV cache (it would be computed by the next step), exactly as in vLLM.
//!
//! # Hits
//! At (first or re-)admission a request gets the longest run of cached blocks from its start,
//! limited to `num_tokens − 1` tokens in whole blocks (vLLM must compute at least one token to
//! produce logits). `cached_tokens` and the `vllm:prefix_cache_*` counters record the first
//! admission only.
//!
//! # Events ([`event`])
//! Exactly what vLLM's block pool queues: one `BlockStored` per request per step for the blocks
//! that step fills (parent = the published hash of the block before them, `None` from block
//! 0), one `BlockRemoved` per evicted hash, `AllBlocksCleared` after a successful
//! `reset_prefix_cache` (refused while any request holds blocks). A step's events form one
//! batch; steps without events publish nothing.
//!
//! # Scheduling and timing ([`scheduler`])
//! Each step first continues the running requests in admission order (one decode token each,
//! or the next prefill chunk), then admits waiting requests first come first served while
//! fewer than `max_num_seqs` run, the step's `max_num_batched_tokens` budget lasts, and the
//! free queue can supply their blocks: KV pressure makes new requests wait. A running request
//! that cannot get a block preempts the newest running one (recompute: it returns to the front
//! of the queue and keeps nothing but what stays cached).
//!
//! A step lasts `prefill_tokens / prefill_tokens_per_s`, plus `decode_s_per_token` when any
//! request decodes. Its tokens are available at its end, so a request's
//! TTFT = queueing (waiting for admission and for earlier steps) + its uncached prompt tokens
//! (with those of its batch-mates in the same step) / prefill rate, and each further token
//! arrives one decode step later. Generated tokens are drawn deterministically from
//! `output_alphabet`, seeded per request, so runs are reproducible.

mod block_id;
pub mod block_pool;
pub mod config;
pub mod event;
pub mod free_queue;
pub mod request;
pub mod scheduler;
#[cfg(test)]
mod tests;

pub use block_id::BlockId;
pub use config::EngineConfig;
pub use event::KvEvent;
pub use request::{NewRequest, RequestId};
pub use scheduler::{Engine, EngineStats, RejectReason, RequestSummary, RequestUpdate, StepOutcome};
