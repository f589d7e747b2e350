//! vLLM's own prefix-caching block hash, reproduced in Rust as a *cross-check*.
//!
//! kvindex keys its index with its own hash over `BlockStored.token_ids` (llm-d's dual-key design),
//! so it never needs vLLM's hash to be right. It does need to notice when an operator's view of an
//! engine is wrong ("scores are always 0": wrong block size, `PYTHONHASHSEED` or
//! `--prefix-caching-hash-algo`). Recomputing a sample of the engine's published hash chains and
//! comparing them with what it published detects exactly that. This module is pure computation:
//! no I/O, no async, no panics on any input.
//!
//! The rules (reference: `shared/reference/vllm-kv-events.md` §3, checked against vLLM's wheels):
//! * `hash_i = H((parent, tuple(tokens_i), extra_keys_i))`, with `parent` the previous block's full
//!   internal hash, or NONE_HASH for the first block (a falsy parent counts as none).
//! * `H` is canonical CBOR (cbor2) or pickle protocol 5 (CPython 3.11), then SHA-256 or XXH3-128.
//! * The internal hash is a Python int up to 0.10.1 (256-bit for `sha256`, the low 64 bits for
//!   `sha256_cbor_64bit`) and the raw digest bytes from 0.10.2.
//! * NONE_HASH depends on the version *range*, the algo and `PYTHONHASHSEED` (see [`NoneHashRule`]).
//! * Events publish the low 64 bits (last 8 digest bytes, big-endian) from 0.10.2, the int itself
//!   for `sha256_cbor_64bit`, and nothing for `sha256` <= 0.10.1 (msgspec cannot encode 256-bit ints).

mod cbor;
mod pickle;

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// Seed vLLM >= 0.29 uses for the crypto algos when `PYTHONHASHSEED` is unset (`DEFAULT_NONE_HASH_SEED`).
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

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
    AlgoNotInVersion {
        version: VllmVersion,
        algo: HashAlgo,
    },
    #[error(
        "`builtin` is Python's per-process hash(); it differs between processes even with \
         PYTHONHASHSEED fixed, so it cannot be reproduced"
    )]
    BuiltinNotReproducible,
    #[error(
        "vLLM {version} with `{algo}` and PYTHONHASHSEED unset starts every chain from a random \
         NONE_HASH; set PYTHONHASHSEED on the engine to make its hashes reproducible"
    )]
    RandomNoneHash {
        version: VllmVersion,
        algo: HashAlgo,
    },
    #[error("extra key is not a supported Python value: {0}")]
    InvalidExtraKey(String),
}

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
        VllmVersion {
            major,
            minor,
            patch,
        }
    }

    /// Parses `0.10.1`, `v0.33.0`, `0.11.0rc1`, `0.9.2+cu128`, `0.10.2.dev12+gabc`, `0.13`.
    pub fn parse(text: &str) -> Result<Self, VllmHashError> {
        let invalid = || VllmHashError::InvalidVersion(text.to_string());
        let trimmed = text.trim();
        let trimmed = trimmed.strip_prefix(['v', 'V']).unwrap_or(trimmed);
        let public = trimmed.split('+').next().unwrap_or("");
        let mut numbers = [0u32; 3];
        let mut rest = public;
        for (index, slot) in numbers.iter_mut().enumerate() {
            if index > 0 {
                match rest.strip_prefix('.') {
                    Some(after_dot) if after_dot.starts_with(|c: char| c.is_ascii_digit()) => {
                        rest = after_dot
                    }
                    // MAJOR.MINOR is required; a missing patch means 0.
                    _ if index == 2 => break,
                    _ => return Err(invalid()),
                }
            }
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            *slot = rest[..digits].parse().map_err(|_| invalid())?;
            rest = &rest[digits..];
        }
        Ok(VllmVersion::new(numbers[0], numbers[1], numbers[2]))
    }
}

impl FromStr for VllmVersion {
    type Err = VllmHashError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        VllmVersion::parse(text)
    }
}

impl fmt::Display for VllmVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Version boundaries where vLLM's hashing changed.
mod boundary {
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

/// `--prefix-caching-hash-algo` values across all releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashAlgo {
    Builtin,
    Sha256,
    Sha256Cbor,
    Sha256Cbor64bit,
    Xxhash,
    XxhashCbor,
}

