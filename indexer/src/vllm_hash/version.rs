//! Which vLLM release an engine runs, and the releases where its block hashing changed.

use std::fmt;

/// A vLLM release, ordered by (major, minor, patch). Pre-release and local suffixes are ignored:
/// `0.11.0rc1` follows the 0.11.0 rules, which is what its code mostly already is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VllmVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl VllmVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        VllmVersion { major, minor, patch }
    }
}

impl fmt::Display for VllmVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Version boundaries where vLLM's hashing changed.
pub(super) mod boundary {
    use super::VllmVersion;
    /// KV events (and the v1 `hash_block_tokens` recipe modelled here) start here.
    pub const EVENTS: VllmVersion = VllmVersion::new(0, 9, 0);
    /// `init_none_hash(hash_fn)` and `sha256_cbor_64bit` (#20511).
    pub const INIT_NONE_HASH: VllmVersion = VllmVersion::new(0, 10, 0);
    /// Digest bytes as internal hash, `sha256_cbor`, builtin and 64bit removed (#23673).
    pub const BYTES_DIGESTS: VllmVersion = VllmVersion::new(0, 10, 2);
    /// `xxhash` and `xxhash_cbor`.
    pub const XXHASH: VllmVersion = VllmVersion::new(0, 13, 0);
    /// `DEFAULT_NONE_HASH_SEED` for the crypto algos when PYTHONHASHSEED is unset.
    pub const DEFAULT_SEED: VllmVersion = VllmVersion::new(0, 29, 0);
}
