//! The value vLLM chains block hashes on, in each release's Python type (digest bytes, a
//! 256-bit int, or a 64-bit int), and its printed and published forms.

use std::fmt;

/// How a digest becomes the Python value vLLM chains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InternalForm {
    /// <= 0.10.1 `sha256`: `int.from_bytes(digest, "big")`.
    Int256,
    /// `sha256_cbor_64bit`: the low 64 bits of that int.
    LowU64,
    /// >= 0.10.2: the digest bytes themselves.
    DigestBytes,
}

/// Digest bytes kept inline (SHA-256 = 32 B, XXH3-128 = 16 B), so chains never allocate.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DigestBytes {
    pub(super) len: u8,
    pub(super) bytes: [u8; 32],
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
pub(super) fn low_u64_be(bytes: &[u8]) -> u64 {
    let tail = &bytes[bytes.len().saturating_sub(8)..];
    tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

/// Decimal digits of an unsigned big-endian integer, by repeated division by 10^19.
pub(super) fn be_bytes_to_decimal(be: &[u8; 32]) -> String {
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
