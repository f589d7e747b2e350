//! The KV-cache events a simulated pod emits, before any wire encoding.
//!
//! They carry exactly what vLLM's block pool puts in its events for a plain GPU block of KV-cache
//! group 0: the published (low 64-bit) hashes, the parent's published hash, the token ids and
//! the block size. Fields that are constant for the simulator (`medium = "GPU"`,
//! `group_idx = 0`, no LoRA, no extra keys) are added by the encoder in `crate::wire`.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
    },
    /// vLLM's block pool removes one hash per event; the encoder accepts lists anyway.
    BlockRemoved {
        block_hashes: Vec<u64>,
    },
    AllBlocksCleared,
}