impl HashAlgo {
    pub const ALL: [HashAlgo; 6] = [
        HashAlgo::Builtin,
        HashAlgo::Sha256,
        HashAlgo::Sha256Cbor,
        HashAlgo::Sha256Cbor64bit,
        HashAlgo::Xxhash,
        HashAlgo::XxhashCbor,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HashAlgo::Builtin => "builtin",
            HashAlgo::Sha256 => "sha256",
            HashAlgo::Sha256Cbor => "sha256_cbor",
            HashAlgo::Sha256Cbor64bit => "sha256_cbor_64bit",
            HashAlgo::Xxhash => "xxhash",
            HashAlgo::XxhashCbor => "xxhash_cbor",
        }
    }

    /// Whether `version` offers this algo at all.
    pub fn exists_in(self, version: VllmVersion) -> bool {
        use boundary::*;
        match self {
            HashAlgo::Builtin => version < BYTES_DIGESTS,
            HashAlgo::Sha256 => true,
            HashAlgo::Sha256Cbor64bit => (INIT_NONE_HASH..BYTES_DIGESTS).contains(&version),
            HashAlgo::Sha256Cbor => version >= BYTES_DIGESTS,
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => version >= XXHASH,
        }
    }

    fn serialization(self) -> Serialization {
        match self {
            HashAlgo::Sha256Cbor | HashAlgo::Sha256Cbor64bit | HashAlgo::XxhashCbor => {
                Serialization::CanonicalCbor
            }
            HashAlgo::Builtin | HashAlgo::Sha256 | HashAlgo::Xxhash => Serialization::Pickle5,
        }
    }

    fn digest_fn(self) -> DigestFn {
        match self {
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => DigestFn::Xxh3_128,
            _ => DigestFn::Sha256,
        }
    }
}

impl FromStr for HashAlgo {
    type Err = VllmHashError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        HashAlgo::ALL
            .into_iter()
            .find(|algo| algo.as_str() == text)
            .ok_or_else(|| VllmHashError::UnknownAlgo(text.to_string()))
    }
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serialization {
    CanonicalCbor,
    Pickle5,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DigestFn {
    Sha256,
    Xxh3_128,
}

/// How a digest becomes the Python value vLLM chains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InternalForm {
    /// <= 0.10.1 `sha256`: `int.from_bytes(digest, "big")`.
    Int256,
    /// `sha256_cbor_64bit`: the low 64 bits of that int.
    LowU64,
    /// >= 0.10.2: the digest bytes themselves.
    DigestBytes,
}

/// A Python value that can appear in `extra_keys` (LoRA ids/names, multimodal identifiers and
/// offsets, cache salts, prompt-embeds digests, and tuples of those).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PyValue {
    None,
    /// Python ints are unbounded; i128 covers every value vLLM puts in extra keys.
    Int(i128),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<PyValue>),
}

impl PyValue {
    /// The vectors' JSON convention: arrays are tuples, `"bytes:<hex>"` is bytes, other strings
    /// are str, integers are ints. Floats and bools never occur in vLLM extra keys.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, VllmHashError> {
        use serde_json::Value;
        Ok(match value {
            Value::Null => PyValue::None,
            Value::Number(number) => {
                if let Some(int) = number.as_i64() {
                    PyValue::Int(i128::from(int))
                } else if let Some(int) = number.as_u64() {
                    PyValue::Int(i128::from(int))
                } else {
                    return Err(VllmHashError::InvalidExtraKey(format!(
                        "non-integer number {number}"
                    )));
                }
            }
            Value::String(text) => {
                match text.strip_prefix("bytes:") {
                    Some(hex_digits) => PyValue::Bytes(hex::decode(hex_digits).map_err(|err| {
                        VllmHashError::InvalidExtraKey(format!("{text:?}: {err}"))
                    })?),
                    None => PyValue::Str(text.clone()),
                }
            }
            Value::Array(items) => PyValue::Tuple(
                items
                    .iter()
                    .map(PyValue::from_json)
                    .collect::<Result<_, _>>()?,
            ),
            Value::Bool(_) | Value::Object(_) => {
                return Err(VllmHashError::InvalidExtraKey(format!(
                    "unsupported JSON {value}"
                )))
            }
        })
    }
}

/// Digest bytes kept inline (SHA-256 = 32 B, XXH3-128 = 16 B), so chains never allocate.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DigestBytes {
    len: u8,
    bytes: [u8; 32],
}

impl DigestBytes {
    /// `None` for more than 32 bytes (no vLLM digest is longer).
    pub fn from_slice(slice: &[u8]) -> Option<Self> {
        let len = u8::try_from(slice.len()).ok().filter(|&len| len <= 32)?;
        let mut bytes = [0u8; 32];
        bytes[..slice.len()].copy_from_slice(slice);
        Some(DigestBytes { len, bytes })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Debug for DigestBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DigestBytes({})", hex::encode(self.as_bytes()))
    }
}

