//! The settings of the admission of expensive gRPC calls: how large a query is answered at once
//! on the I/O thread, and how many larger ones run and wait.

/// The admission settings (`grpc_small_query_tokens`, `grpc_max_concurrent_large`,
/// `grpc_max_queued_tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Requests of at most this many tokens are answered at once on the I/O thread.
    pub small_query_tokens: usize,
    /// Larger requests computed at once.
    pub max_concurrent_large: usize,
    /// Tokens of larger requests allowed to wait for a slot.
    pub max_queued_tokens: usize,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig { small_query_tokens: 16_384, max_concurrent_large: 1, max_queued_tokens: 1 << 20 }
    }
}
