//! [`KvIndex::pod_digest`]: a pod's residency sums, kept by the tree as it edits the pod's
//! runs, combined under the tiers' names into the one number two replicas compare (the
//! arithmetic is in [`digest`](super::digest); this file reads it off a live index).

use super::digest::combine;
use super::kv_index::KvIndex;
use super::tiers::TierId;

/// What a replica holds for a pod, in one comparable number (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodDigest {
    pub digest: u64,
    /// Blocks held in any tier.
    pub blocks: u64,
}

impl KvIndex {
    /// What this index holds for `pod`, as a digest another replica's can be compared with
    /// (None: the pod is unknown here). O(tiers): the sums are kept up to date by every edit.
    pub fn pod_digest(&self, pod: &str) -> Option<PodDigest> {
        let id = self.pods.get(pod)?;
        let state = self.states.read().get(&id).cloned()?;
        let (sums, blocks, tier_blocks) = {
            let state = state.lock();
            (state.digest_sums(), state.blocks(), state.tier_blocks())
        };
        let names: Vec<String> = (0..sums.len()).map(|t| self.tiers.name(TierId(t as u8))).collect();
        let tiers = names.iter().zip(tier_blocks).zip(sums).map(|((name, n), sum)| (name.as_str(), n, sum));
        Some(PodDigest { digest: combine(tiers), blocks })
    }
}