/// The value vLLM chains on (`parent` of the next block), in the version's Python type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InternalHash {
    /// >= 0.10.2: the digest bytes.
    Digest(DigestBytes),
    /// <= 0.10.1 `sha256`: a non-negative 256-bit int, as 32 big-endian bytes.
    Int256([u8; 32]),
    /// 0.10.0-0.10.1 `sha256_cbor_64bit`: the int itself (also what events publish).
    U64(u64),
}

impl InternalHash {
    /// Python truthiness: `hash_block_tokens` replaces a falsy parent with NONE_HASH.
    pub fn is_falsy(&self) -> bool {
        match self {
            InternalHash::Digest(digest) => digest.as_bytes().is_empty(),
            InternalHash::Int256(be) => be.iter().all(|&b| b == 0),
            InternalHash::U64(int) => *int == 0,
        }
    }

    /// The vectors' `*_hex` form: digest bytes, or the int big-endian (32 B / 8 B).
    pub fn to_hex(&self) -> String {
        match self {
            InternalHash::Digest(digest) => hex::encode(digest.as_bytes()),
            InternalHash::Int256(be) => hex::encode(be),
            InternalHash::U64(int) => hex::encode(int.to_be_bytes()),
        }
    }

    /// Exact decimal of an int internal hash (`none_hash_int` / `block_hashes_int`); `None` for bytes.
    pub fn to_decimal(&self) -> Option<String> {
        match self {
            InternalHash::Digest(_) => None,
            InternalHash::Int256(be) => Some(be_bytes_to_decimal(be)),
            InternalHash::U64(int) => Some(int.to_string()),
        }
    }

    /// The u64 published in events with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1` (the default):
    /// `int.from_bytes(digest, "big") & (2**64 - 1)`, or the 64-bit int itself. `None` where
    /// vLLM cannot publish the value (256-bit ints overflow msgpack).
    pub fn published_u64(&self) -> Option<u64> {
        match self {
            InternalHash::Digest(digest) => Some(low_u64_be(digest.as_bytes())),
            InternalHash::U64(int) => Some(*int),
            InternalHash::Int256(_) => None,
        }
    }
}

/// Low 64 bits of a big-endian byte string, left-padding shorter ones (like `int.from_bytes`).
fn low_u64_be(bytes: &[u8]) -> u64 {
    let tail = &bytes[bytes.len().saturating_sub(8)..];
    tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

/// Decimal digits of an unsigned big-endian integer, by repeated division by 10^19.
fn be_bytes_to_decimal(be: &[u8; 32]) -> String {
    const CHUNK: u64 = 10_000_000_000_000_000_000;
    let mut limbs = [0u64; 4];
    for (limb, chunk) in limbs.iter_mut().zip(be.chunks_exact(8)) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        *limb = u64::from_be_bytes(word);
    }
    let mut chunks = Vec::new();
    while limbs.iter().any(|&limb| limb != 0) {
        let mut remainder: u128 = 0;
        for limb in limbs.iter_mut() {
            let current = (remainder << 64) | u128::from(*limb);
            *limb = (current / u128::from(CHUNK)) as u64;
            remainder = current % u128::from(CHUNK);
        }
        chunks.push(remainder as u64);
    }
    let Some((most_significant, rest)) = chunks.split_last() else {
        return "0".to_string();
    };
    let mut text = most_significant.to_string();
    for chunk in rest.iter().rev() {
        text.push_str(&format!("{chunk:019}"));
    }
    text
}

/// Which NONE_HASH rule a (version, algo, seed) falls under; exposed for diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoneHashRule {
    /// 0.9.x: `sha256(seed)` with pickle, as a 256-bit int, whatever the chosen algo.
    PickleSha256IntOfSeed { seed: String },
    /// 0.10.0-0.10.1: `hash_fn(seed)` as an int (256-bit for sha256, low 64 bits for 64bit).
    AlgoIntOfSeed { seed: String },
    /// >= 0.10.2: the algo's digest of the seed *string* (the default seed from 0.29 when unset).
    AlgoDigestOfSeed { seed: String, defaulted: bool },
}

