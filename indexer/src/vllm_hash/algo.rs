//! The engines' `--prefix-caching-hash-algo`: which serialization (CBOR or pickle) and digest
//! (SHA-256 or XXH3-128) a block hash is made of, and which releases offer it.

use std::fmt;

use super::version::boundary;
use super::version::VllmVersion;

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

    pub(super) fn serialization(self) -> Serialization {
        match self {
            HashAlgo::Sha256Cbor | HashAlgo::Sha256Cbor64bit | HashAlgo::XxhashCbor => Serialization::CanonicalCbor,
            HashAlgo::Builtin | HashAlgo::Sha256 | HashAlgo::Xxhash => Serialization::Pickle5,
        }
    }

    pub(super) fn digest_fn(self) -> DigestFn {
        match self {
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => DigestFn::Xxh3_128,
            _ => DigestFn::Sha256,
        }
    }
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Serialization {
    CanonicalCbor,
    Pickle5,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DigestFn {
    Sha256,
    Xxh3_128,
}
