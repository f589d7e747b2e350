//! The ids a release publishes for one radix path: its nodes' pages chained node to node
//! (`compute_node_event_hash_values`), the salt seed, the namespace re-hash, and the storage
//! (HiCache) chain where it differs. `kvindex sglang-hash` prints this for the vectors'
//! `hashes-sglang.jsonl` records; the ingest cross-check uses the same rules.

use super::namespace::{cache_salt_seed, event_namespace_seed, namespaced_id, storage_namespace_seed};
use super::page_hash::{event_id, page_digests, ChainTokens, PageDigest, PageHashError};
use super::release::{EventFormat, SglangRelease};

/// One radix path of a release's cache.
#[derive(Debug, Clone, Copy)]
pub struct RadixPath<'a> {
    pub release: SglangRelease,
    pub format: EventFormat,
    pub page_size: usize,
    /// The whole path's tokens (a bigram path: one raw id past its last position).
    pub tokens: ChainTokens<'a>,
    /// Node lengths in positions, root first; they sum to the path's length.
    pub segments: &'a [usize],
    /// The request's `extra_key` (its adapter id, for LoRA requests).
    pub extra_key: Option<&'a str>,
    /// The adapter's public name, when the release knows one for `extra_key`.
    pub lora_name: Option<&'a str>,
    pub cache_salt: Option<&'a str>,
}

/// What the release publishes for a [`RadixPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathIds {
    /// The event chain's seed (a salted request, 0.5.19+).
    pub chain_seed: Option<PageDigest>,
    pub page_digests: Vec<PageDigest>,
    /// The namespace published ids are re-hashed in.
    pub namespace_seed: Option<PageDigest>,
    /// `event_id` of each page digest.
    pub ids_unnamespaced: Vec<i64>,
    /// The ids as published.
    pub ids: Vec<i64>,
    /// `BlockStored.lora_name` as published.
    pub lora_name: Option<String>,
    /// The storage chain, when it differs from the event chain.
    pub storage_digests: Option<Vec<PageDigest>>,
}

/// Why a path's ids cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The release would raise (and publish nothing): its message.
    #[error("{0}")]
    Refused(&'static str),
    #[error("releases before 0.5.6 hash pages with Python's hash(): not reproducible")]
    NotReproducible,
    #[error("segments cover {covered} positions, the tokens {len}")]
    Segments { covered: usize, len: usize },
    #[error(transparent)]
    Hash(#[from] PageHashError),
}

/// The chain over `path`'s nodes from `seed`: each node restarts its pages at its own start
/// and chains from the previous node's last digest.
fn node_chain(path: &RadixPath<'_>, seed: Option<PageDigest>) -> Result<Vec<PageDigest>, PathError> {
    let mut out = Vec::new();
    let mut prior = seed;
    let mut start = 0;
    for &len in path.segments {
        let end = start + len;
        let node = match path.tokens {
            ChainTokens::Plain(t) => ChainTokens::Plain(&t[start..end]),
            ChainTokens::Bigram(t) => ChainTokens::Bigram(&t[start..=end]),
        };
        let digests = match page_digests(prior.as_ref(), node, path.page_size, path.release.wide_pages()) {
            Err(PageHashError::WideToken(_)) => return Err(PathError::Refused(path.release.wide_token_error())),
            Err(PageHashError::TokenPastInt64(_)) => return Err(PathError::Refused(path.release.past_int64_error())),
            other => other?,
        };
        if let Some(last) = digests.last() {
            prior = Some(*last);
        }
        out.extend(digests);
        start = end;
    }
    Ok(out)
}

/// The ids `path.release` publishes for `path`.
pub fn path_ids(path: &RadixPath<'_>) -> Result<PathIds, PathError> {
    let release = path.release;
    if !release.hash_reproducible() {
        return Err(PathError::NotReproducible);
    }
    let len = path.tokens.logical_len();
    let covered: usize = path.segments.iter().sum();
    if covered != len {
        return Err(PathError::Segments { covered, len });
    }
    let salt = path.cache_salt;
    let chain_seed = salt.filter(|_| release.salted_event_chain()).map(cache_salt_seed);
    let page_digests = node_chain(path, chain_seed)?;
    let storage_seed =
        if release.namespaced_storage_chain() { storage_namespace_seed(path.extra_key, salt) } else { None };
    let storage = if storage_seed == chain_seed { None } else { Some(node_chain(path, storage_seed)?) };
    let named = path.extra_key.is_some() && path.lora_name.is_some();
    let namespace_seed = release.id_namespace(path.format, named).and_then(|(uses_key, uses_salt)| {
        event_namespace_seed(path.extra_key.filter(|_| uses_key), salt.filter(|_| uses_salt))
    });
    let ids_unnamespaced: Vec<i64> = page_digests.iter().map(event_id).collect();
    let ids = ids_unnamespaced.iter().map(|&id| namespaced_id(id, namespace_seed.as_ref())).collect();
    // The name is looked up by the request's extra_key: without one there is none.
    let lora_name = path.lora_name.filter(|_| named && release.publishes_lora_name(path.format)).map(str::to_string);
    Ok(PathIds {
        chain_seed,
        storage_digests: storage.filter(|s| *s != page_digests),
        page_digests,
        namespace_seed,
        ids_unnamespaced,
        ids,
        lora_name,
    })
}
