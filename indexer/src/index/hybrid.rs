//! Hybrid models: a prefix counts only where every KV-cache group of the pod's engine can serve
//! it, as vLLM's `HybridKVCacheCoordinator.find_longest_cache_hit` decides.
//!
//! Why: a hybrid model (full attention plus sliding-window layers, or Mamba layers) keeps one
//! KV-cache group per layer kind, and vLLM reuses a prefix only as far as all of them can
//! serve it. Scoring group 0 alone over-reports whenever another group evicted what it needs.
//!
//! Each group kind has its own rule for which lengths `L` (in blocks) it can serve:
//! - full attention: every block of `[0, L)` is held;
//! - sliding window of `w` tokens (group block `b` tokens): the `cdiv(w - 1, b)` group blocks
//!   before `L` are held (or every block, when `L` is shorter than that);
//! - Mamba: the group block ending at `L` is held;
//! - `L` is a multiple of the group's block, and of the pod's unit (see `units`: the block
//!   sizes its events carried in every group and tier, times its context-parallel size).
//!
//! The coordinator starts from the longest hit the prompt allows (`num_tokens - 1` tokens) and
//! lets each group cut it down to the longest length it can serve, until no group cuts it:
//! the longest length all groups can serve. Groups whose kind the engine does not name (vLLM
//! before 0.22) are held to the full-attention rule, which every kind vLLM caches accepts, so
//! it can only under-report; a pod with a group kind kvindex does not model is not scored.
//!
//! With EAGLE, vLLM drops the last block of every group's hit, and a sliding-window group
//! needs one more contiguous block to keep one after the drop: scored here as windows one group
//! block longer, and the coordinated length less one step. vLLM's releases differ in how they
//! combine the drop across groups; this rule is never longer than any of them.

use crate::index::groups::{GroupKind, GroupSpec};
use crate::index::pods::PodId;
use crate::index::score::PodMatch;
use crate::index::tiers::{Tiers, MAX_TIERS};
use crate::index::tree::Span;
use crate::index::units::{lcm, Cut};

/// What scoring needs to know about a pod's engine: its KV-cache groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    /// Per group index (None = never seen).
    pub groups: Vec<Option<GroupSpec>>,
}

impl GroupPlan {
    /// Group indices that take part, in the order the coordinator consults them (full
    /// attention first, as vLLM sorts them).
    pub fn order(&self) -> Vec<u32> {
        let mut order: Vec<(bool, u32)> = self
            .groups
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.map(|g| (!matches!(g.kind, GroupKind::Full | GroupKind::AsFull), i as u32)))
            .collect();
        order.sort_unstable();
        order.into_iter().map(|(_, i)| i).collect()
    }
}

/// Held spans of one pod in one group along the prompt's chain: `(start, end, tiers)` in
/// canonical blocks, in chain order.
#[derive(Debug, Default, Clone)]
pub struct Held {
    pub spans: Vec<(u32, u32, u8)>,
}

impl Held {
    pub fn push(&mut self, span: &Span<'_>, tiers: u8) {
        let (s, e) = (span.depth, span.depth + span.len);
        match self.spans.last_mut() {
            Some(last) if last.1 == s && last.2 == tiers => last.1 = e,
            _ => self.spans.push((s, e, tiers)),
        }
    }

    /// Maximal held intervals (tiers ignored).
    fn intervals(&self) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for &(s, e, _) in &self.spans {
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => out.push((s, e)),
            }
        }
        out
    }
}

/// The rule of one group, in canonical blocks.
#[derive(Debug, Clone, Copy)]
enum Rule {
    Full,
    /// Contiguous canonical blocks needed before the cut.
    Window(u32),
    Mamba,
}

/// The longest length ≤ `max` that group `rule` can serve from `held`, a multiple of `step`
/// (every group's block divides it).
fn longest(rule: Rule, held: &[(u32, u32)], max: u32, step: u32) -> u32 {
    let down = |x: u32| x / step * step;
    match rule {
        Rule::Full => match held.first() {
            Some(&(0, e)) => down(e.min(max)),
            _ => 0,
        },
        Rule::Window(need) => {
            for &(s, e) in held.iter().rev() {
                if s > max {
                    continue;
                }
                let l = down(e.min(max));
                if l > s && (s == 0 || l - s >= need) {
                    return l;
                }
                if s == 0 {
                    return 0;
                }
            }
            0
        }
        Rule::Mamba => {
            for &(s, e) in held.iter().rev() {
                if s >= max {
                    continue;
                }
                let l = down(e.min(max));
                if l > s {
                    return l;
                }
            }
            0
        }
    }
}

