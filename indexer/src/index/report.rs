//! What applying events did, for metrics and logs: blocks stored and removed, and every block
//! not applied with the reason ([`SkipReason`]). Skipping is how the index stays exact: it can
//! only under-report.

use crate::vllm_hash::Verification;

/// Why a stored or removed block was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// `parent_block_hash` names a block this pod never stored (or we missed).
    ParentUnknown,
    /// The engine block size is not a multiple of the canonical one (or is a partial block).
    BlockSizeMismatch,
    /// `token_ids` does not cover exactly `block_hashes.len() * block_size` tokens.
    TokenCountMismatch,
    /// A tier re-announcement (no tokens) of a block we do not know.
    UnknownBlock,
    /// A new tier name, with the tier table (or its share for learned names) full.
    TooManyTiers,
    /// A new tier for a source already holding blocks in `max_tiers_per_source` tiers.
    SourceTierLimit,
    /// A `medium` that is no plausible tier name (too long, odd characters).
    BadTierName,
    /// `group_idx` out of range.
    GroupOutOfRange,
    /// The index is at its memory bound.
    IndexFull,
    /// Token ids no query can name (bigram pairs, ids past u32, multimodal placeholders).
    UnkeyableTokens,
    /// A page the engine publishes but does not serve: SGLang's partial last page.
    PartialPage,
}

impl SkipReason {
    pub const ALL: [SkipReason; 11] = [
        SkipReason::ParentUnknown,
        SkipReason::BlockSizeMismatch,
        SkipReason::TokenCountMismatch,
        SkipReason::UnknownBlock,
        SkipReason::TooManyTiers,
        SkipReason::SourceTierLimit,
        SkipReason::BadTierName,
        SkipReason::GroupOutOfRange,
        SkipReason::IndexFull,
        SkipReason::UnkeyableTokens,
        SkipReason::PartialPage,
    ];

    /// Stable metric label.
    pub fn label(self) -> &'static str {
        match self {
            SkipReason::ParentUnknown => "parent_unknown",
            SkipReason::BlockSizeMismatch => "block_size_mismatch",
            SkipReason::TokenCountMismatch => "token_count_mismatch",
            SkipReason::UnknownBlock => "unknown_block",
            SkipReason::TooManyTiers => "too_many_tiers",
            SkipReason::SourceTierLimit => "source_tier_limit",
            SkipReason::BadTierName => "bad_tier_name",
            SkipReason::GroupOutOfRange => "group_out_of_range",
            SkipReason::IndexFull => "index_full",
            SkipReason::UnkeyableTokens => "unkeyable_tokens",
            SkipReason::PartialPage => "partial_page",
        }
    }
}

/// What applying events did, for metrics and logs. Counts are in engine blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub stored_events: u64,
    pub removed_events: u64,
    pub cleared_events: u64,
    pub unknown_events: u64,
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    /// Removals of blocks this pod is not known to hold (stored before we subscribed, say).
    pub removed_unknown: u64,
    pub skipped: [u64; SkipReason::ALL.len()],
    /// Sampled recomputation of the engine's own block hashes (see [`HashCheck`](super::HashCheck)).
    pub hash_check: Verification,
    /// Engine blocks stored in a tier no weight is known for (a name outside llm-d's classes
    /// and not configured): held, but scored 0.
    pub unweighted_tier_blocks: u64,
    /// Stores whose engine block size differs from what the pod stored before in the same
    /// KV-cache group and tier since it was last cleared: applied, and the pod is credited in
    /// units of the least common multiple of the sizes (never past either one).
    pub block_size_changes: u64,
    /// The last engine block size (tokens) refused as not a multiple of the canonical block
    /// (`block_size_mismatch`), for the error that names it.
    pub refused_block_size: Option<u64>,
}

impl ApplyReport {
    pub(crate) fn skip(&mut self, reason: SkipReason, blocks: u64) {
        self.skipped[reason as usize] += blocks;
    }

    pub fn skipped(&self, reason: SkipReason) -> u64 {
        self.skipped[reason as usize]
    }

    pub fn merge(&mut self, other: &ApplyReport) {
        self.stored_events += other.stored_events;
        self.removed_events += other.removed_events;
        self.cleared_events += other.cleared_events;
        self.unknown_events += other.unknown_events;
        self.stored_blocks += other.stored_blocks;
        self.removed_blocks += other.removed_blocks;
        self.removed_unknown += other.removed_unknown;
        for (a, b) in self.skipped.iter_mut().zip(other.skipped) {
            *a += b;
        }
        self.hash_check.merge(&other.hash_check);
        self.unweighted_tier_blocks += other.unweighted_tier_blocks;
        self.block_size_changes += other.block_size_changes;
        self.refused_block_size = other.refused_block_size.or(self.refused_block_size);
    }
}
