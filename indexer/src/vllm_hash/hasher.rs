//! [`BlockHasher`]: one engine configuration's block hashes, reproduced byte for byte, and the
//! cross-check of a published chain against them.

use sha2::{Digest as _, Sha256};

use super::algo::HashAlgo;
use super::algo::{DigestFn, Serialization};
use super::config::VllmHashConfig;
use super::error::VllmHashError;
use super::internal::{low_u64_be, InternalForm};
use super::internal::{DigestBytes, InternalHash};
use super::none_hash::NoneHashRule;
use super::py_value::PyValue;
use super::verify::{ParentRef, PublishedHash, Verification};
use super::version::boundary;
use super::{cbor, pickle};

/// Reproduces one engine's block hashes. Built once per (version, algo, seed); NONE_HASH is
/// precomputed. Cheap to share (`&self` everywhere, no interior mutability).
#[derive(Debug, Clone)]
pub struct BlockHasher {
    config: VllmHashConfig,
    rule: NoneHashRule,
    serialization: Serialization,
    digest_fn: DigestFn,
    form: InternalForm,
    none_hash: InternalHash,
}

impl BlockHasher {
    pub fn new(config: &VllmHashConfig) -> Result<Self, VllmHashError> {
        let rule = NoneHashRule::resolve(config.version, config.algo, config.pythonhashseed.as_deref())?;
        let form = match config.algo {
            HashAlgo::Sha256Cbor64bit => InternalForm::LowU64,
            _ if config.version < boundary::BYTES_DIGESTS => InternalForm::Int256,
            _ => InternalForm::DigestBytes,
        };
        let mut hasher = BlockHasher {
            config: config.clone(),
            serialization: config.algo.serialization(),
            digest_fn: config.algo.digest_fn(),
            form,
            rule,
            none_hash: InternalHash::U64(0),
        };
        let mut buffer = Vec::with_capacity(64);
        hasher.none_hash = match &hasher.rule {
            NoneHashRule::PickleSha256IntOfSeed { seed } => {
                pickle::write_text(&mut buffer, seed);
                InternalHash::Int256(Sha256::digest(&buffer).into())
            }
            NoneHashRule::AlgoIntOfSeed { seed } | NoneHashRule::AlgoDigestOfSeed { seed, .. } => {
                hasher.write_seed_input(&mut buffer, seed);
                hasher.finish_digest(&buffer)
            }
        };
        Ok(hasher)
    }

    pub fn config(&self) -> &VllmHashConfig {
        &self.config
    }

    pub fn none_hash_rule(&self) -> &NoneHashRule {
        &self.rule
    }

    pub fn none_hash(&self) -> &InternalHash {
        &self.none_hash
    }

    /// Whether events of this configuration can carry hashes at all (not `sha256` <= 0.10.1).
    pub fn can_publish(&self) -> bool {
        self.form != InternalForm::Int256
    }

    /// The algo NONE_HASH is computed with (`none_hash_algo`): always pickle `sha256` in 0.9.x.
    pub fn none_hash_algo(&self) -> HashAlgo {
        match self.rule {
            NoneHashRule::PickleSha256IntOfSeed { .. } => HashAlgo::Sha256,
            _ => self.config.algo,
        }
    }

    /// Appends the exact bytes hashed into NONE_HASH (`serialized_none_hash_seed_hex`).
    pub fn write_none_hash_seed_input(&self, out: &mut Vec<u8>) {
        match &self.rule {
            NoneHashRule::PickleSha256IntOfSeed { seed } => pickle::write_text(out, seed),
            NoneHashRule::AlgoIntOfSeed { seed } | NoneHashRule::AlgoDigestOfSeed { seed, .. } => {
                self.write_seed_input(out, seed)
            }
        }
    }

    fn write_seed_input(&self, out: &mut Vec<u8>, seed: &str) {
        match self.serialization {
            Serialization::CanonicalCbor => cbor::write_text(out, seed),
            Serialization::Pickle5 => pickle::write_text(out, seed),
        }
    }

