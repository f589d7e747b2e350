//! [`VllmHashError`]: why an engine configuration cannot be reproduced or an input is not a hash
//! input. A leaf the other files name, so none of them has to reach into `mod.rs`.

use super::algo::HashAlgo;
use super::version::VllmVersion;

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
