//! A pod's KV-cache groups as its engine describes them: each group's attention kind and block
//! size. A leaf that ingest (which learns them from events), the hybrid coordinator (which
//! scores by them) and export (which carries them) all read.

/// KV-cache groups a pod may use (hybrid models have a handful).
pub const MAX_GROUPS: usize = 64;

/// A KV-cache group's attention kind, as the engine names it (`kv_cache_spec_kind`, vLLM
/// 0.22+). It decides which blocks of a prefix the group needs for vLLM to serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// Every block of the prefix (`full_attention`, `mla_attention`, `sink_full_attention`).
    Full,
    /// The blocks of the window before the cut (`sliding_window`, `sliding_window_mla`).
    SlidingWindow { tokens: u32 },
    /// The block just before the cut (`mamba`).
    Mamba,
    /// Named kinds vLLM serves no less than a fully held prefix of (`chunked_local_attention`),
    /// and groups whose kind the engine does not publish (before 0.22): scored as full
    /// attention, which can only under-report.
    AsFull,
    /// Kinds kvindex does not model (`cross_attention`, `encoder_only_attention`, `unknown`,
    /// anything new): a pod with such a group is not scored at all rather than guessed.
    Unscored,
}

impl GroupKind {
    /// The kind an event's `kv_cache_spec_kind` (and window) names. A group whose events name
    /// no kind stays [`GroupKind::AsFull`].
    pub(super) fn from_event(kind: &str, window: Option<i64>) -> GroupKind {
        match kind {
            "full_attention" | "mla_attention" | "sink_full_attention" => GroupKind::Full,
            "sliding_window" | "sliding_window_mla" => match window.and_then(|w| u32::try_from(w).ok()) {
                Some(tokens) if tokens > 0 => GroupKind::SlidingWindow { tokens },
                _ => GroupKind::Unscored,
            },
            "mamba" => GroupKind::Mamba,
            "chunked_local_attention" => GroupKind::AsFull,
            _ => GroupKind::Unscored,
        }
    }
}

/// What a pod's engine said about one KV-cache group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSpec {
    pub kind: GroupKind,
    /// The group's block size in tokens (the largest full block seen; 0 = none stored yet).
    pub block_tokens: u32,
}

/// Whether group 0 alone, as full attention, decides this pod's score.
pub fn is_plain(groups: &[Option<GroupSpec>]) -> bool {
    match groups {
        [] => true,
        [Some(g)] => matches!(g.kind, GroupKind::Full | GroupKind::AsFull),
        [None] => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: GroupKind, bt: u32) -> Option<GroupSpec> {
        Some(GroupSpec { kind, block_tokens: bt })
    }

    const FULL: GroupKind = GroupKind::Full;

    #[test]
    fn plain_pods_skip_all_of_this() {
        assert!(is_plain(&[]));
        assert!(is_plain(&[spec(FULL, 16)]));
        assert!(is_plain(&[spec(GroupKind::AsFull, 16)]));
        assert!(!is_plain(&[spec(GroupKind::SlidingWindow { tokens: 32 }, 16)]));
        assert!(!is_plain(&[spec(FULL, 16), spec(FULL, 16)]));
    }
}
