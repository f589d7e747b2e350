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
mod config;
mod error;
mod hasher;
mod internal;
mod none_hash;
mod parse;
mod pickle;
mod py_value;
mod verify;
mod version;

pub use algo::HashAlgo;
pub use config::VllmHashConfig;
pub use error::VllmHashError;
pub use hasher::BlockHasher;
pub use internal::{DigestBytes, InternalHash};
pub use none_hash::{NoneHashRule, DEFAULT_NONE_HASH_SEED};
pub use py_value::PyValue;
pub use verify::{ParentRef, PublishedHash, Verification};
pub use version::VllmVersion;

#[cfg(test)]
use internal::be_bytes_to_decimal;

#[cfg(test)]
mod tests;
