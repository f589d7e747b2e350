//! Engine units: how much of a matched prefix a pod's engine can actually reuse.
//!
//! Why: an engine reuses its own blocks whole. A pod whose engine stores blocks of `E` tokens
//! (vLLM `--block-size 128`, SGLang `--page-size 64`) behind an index of `B`-token canonical
//! blocks serves a prompt's prefix only in multiples of `E`: crediting the canonical blocks
//! inside an engine block it holds, but cannot finish, is a false positive ("predicted 96,
//! engine 0"). So every pod's match is cut to its *unit*, in canonical blocks:
//! - per KV-cache group and tier, the least common multiple of the engine block sizes stored
//!   there since the pod was last cleared (a stream whose events disagree is never credited
//!   past either size; a restart clears the pod, so a new block size is learnt afresh);
//! - for a plain engine, the least common multiple over the tiers it holds group 0 in (exact
//!   for one tier; conservative when an offload tier's blocks differ in size);
//! - times the engine's context-parallel world size (vLLM multiplies its block by it), a
//!   per-pod rule the operator declares ([`PodRules`]).
//!
//! On top of the unit come the engine's own cut rules, as vLLM applies them
//! (`find_longest_cache_hit`): never the prompt's last token (at most `num_tokens - 1`), and
//! with EAGLE/MTP speculative decoding one unit fewer than the hit ([`PodRules::eagle`]).
//! Units are a property of a pod's stream (per group and tier), never of a block: they cost no
//! memory per residency.

use smallvec::SmallVec;

/// Largest context-parallel world size a pod may declare.
pub const MAX_CONTEXT_PARALLEL: u32 = 64;

/// What the operator declares about a pod's engine that its events do not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodRules {
    /// EAGLE/MTP speculative decoding: the engine drops the last block of every hit.
    pub eagle: bool,
    /// Decode/prefill context-parallel world size (vLLM's `dcp * pcp`): the engine's hit unit
    /// is its block times this.
    pub context_parallel: u32,
}

impl Default for PodRules {
    fn default() -> Self {
        PodRules { eagle: false, context_parallel: 1 }
    }
}

impl PodRules {
    /// Checks the rules: `context_parallel` in `1..=`[`MAX_CONTEXT_PARALLEL`].
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_CONTEXT_PARALLEL).contains(&self.context_parallel) {
            return Err(format!(
                "context_parallel must be between 1 and {MAX_CONTEXT_PARALLEL}, got {}",
                self.context_parallel
            ));
        }
        Ok(())
    }
}

/// How one pod's match is cut: its unit in canonical blocks and whether the engine drops a
/// unit for EAGLE. The default (unit 1, no EAGLE) leaves only the last-token cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub unit: u32,
    pub eagle: bool,
}

impl Default for Cut {
    fn default() -> Self {
        Cut { unit: 1, eagle: false }
    }
}

impl Cut {
    /// The blocks credited of a run of `blocks` canonical blocks, the prompt allowing at most
    /// `cap` (see [`cap_blocks`]): whole units only, less one unit with EAGLE.
    pub fn credit(self, blocks: u32, cap: u32) -> u32 {
        let unit = self.unit.max(1);
        let whole = blocks.min(cap) / unit * unit;
        if self.eagle {
            whole.saturating_sub(unit)
        } else {
            whole
        }
    }

    /// Whether scoring may ignore this cut (beyond the last-token cap).
    pub fn is_trivial(self) -> bool {
        self == Cut::default()
    }
}

/// The most canonical blocks of `block_size` tokens a prompt of `num_tokens` tokens can be
/// credited: the engine computes at least its last token, so `⌊(num_tokens - 1) / block_size⌋`.
pub fn cap_blocks(num_tokens: usize, block_size: usize) -> u32 {
    u32::try_from(num_tokens.saturating_sub(1) / block_size.max(1)).unwrap_or(u32::MAX)
}

pub fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Least common multiple, saturating (a unit that large credits nothing, which is safe).
pub fn lcm(a: u32, b: u32) -> u32 {
    if a == 0 || b == 0 {
        return a.max(b);
    }
    // Every store asks, and nearly always of equal units or of 1: no division then.
    if a == b || b == 1 {
        return a;
    }
    if a == 1 {
        return b;
    }
    (a / gcd(a, b)).saturating_mul(b)
}

/// One pod's units per (KV-cache group, tier) since it was last cleared, and the unit it was
/// last credited at (kept across clears, so a pod that restarts is not predicted at a smaller
/// unit before it stores again).
#[derive(Debug, Clone, Default)]
pub struct EngineUnits {
    /// (group, tier id, unit in canonical blocks); a handful at most.
    slots: SmallVec<[(u32, u8, u32); 2]>,
    /// The plain unit and the all-groups unit when `slots` was last non-empty.
    learned: (u32, u32),
}

