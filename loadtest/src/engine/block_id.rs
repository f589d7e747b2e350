//! [`BlockId`], a KV block's index in the pool: the one name the pool, its free queue, requests
//! and the scheduler all share, kept in a leaf so none of them reaches into `mod.rs` for it.

/// Index of a KV block in the pool.
pub type BlockId = u32;
