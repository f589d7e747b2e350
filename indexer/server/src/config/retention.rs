//! How much of a dump `kvindex record` keeps on disk: token ids are never kept beyond the bound
//! the operator chose.

use std::time::Duration;

/// How much of a dump is kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Compressed bytes of the current file before it rotates.
    pub max_bytes: u64,
    /// Age of the current file before it rotates.
    pub max_age: Duration,
}
