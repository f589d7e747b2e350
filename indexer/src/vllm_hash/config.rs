//! [`VllmHashConfig`]: the engine settings a block hash depends on, as one value the hasher is
//! built from.

use super::algo::HashAlgo;
use super::version::VllmVersion;

/// What the engine runs with; everything needed to reproduce its block hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VllmHashConfig {
    pub version: VllmVersion,
    pub algo: HashAlgo,
    /// `PYTHONHASHSEED` of the engine process; `None` = unset.
    pub pythonhashseed: Option<String>,
}
