//! What a payload can make the decoder spend: nesting depth and preallocation from declared
//! lengths. Its own file so the error type and the decoder both name it without naming each
//! other.

/// Nesting allowed inside a payload; vLLM's deepest value (extra keys) is 4 levels down.
pub(crate) const MAX_DEPTH: usize = 32;

/// Upper bound on preallocation from a declared length, so a lying header costs nothing.
pub(crate) const MAX_PREALLOC: usize = 4096;