impl NoneHashRule {
    pub fn resolve(
        version: VllmVersion,
        algo: HashAlgo,
        pythonhashseed: Option<&str>,
    ) -> Result<Self, VllmHashError> {
        use boundary::*;
        if version < EVENTS {
            return Err(VllmHashError::VersionTooOld(version));
        }
        if !algo.exists_in(version) {
            return Err(VllmHashError::AlgoNotInVersion { version, algo });
        }
        if algo == HashAlgo::Builtin {
            return Err(VllmHashError::BuiltinNotReproducible);
        }
        let crypto = matches!(algo, HashAlgo::Sha256 | HashAlgo::Sha256Cbor);
        let seed = match pythonhashseed {
            Some(seed) => seed.to_string(),
            None if version >= DEFAULT_SEED && crypto => {
                return Ok(NoneHashRule::AlgoDigestOfSeed {
                    seed: DEFAULT_NONE_HASH_SEED.to_string(),
                    defaulted: true,
                })
            }
            None => return Err(VllmHashError::RandomNoneHash { version, algo }),
        };
        Ok(if version < INIT_NONE_HASH {
            NoneHashRule::PickleSha256IntOfSeed { seed }
        } else if version < BYTES_DIGESTS {
            NoneHashRule::AlgoIntOfSeed { seed }
        } else {
            NoneHashRule::AlgoDigestOfSeed {
                seed,
                defaulted: false,
            }
        })
    }

    /// The string hashed into NONE_HASH (`none_hash_seed` in the vectors).
    pub fn seed(&self) -> &str {
        match self {
            NoneHashRule::PickleSha256IntOfSeed { seed }
            | NoneHashRule::AlgoIntOfSeed { seed }
            | NoneHashRule::AlgoDigestOfSeed { seed, .. } => seed,
        }
    }
}

/// What the engine runs with; everything needed to reproduce its block hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VllmHashConfig {
    pub version: VllmVersion,
    pub algo: HashAlgo,
    /// `PYTHONHASHSEED` of the engine process; `None` = unset.
    pub pythonhashseed: Option<String>,
}

/// A value published in a `BlockStored`/`BlockRemoved` event (`ExternalBlockHash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishedHash<'a> {
    /// A msgpack int, reinterpreted as u64 (negative builtin ints keep their bit pattern).
    Int(u64),
    /// A msgpack bin (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`): the full digest.
    Bytes(&'a [u8]),
}

/// `BlockStored.parent_block_hash`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentRef<'a> {
    /// No parent: the chain starts at NONE_HASH.
    Root,
    Published(PublishedHash<'a>),
}

/// Outcome of [`BlockHasher::verify_chain`]. `checked = matched + mismatched`.
///
/// Reading it: a misconfiguration (seed, algo, block size) makes *every* checked block mismatch.
/// An occasional mismatch among matches points at something per-request instead (extra keys the
/// event does not show, e.g. a cache salt before 0.17 where events carry no `extra_keys`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verification {
    pub checked: u32,
    pub matched: u32,
    pub mismatched: u32,
    /// Blocks that cannot be recomputed without guessing (u64-truncated digest parent, extra
    /// keys, unpublishable internal type, block size 0).
    pub unverifiable: u32,
    /// Index (within the event) of the first mismatching block.
    pub first_mismatch: Option<u32>,
}

impl Verification {
    /// Adds another event's counts (saturating: a long-lived aggregate must never panic).
    pub fn merge(&mut self, other: &Verification) {
        self.checked = self.checked.saturating_add(other.checked);
        self.matched = self.matched.saturating_add(other.matched);
        self.mismatched = self.mismatched.saturating_add(other.mismatched);
        self.unverifiable = self.unverifiable.saturating_add(other.unverifiable);
        self.first_mismatch = self.first_mismatch.or(other.first_mismatch);
    }

    fn record(&mut self, block_index: usize, outcome: Option<bool>) {
        match outcome {
            Some(matched) => {
                self.checked = self.checked.saturating_add(1);
                if matched {
                    self.matched = self.matched.saturating_add(1);
                } else {
                    self.mismatched = self.mismatched.saturating_add(1);
                    self.first_mismatch
                        .get_or_insert(u32::try_from(block_index).unwrap_or(u32::MAX));
                }
            }
            None => self.unverifiable = self.unverifiable.saturating_add(1),
        }
    }
}

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
        let rule = NoneHashRule::resolve(
            config.version,
            config.algo,
            config.pythonhashseed.as_deref(),
        )?;
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
            Serialization::CanonicalCbor => {
                cbor::write_block_input(out, parent, tokens, extra_keys)
            }
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
            (InternalForm::DigestBytes, PublishedHash::Bytes(bytes))
                if bytes.len() == self.digest_len() =>
            {
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
                            let computed =
                                self.hash_block_with(&mut scratch, Some(parent), block, None);
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

#[cfg(test)]
mod tests;
