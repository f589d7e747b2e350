//! vLLM's own prefix-caching block hash, reproduced in Rust as a *cross-check*.
//!
//! kvindex keys its index with its own hash over `BlockStored.token_ids` (llm-d's dual-key design),
//! so it never needs vLLM's hash to be right. It does need to notice when an operator's view of an
//! engine is wrong ("scores are always 0": wrong block size, `PYTHONHASHSEED` or
//! `--prefix-caching-hash-algo`). Recomputing a sample of the engine's published hash chains and
//! comparing them with what it published detects exactly that. This module is pure computation:
//! no I/O, no async, no panics on any input.
//!
//! The rules (reference: `docs/reference/vllm-kv-events.md` §3, checked against vLLM's wheels):
//! * `hash_i = H((parent, tuple(tokens_i), extra_keys_i))`, with `parent` the previous block's full
//!   internal hash, or NONE_HASH for the first block (a falsy parent counts as none).
//! * `H` is canonical CBOR (cbor2) or pickle protocol 5 (CPython 3.11), then SHA-256 or XXH3-128.
//! * The internal hash is a Python int up to 0.10.1 (256-bit for `sha256`, the low 64 bits for
//!   `sha256_cbor_64bit`) and the raw digest bytes from 0.10.2.
//! * NONE_HASH depends on the version *range*, the algo and `PYTHONHASHSEED` (see [`NoneHashRule`]).
//! * Events publish the low 64 bits (last 8 digest bytes, big-endian) from 0.10.2, the int itself
//!   for `sha256_cbor_64bit`, and nothing for `sha256` <= 0.10.1 (msgspec cannot encode 256-bit ints).

mod algo;
mod cbor;
mod hasher;
mod internal;
mod none_hash;
mod pickle;
mod py_value;
mod verify;
mod version;

pub use algo::HashAlgo;
pub use hasher::BlockHasher;
pub use internal::{DigestBytes, InternalHash};
pub use none_hash::{NoneHashRule, DEFAULT_NONE_HASH_SEED};
pub use py_value::PyValue;
pub use verify::{ParentRef, PublishedHash, Verification};
pub use version::VllmVersion;

#[cfg(test)]
use internal::be_bytes_to_decimal;

/// Why a configuration cannot be reproduced, or an input is not a valid hash input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VllmHashError {
    #[error("invalid vLLM version {0:?} (expected MAJOR.MINOR[.PATCH][suffix])")]
    InvalidVersion(String),
    #[error("vLLM {0} predates KV-cache events (0.9.0); its block hashing is not modelled")]
    VersionTooOld(VllmVersion),
    #[error("unknown prefix-caching hash algorithm {0:?}")]
    UnknownAlgo(String),
    #[error("vLLM {version} has no `{algo}` prefix-caching hash algorithm")]
    AlgoNotInVersion { version: VllmVersion, algo: HashAlgo },
    #[error(
        "`builtin` is Python's per-process hash(); it differs between processes even with \
         PYTHONHASHSEED fixed, so it cannot be reproduced"
    )]
    BuiltinNotReproducible,
    #[error(
        "vLLM {version} with `{algo}` and PYTHONHASHSEED unset starts every chain from a random \
         NONE_HASH; set PYTHONHASHSEED on the engine to make its hashes reproducible"
    )]
    RandomNoneHash { version: VllmVersion, algo: HashAlgo },
    #[error("extra key is not a supported Python value: {0}")]
    InvalidExtraKey(String),
}

/// What the engine runs with; everything needed to reproduce its block hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VllmHashConfig {
    pub version: VllmVersion,
    pub algo: HashAlgo,
    /// `PYTHONHASHSEED` of the engine process; `None` = unset.
    pub pythonhashseed: Option<String>,
}

#[cfg(test)]
mod tests;
