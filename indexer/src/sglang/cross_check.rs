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

/// Digests remembered for chaining; past it the memory starts over (checks only get rarer).
pub const MAX_REMEMBERED: usize = 65_536;

/// One source's cross-check state.
#[derive(Debug, Clone)]
pub struct PageChainCheck {
    pub release: SglangRelease,
    pub format: EventFormat,
    /// Published id → its full digest, for the stores that continue it.
    digests: FxHashMap<i64, PageDigest>,
}

fn record(v: &mut Verification, index: usize, outcome: Option<bool>) {
    match outcome {
        None => v.unverifiable = v.unverifiable.saturating_add(1),
        Some(matched) => {
            v.checked = v.checked.saturating_add(1);
            if matched {
                v.matched = v.matched.saturating_add(1);
            } else {
                v.mismatched = v.mismatched.saturating_add(1);
                v.first_mismatch.get_or_insert(u32::try_from(index).unwrap_or(u32::MAX));
            }
        }
    }
}

impl PageChainCheck {
    pub fn new(release: SglangRelease, format: EventFormat) -> Self {
        PageChainCheck { release, format, digests: FxHashMap::default() }
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
        let unverifiable = |v: &mut Verification| (0..pages).for_each(|i| record(v, i, None));
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
        if self.digests.len() + pages > MAX_REMEMBERED {
            self.digests.clear();
        }
        for (i, (digest, published)) in digests.iter().zip(&store.block_hashes).enumerate() {
            let id = namespaced_id(event_id(digest), seed.as_ref());
            let matched = id as u64 == published.key();
            record(&mut v, i, Some(matched));
            if matched {
                self.digests.insert(id, *digest);
            }
        }
        v
    }
}
