//! SGLang before 0.5.6: stores that cannot be placed in a chain. Those releases name a page
//! `hash(tuple(page))` (Python's builtin hash: not position-aware) and their radix cache's
//! `_record_store_event` publishes the first page of every node with no parent at all (its
//! test `node.parent is None or node != self.root_node` always holds), so a node that extends
//! a cached prefix looks exactly like a new chain from the first token. Keying it so credits
//! a prompt that starts with the continuation's tokens: a false positive. Nothing in such a
//! store says where its pages sit, so it never credits (counted as `parent_unknown`).
//!
//! The releases are recognised by the rule their ids follow, not by a version setting: a
//! store whose first id is CPython's tuple hash of its first page (an SHA-256 id equals it
//! with probability 2^-64). CPython's tuple hash (3.8+, 64-bit) is deterministic for ints:
//! `hash(n) == n` for `0 <= n < 2^61 - 1`, so every u32 token hashes to itself.

use crate::wire::{EngineHash, Event, EventBatch};

const XXPRIME_1: u64 = 11_400_714_785_074_694_791;
const XXPRIME_2: u64 = 14_029_467_366_897_019_727;
const XXPRIME_5: u64 = 2_870_177_450_012_600_261;

/// CPython's `hash(tuple(tokens))` for u32 token ids (`tuplehash`, Objects/tupleobject.c).
pub fn python_tuple_hash(tokens: &[u32]) -> i64 {
    let mut acc = XXPRIME_5;
    for &t in tokens {
        acc = acc.wrapping_add(u64::from(t).wrapping_mul(XXPRIME_2));
        acc = acc.rotate_left(31);
        acc = acc.wrapping_mul(XXPRIME_1);
    }
    acc = acc.wrapping_add((tokens.len() as u64) ^ (XXPRIME_5 ^ 3_527_539));
    if acc == u64::MAX {
        return 1_546_275_796;
    }
    acc as i64
}

/// Whether `id` is what a release before 0.5.6 names a page of `page` tokens.
fn is_builtin_id(id: &EngineHash<'_>, page: &[u32]) -> bool {
    let h = python_tuple_hash(page);
    match *id {
        EngineHash::Int(i) => i == h,
        EngineHash::Uint(u) => i64::try_from(u).is_ok_and(|u| u == h),
        EngineHash::Bytes(_) => false,
    }
}

/// Drops the stores of a release before 0.5.6 from `batch` (see the module doc); returns the
/// engine blocks dropped, for the caller to count as `parent_unknown`.
pub fn drop_unplaceable(batch: &mut EventBatch<'_>) -> u64 {
    let mut dropped = 0u64;
    batch.events.retain(|event| {
        let Event::BlockStored(store) = event else { return true };
        let (Some(tokens), Some(first)) = (store.token_ids.as_deref(), store.block_hashes.first()) else {
            return true;
        };
        let pages = store.block_hashes.len();
        if tokens.is_empty() || !tokens.len().is_multiple_of(pages) {
            return true; // not pages of one length: the page rules judge it
        }
        if is_builtin_id(first, &tokens[..tokens.len() / pages]) {
            dropped += pages as u64;
            return false;
        }
        true
    });
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::BlockStored;

    #[test]
    fn cpython_tuple_hashes() {
        // python3 -c "print(hash((1,2,3)), hash((7,)), hash(tuple(range(16))), hash(()), hash((4294967295, 0)))"
        assert_eq!(python_tuple_hash(&[1, 2, 3]), 529_344_067_295_497_451);
        assert_eq!(python_tuple_hash(&[7]), -6_198_871_656_470_064_846);
        assert_eq!(python_tuple_hash(&(0..16).collect::<Vec<_>>()), 2_828_489_712_818_767_170);
        assert_eq!(python_tuple_hash(&[]), 5_740_354_900_026_072_187);
        assert_eq!(python_tuple_hash(&[u32::MAX, 0]), -4_749_709_417_860_325_614);
    }

    fn stored(id: EngineHash<'static>, tokens: Vec<u32>) -> Event<'static> {
        let block_size = Some(tokens.len() as i64);
        Event::BlockStored(BlockStored {
            block_hashes: vec![id],
            token_ids: Some(tokens),
            block_size,
            ..Default::default()
        })
    }

    #[test]
    fn a_pre_0_5_6_store_is_dropped_and_a_sha256_one_kept() {
        let page = vec![41u32, 42, 43];
        let mut batch = EventBatch {
            ts: 0.0,
            events: vec![
                // 0.5.5's store of a node continuing a cached prefix: no parent, builtin id.
                stored(EngineHash::Int(python_tuple_hash(&page)), page.clone()),
                // 0.5.6+: the page chain's SHA-256 id of the same tokens.
                stored(EngineHash::Uint(7_470_307_888_890_966_271), page.clone()),
                Event::AllBlocksCleared { other: vec![] },
            ],
            data_parallel_rank: None,
        };
        assert_eq!(drop_unplaceable(&mut batch), 1);
        assert_eq!(batch.events.len(), 2);
        assert!(
            matches!(&batch.events[0], Event::BlockStored(s) if s.block_hashes[0] == EngineHash::Uint(7_470_307_888_890_966_271))
        );
    }
}