    /// Appends the exact bytes vLLM hashes for one block (`serialized_input_hex_block0`).
    /// `parent: None` (or a falsy parent) means NONE_HASH.
    pub fn write_block_input(
        &self,
        out: &mut Vec<u8>,
        parent: Option<&InternalHash>,
        tokens: &[u32],
        extra_keys: Option<&PyValue>,
    ) {
        let parent = match parent {
            Some(parent) if !parent.is_falsy() => parent,
            _ => &self.none_hash,
        };
        // `None` and an absent key are the same Python object.
        let extra_keys = extra_keys.filter(|value| **value != PyValue::None);
        match self.serialization {
            Serialization::CanonicalCbor => cbor::write_block_input(out, parent, tokens, extra_keys),
            Serialization::Pickle5 => pickle::write_block_input(out, parent, tokens, extra_keys),
        }
    }

    fn finish_digest(&self, input: &[u8]) -> InternalHash {
        let digest = match self.digest_fn {
            DigestFn::Sha256 => {
                let bytes: [u8; 32] = Sha256::digest(input).into();
                match self.form {
                    InternalForm::Int256 => return InternalHash::Int256(bytes),
                    InternalForm::LowU64 => return InternalHash::U64(low_u64_be(&bytes)),
                    InternalForm::DigestBytes => DigestBytes { len: 32, bytes },
                }
            }
            DigestFn::Xxh3_128 => {
                // python-xxhash's `xxh3_128_digest` is the canonical (big-endian) form.
                let mut bytes = [0u8; 32];
                bytes[..16].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(input).to_be_bytes());
                DigestBytes { len: 16, bytes }
            }
        };
        InternalHash::Digest(digest)
    }

    /// `hash_block_tokens`, reusing `scratch` for the serialized input.
    pub fn hash_block_with(
        &self,
        scratch: &mut Vec<u8>,
        parent: Option<&InternalHash>,
        tokens: &[u32],
        extra_keys: Option<&PyValue>,
    ) -> InternalHash {
        scratch.clear();
        self.write_block_input(scratch, parent, tokens, extra_keys);
        self.finish_digest(scratch)
    }

    /// `hash_block_tokens` (allocates a small buffer; use [`Self::hash_block_with`] in loops).
    pub fn hash_block(
        &self,
        parent: Option<&InternalHash>,
        tokens: &[u32],
        extra_keys: Option<&PyValue>,
    ) -> InternalHash {
        let mut scratch = Vec::with_capacity(self.input_capacity(tokens.len()));
        self.hash_block_with(&mut scratch, parent, tokens, extra_keys)
    }

    /// Hashes consecutive full blocks of `tokens` (a trailing partial block gets no hash, as in
    /// vLLM). `extra_keys_per_block[i]` is block i's extra keys; missing entries mean none.
    pub fn hash_chain(
        &self,
        parent: Option<&InternalHash>,
        tokens: &[u32],
        block_size: usize,
        extra_keys_per_block: &[Option<PyValue>],
    ) -> Vec<InternalHash> {
        if block_size == 0 {
            return Vec::new();
        }
        let mut scratch = Vec::with_capacity(self.input_capacity(block_size));
        let mut hashes: Vec<InternalHash> = Vec::with_capacity(tokens.len() / block_size);
        let mut previous = parent.copied();
        for (index, block) in tokens.chunks_exact(block_size).enumerate() {
            let extra = extra_keys_per_block.get(index).and_then(Option::as_ref);
            let hash = self.hash_block_with(&mut scratch, previous.as_ref(), block, extra);
            hashes.push(hash);
            previous = Some(hash);
        }
        hashes
    }

    /// Initial serialization buffer size: enough for typical blocks, capped so an absurd
    /// `block_size` from an event cannot request a huge (or overflowing) allocation up front.
    fn input_capacity(&self, tokens: usize) -> usize {
        64 + tokens.min(4096) * 6
    }

    /// The internal hash an event value stands for, when it is the full internal hash
    /// (raw digest bytes, or the `sha256_cbor_64bit` int); `None` when it is only a truncation.
    pub fn internal_from_published(&self, published: &PublishedHash<'_>) -> Option<InternalHash> {
        match (self.form, published) {
            (InternalForm::DigestBytes, PublishedHash::Bytes(bytes)) if bytes.len() == self.digest_len() => {
                DigestBytes::from_slice(bytes).map(InternalHash::Digest)
            }
            (InternalForm::LowU64, PublishedHash::Int(int)) => Some(InternalHash::U64(*int)),
            (InternalForm::LowU64, PublishedHash::Bytes(bytes)) if bytes.len() == 8 => {
                Some(InternalHash::U64(low_u64_be(bytes)))
            }
            _ => None,
        }
    }

    fn digest_len(&self) -> usize {
        match self.digest_fn {
            DigestFn::Sha256 => 32,
            DigestFn::Xxh3_128 => 16,
        }
    }

    /// `Some(matches)` when `computed` and the event value are comparable.
    fn compare(&self, computed: &InternalHash, published: &PublishedHash<'_>) -> Option<bool> {
        match (computed, published) {
            (InternalHash::Int256(_), _) => None,
            (InternalHash::Digest(digest), PublishedHash::Bytes(bytes)) => {
                let digest = digest.as_bytes();
                if bytes.len() == digest.len() {
                    Some(*bytes == digest)
                } else if bytes.len() > digest.len() && bytes.len() % digest.len() == 0 {
                    // Hybrid-model concatenation of sub-block digests (0.12-0.23): another recipe.
                    None
                } else {
                    Some(false)
                }
            }
            (InternalHash::U64(int), PublishedHash::Bytes(bytes)) => {
                Some(bytes.len() == 8 && low_u64_be(bytes) == *int)
            }
            (computed, PublishedHash::Int(int)) => Some(computed.published_u64() == Some(*int)),
        }
    }

    /// Recomputes a `BlockStored`'s chain and compares it with what the engine published.
    ///
    /// * `parent`: the event's `parent_block_hash`. A u64-truncated digest parent makes the whole
    ///   event unverifiable (the full parent digest is unknown), not a mismatch.
    /// * `token_ids`, `block_size`, `published`: the event's fields. Blocks whose tokens are
    ///   missing (token count != blocks x block_size) count as mismatches: the block size is off.
    /// * `carries_extra_keys[i]`: block i had extra keys (non-null `extra_keys` entry, a LoRA id,
    ///   lookahead tokens…). Such blocks are unverifiable (events from 0.31 drop the LoRA path
    ///   and tags); missing entries mean plain blocks.
    ///
    /// The chain continues from the published value when that is the full internal hash (raw
    /// bytes mode, `sha256_cbor_64bit`), otherwise from a computed hash only while it matched.
    /// One serialization buffer is reused for all blocks.
    pub fn verify_chain(
        &self,
        parent: ParentRef<'_>,
        token_ids: &[u32],
        block_size: usize,
        published: &[PublishedHash<'_>],
        carries_extra_keys: &[bool],
    ) -> Verification {
        let mut verification = Verification::default();
        let mut chain_parent: Option<InternalHash> = match parent {
            ParentRef::Root => Some(self.none_hash),
            ParentRef::Published(value) => self.internal_from_published(&value),
        };
        let mut scratch = Vec::with_capacity(self.input_capacity(block_size));
        for (index, published_hash) in published.iter().enumerate() {
            let has_extra = carries_extra_keys.get(index).copied().unwrap_or(false);
            let mut next_parent = self.internal_from_published(published_hash);
            let outcome = match (&chain_parent, has_extra, block_size) {
                (Some(parent), false, 1..) if self.can_publish() => {
                    let block = index
                        .checked_mul(block_size)
                        .and_then(|start| token_ids.get(start..start.checked_add(block_size)?));
                    match block {
                        None => Some(false),
                        Some(block) => {
                            let computed = self.hash_block_with(&mut scratch, Some(parent), block, None);
                            let outcome = self.compare(&computed, published_hash);
                            if outcome == Some(true) && next_parent.is_none() {
                                next_parent = Some(computed);
                            }
                            outcome
                        }
                    }
                }
                _ => None,
            };
            verification.record(index, outcome);
            chain_parent = next_parent;
        }
        verification
    }
}
