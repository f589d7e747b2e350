//! NONE_HASH, the parent of every chain's first block: which seed and recipe a (version, algo,
//! `PYTHONHASHSEED`) uses, including the releases where an unset seed makes it random.

use super::algo::HashAlgo;
use super::error::VllmHashError;
use super::version::boundary;
use super::version::VllmVersion;

/// Seed vLLM >= 0.29 uses for the crypto algos when `PYTHONHASHSEED` is unset (`DEFAULT_NONE_HASH_SEED`).
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

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
    pub fn resolve(version: VllmVersion, algo: HashAlgo, pythonhashseed: Option<&str>) -> Result<Self, VllmHashError> {
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
                return Ok(NoneHashRule::AlgoDigestOfSeed { seed: DEFAULT_NONE_HASH_SEED.to_string(), defaulted: true })
            }
            None => return Err(VllmHashError::RandomNoneHash { version, algo }),
        };
        Ok(if version < INIT_NONE_HASH {
            NoneHashRule::PickleSha256IntOfSeed { seed }
        } else if version < BYTES_DIGESTS {
            NoneHashRule::AlgoIntOfSeed { seed }
        } else {
            NoneHashRule::AlgoDigestOfSeed { seed, defaulted: false }
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
