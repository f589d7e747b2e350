//! What an event published ([`PublishedHash`], [`ParentRef`]) and what recomputing it found
//! ([`Verification`]): the inputs and outcome of the sampled cross-check.

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

    /// Counts one block's outcome: `Some(matched)` when it was recomputed, `None` when it
    /// cannot be without guessing. Shared by vLLM's and SGLang's cross-checks.
    pub(crate) fn record(&mut self, block_index: usize, outcome: Option<bool>) {
        match outcome {
            Some(matched) => {
                self.checked = self.checked.saturating_add(1);
                if matched {
                    self.matched = self.matched.saturating_add(1);
                } else {
                    self.mismatched = self.mismatched.saturating_add(1);
                    self.first_mismatch.get_or_insert(u32::try_from(block_index).unwrap_or(u32::MAX));
                }
            }
            None => self.unverifiable = self.unverifiable.saturating_add(1),
        }
    }
}
