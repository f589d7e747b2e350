//! The sampled cross-check of an SGLang source's published ids: recompute each store's page
//! ids from its tokens with the release's own rules and compare. Matching never depends on it
//! (keys come from tokens); a source whose recomputed ids all mismatch is misconfigured (wrong
//! release, page size or format), and it says so before anyone wonders why scores are 0.
//!
//! A store chains from its parent's full digest, which events do not carry (only its first 8
//! bytes), so the check remembers the digests of the ids it recomputed (bounded) and can check
//! a store whose parent it saw; others are unverifiable. A store of a named adapter (its
//! `extra_key` is not published) is unverifiable where the release namespaces by it. Releases
//! before 0.5.6 hash with Python's `hash()`: nothing is checked.

use rustc_hash::FxHashMap;

use super::namespace::{cache_salt_seed, event_namespace_seed, namespaced_id};
use super::page_hash::{event_id, page_digests, ChainTokens, PageDigest};
use super::release::{EventFormat, SglangRelease};
use crate::vllm_hash::Verification;
use crate::wire::BlockStored;

/// Digests remembered for chaining by default; past it the memory starts over (checks only
/// get rarer).
pub const MAX_REMEMBERED: usize = 65_536;

/// One source's cross-check state.
#[derive(Debug, Clone)]
pub struct PageChainCheck {
    pub release: SglangRelease,
    pub format: EventFormat,
    /// Published id → its full digest, for the stores that continue it.
    digests: FxHashMap<i64, PageDigest>,
    /// Most digests remembered at once.
    limit: usize,
}

impl PageChainCheck {
    pub fn new(release: SglangRelease, format: EventFormat) -> Self {
        Self::with_limit(release, format, MAX_REMEMBERED)
    }

    /// A check remembering at most `limit` digests (a service holding many sources bounds each).
    pub fn with_limit(release: SglangRelease, format: EventFormat, limit: usize) -> Self {
        PageChainCheck { release, format, digests: FxHashMap::default(), limit }
    }

    /// Whether `store` continues a page whose digest this check remembers (a page it matched),
    /// so that checking it costs only its own pages.
    pub fn continues(&self, store: &BlockStored<'_>) -> bool {
        store.parent_block_hash.as_ref().is_some_and(|p| self.digests.contains_key(&(p.key() as i64)))
    }

    /// Forgets every remembered digest (the source was cleared: its pages are gone).
    pub fn clear(&mut self) {
        self.digests.clear();
    }

    /// Checks one store's ids (every page of it, or none).
    pub fn check(&mut self, store: &BlockStored<'_>) -> Verification {
        let mut v = Verification::default();
        let pages = store.block_hashes.len();
        let unverifiable = |v: &mut Verification| (0..pages).for_each(|i| v.record(i, None));
        let Some(tokens) = store.token_ids.as_deref() else {
            unverifiable(&mut v);
            return v;
        };
        let page_size = store.block_size.and_then(|b| usize::try_from(b).ok()).unwrap_or(0);
        let named = store.lora_name.is_some();
        let namespace = self.release.id_namespace(self.format, named);
        if !self.release.hash_reproducible()
            || page_size == 0
            || tokens.len() != pages * page_size
            || (namespace.is_some_and(|(uses_key, _)| uses_key) && named)
        {
            unverifiable(&mut v);
            return v;
        }
        let salt = store.cache_salt;
        let prior = match &store.parent_block_hash {
            None => salt.filter(|_| self.release.salted_event_chain()).map(cache_salt_seed),
            Some(parent) => match self.digests.get(&(parent.key() as i64)) {
                Some(d) => Some(*d),
                None => {
                    unverifiable(&mut v);
                    return v;
                }
            },
        };
        let wide: Vec<u64> = tokens.iter().map(|&t| u64::from(t)).collect();
        let Ok(digests) = page_digests(prior.as_ref(), ChainTokens::Plain(&wide), page_size, self.release.wide_pages())
        else {
            unverifiable(&mut v);
            return v;
        };
        let seed = namespace.and_then(|(_, uses_salt)| event_namespace_seed(None, salt.filter(|_| uses_salt)));
        if self.digests.len() + pages > self.limit {
            self.digests.clear();
        }
        // A store longer than the memory: its last pages are the ones a continuation names.
        let remember_from = pages.saturating_sub(self.limit);
        for (i, (digest, published)) in digests.iter().zip(&store.block_hashes).enumerate() {
            let id = namespaced_id(event_id(digest), seed.as_ref());
            let matched = id as u64 == published.key();
            v.record(i, Some(matched));
            if matched && i >= remember_from {
                self.digests.insert(id, *digest);
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::EngineHash;

    fn store(
        tokens: &[u64],
        parent: Option<i64>,
        prior: Option<&PageDigest>,
    ) -> (BlockStored<'static>, Vec<PageDigest>) {
        let digests = page_digests(prior, ChainTokens::Plain(tokens), 1, false).unwrap();
        let store = BlockStored {
            block_hashes: digests.iter().map(|d| EngineHash::Int(event_id(d))).collect(),
            parent_block_hash: parent.map(EngineHash::Int),
            token_ids: Some(tokens.iter().map(|&t| t as u32).collect()),
            block_size: Some(1),
            ..Default::default()
        };
        (store, digests)
    }

    #[test]
    fn a_bounded_memory_keeps_a_long_stores_last_pages() {
        let mut check = PageChainCheck::with_limit("0.5.23".parse().unwrap(), EventFormat::Default, 4);
        let tokens: Vec<u64> = (1..=10).collect();
        let (root, digests) = store(&tokens, None, None);
        assert_eq!(check.check(&root).matched, 10);
        let (late, _) = store(&[11], Some(event_id(&digests[9])), Some(&digests[9]));
        let (early, _) = store(&[12], Some(event_id(&digests[2])), Some(&digests[2]));
        assert!(check.continues(&late) && !check.continues(&early), "only the last 4 pages are remembered");
        assert_eq!(check.check(&late).matched, 1);
        assert_eq!(check.check(&early).unverifiable, 1);
        check.clear();
        assert!(!check.continues(&late));
    }
}