impl EngineUnits {
    /// Notes a store of engine blocks of `blocks` canonical blocks in `group` and `tier`.
    /// Returns whether its size differs from the slot's unit so far (a stream whose events
    /// disagree on the block size: counted; the unit becomes the least common multiple).
    pub fn note(&mut self, group: u32, tier: u8, blocks: u32) -> bool {
        let blocks = blocks.max(1);
        let changed = match self.slots.iter_mut().find(|s| s.0 == group && s.1 == tier) {
            // The usual store: the size its slot has already (nothing to learn).
            Some(slot) if slot.2 == blocks => return false,
            Some(slot) => {
                let differs = slot.2 != blocks;
                slot.2 = lcm(slot.2, blocks);
                differs
            }
            None => {
                self.slots.push((group, tier, blocks));
                false
            }
        };
        self.learned = (self.plain_now(), self.all_now());
        changed
    }

    /// Forgets the units of what the pod held (it holds nothing now); the learned units stay.
    pub fn clear(&mut self) {
        self.slots.clear();
    }

    /// Whether anything was stored since the last clear.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// A plain engine's unit: the least common multiple over the tiers of group 0, since the
    /// last clear, else the unit learnt before it (1 when none).
    pub fn plain(&self) -> u32 {
        if self.slots.is_empty() {
            self.learned.0.max(1)
        } else {
            self.plain_now()
        }
    }

    /// A hybrid engine's extra alignment: the least common multiple over every group and tier.
    pub fn all(&self) -> u32 {
        if self.slots.is_empty() {
            self.learned.1.max(1)
        } else {
            self.all_now()
        }
    }

    fn plain_now(&self) -> u32 {
        self.slots.iter().filter(|s| s.0 == 0).fold(1, |u, s| lcm(u, s.2))
    }

    fn all_now(&self) -> u32 {
        self.slots.iter().fold(1, |u, s| lcm(u, s.2))
    }

    /// Every slot: (group, tier id, unit).
    pub fn slots(&self) -> &[(u32, u8, u32)] {
        &self.slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_credits_whole_units_under_the_last_token_cap() {
        let four = Cut { unit: 4, eagle: false };
        assert_eq!(four.credit(7, 100), 4, "3 blocks inside an engine block are not reusable");
        assert_eq!(four.credit(8, 100), 8);
        assert_eq!(four.credit(8, 7), 4, "the cap comes first");
        assert_eq!(Cut::default().credit(8, 7), 7);
        let eagle = Cut { unit: 4, eagle: true };
        assert_eq!((eagle.credit(8, 100), eagle.credit(7, 100), eagle.credit(3, 100)), (4, 0, 0));
        assert_eq!(Cut { unit: 1, eagle: true }.credit(5, 100), 4);
        // 64 tokens of blocks of 16: 3 blocks at most (the last token is computed).
        assert_eq!((cap_blocks(64, 16), cap_blocks(65, 16), cap_blocks(0, 16), cap_blocks(1, 16)), (3, 4, 0, 0));
    }

    #[test]
    fn units_are_the_lcm_per_group_and_tier_since_the_last_clear() {
        let mut u = EngineUnits::default();
        assert_eq!((u.plain(), u.all()), (1, 1));
        assert!(!u.note(0, 0, 4));
        assert!(!u.note(0, 0, 4));
        assert!(!u.note(0, 1, 8), "another tier has its own unit");
        assert_eq!(u.plain(), 8, "the lcm over the tiers");
        assert!(u.note(0, 0, 6), "a size the slot has not seen: counted");
        assert_eq!(u.plain(), 24);
        assert!(!u.note(1, 0, 5));
        assert_eq!((u.plain(), u.all()), (24, 120));
        u.clear();
        assert!(u.is_empty());
        assert_eq!(u.plain(), 24, "learnt before the clear, until a store says otherwise");
        u.note(0, 0, 2);
        assert_eq!((u.plain(), u.all()), (2, 2), "a restart with a new block size");
        assert_eq!(lcm(u32::MAX, 2), u32::MAX);
        assert_eq!((lcm(1, 6), lcm(6, 1), lcm(6, 6), lcm(4, 6), lcm(0, 3), lcm(3, 0)), (6, 6, 6, 12, 3, 3));
    }

    #[test]
    fn rules_are_checked() {
        assert!(PodRules::default().validate().is_ok());
        assert!(PodRules { context_parallel: 64, eagle: true }.validate().is_ok());
        for bad in [0, 65] {
            let e = PodRules { context_parallel: bad, eagle: false }.validate().unwrap_err();
            assert!(e.contains("between 1 and 64"), "{e}");
        }
    }
}