/// A pod's hybrid match: the longest prefix of at most `max_blocks` canonical blocks that
/// every group of `plan` can serve, given what the pod holds per group (`held[g]`, same
/// indices as `plan.order()`), a multiple of `cut`'s unit, less a step with EAGLE. `None` when
/// the pod is not scored (a group kind not modelled).
pub fn coordinate(
    pod: PodId,
    plan: &GroupPlan,
    held: &[Held],
    max_blocks: u32,
    block_size: u32,
    cut: Cut,
    weights: &[f64; MAX_TIERS],
) -> Option<PodMatch> {
    let order = plan.order();
    let mut rules = Vec::with_capacity(order.len());
    let mut step = cut.unit.max(1);
    for &g in &order {
        let spec = plan.groups[g as usize].expect("ordered groups are known");
        let ratio = (spec.block_tokens / block_size.max(1)).max(1);
        step = lcm(step, ratio);
        let rule = match spec.kind {
            GroupKind::Full | GroupKind::AsFull => Rule::Full,
            GroupKind::SlidingWindow { tokens } => {
                let group_block = ratio * block_size;
                let eagle = if cut.eagle { ratio } else { 0 };
                Rule::Window(tokens.saturating_sub(1).div_ceil(group_block) * ratio + eagle)
            }
            GroupKind::Mamba => Rule::Mamba,
            GroupKind::Unscored => return None,
        };
        rules.push(rule);
    }
    let intervals: Vec<Vec<(u32, u32)>> = held.iter().map(Held::intervals).collect();
    let mut len = max_blocks / step * step;
    loop {
        let start = len;
        for (k, &rule) in rules.iter().enumerate() {
            len = longest(rule, &intervals[k], len, step);
        }
        if len == start || len == 0 {
            break;
        }
    }
    if cut.eagle {
        len = len.saturating_sub(step);
    }
    let mut m = PodMatch::new(pod);
    if len == 0 {
        return Some(m);
    }
    // Tiers come from the first group (full attention when there is one): its blocks before
    // the cut, at their best tier weight.
    let mut counted = 0;
    for &(s, e, tiers) in held.first().map_or(&[][..], |h| &h.spans[..]) {
        let e = e.min(len);
        if s >= e {
            break;
        }
        m.extend(tiers, e - s, weights);
        counted += e - s;
    }
    // Blocks the first group does not hold (a window or Mamba group) count at full weight.
    if counted < len {
        m.matched_blocks += len - counted;
        m.weighted_score += f64::from(len - counted) * Tiers::best_weight(weights, 1);
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: GroupKind, bt: u32) -> Option<GroupSpec> {
        Some(GroupSpec { kind, block_tokens: bt })
    }

    fn held(intervals: &[(u32, u32)]) -> Held {
        Held { spans: intervals.iter().map(|&(s, e)| (s, e, 1)).collect() }
    }

    fn hit(plan: &[Option<GroupSpec>], held_by_group: &[&[(u32, u32)]], max: u32) -> u32 {
        let plan = GroupPlan { groups: plan.to_vec() };
        let order = plan.order();
        let h: Vec<Held> = order.iter().map(|&g| held(held_by_group[g as usize])).collect();
        coordinate(PodId(0), &plan, &h, max, 16, Cut::default(), &Tiers::new().weights())
            .map_or(u32::MAX, |m| m.matched_blocks)
    }

    const FULL: GroupKind = GroupKind::Full;

    #[test]
    fn full_plus_sliding_window_as_vllm_probe_cases() {
        // Block 32 tokens = 2 canonical blocks of 16; window 64 tokens → cdiv(63, 32) = 2 group
        // blocks = 4 canonical before the cut. 8 group blocks = 16 canonical.
        let plan = [spec(FULL, 32), spec(GroupKind::SlidingWindow { tokens: 64 }, 32)];
        let all: &[(u32, u32)] = &[(0, 16)];
        assert_eq!(hit(&plan, &[all, all], 16), 16);
        // SWA evicted group blocks 6,7 → canonical 12..16.
        assert_eq!(hit(&plan, &[all, &[(0, 12)]], 16), 12);
        // SWA evicted block 5 only (outside the last window).
        assert_eq!(hit(&plan, &[all, &[(0, 10), (12, 16)]], 16), 16);
        // SWA evicted 1, 3, 6.
        assert_eq!(hit(&plan, &[all, &[(0, 2), (4, 6), (8, 12), (14, 16)]], 16), 12);
        // SWA evicted 7 only.
        assert_eq!(hit(&plan, &[all, &[(0, 14)]], 16), 14);
        // Full evicted 2.
        assert_eq!(hit(&plan, &[&[(0, 4), (6, 16)], all], 16), 4);
        // Full evicted 5, SWA evicted 4.
        assert_eq!(hit(&plan, &[&[(0, 10), (12, 16)], &[(0, 8), (10, 16)]], 16), 8);
    }

    #[test]
    fn mamba_needs_the_block_at_the_cut_and_unknown_kinds_are_not_scored() {
        let plan = [spec(FULL, 16), spec(GroupKind::Mamba, 16)];
        assert_eq!(hit(&plan, &[&[(0, 10)], &[(3, 4), (6, 7)]], 10), 7);
        assert_eq!(hit(&plan, &[&[(0, 5)], &[(3, 4), (6, 7)]], 10), 4);
        assert_eq!(hit(&plan, &[&[(0, 10)], &[]], 10), 0);
        let plan = [spec(FULL, 16), spec(GroupKind::Unscored, 16)];
        assert_eq!(hit(&plan, &[&[(0, 10)], &[(0, 10)]], 10), u32::MAX);
    }

    #[test]
    fn two_windows_iterate_to_a_length_both_serve() {
        // Windows of 2 and 3 canonical blocks (33 and 48 tokens), block 16.
        let plan = [
            spec(FULL, 16),
            spec(GroupKind::SlidingWindow { tokens: 33 }, 16),
            spec(GroupKind::SlidingWindow { tokens: 48 }, 16),
        ];
        let full: &[(u32, u32)] = &[(0, 12)];
        // Group 1 serves 12, 9 (…); group 2 serves 8 but not 12 or 9: the answer is 8.
        let w2: &[(u32, u32)] = &[(0, 3), (6, 9), (10, 12)];
        let w3: &[(u32, u32)] = &[(0, 1), (4, 8), (11, 12)];
        assert_eq!(hit(&plan, &[full, w2, w3], 12), 8);
    }
}
