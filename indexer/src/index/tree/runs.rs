//! A segment's runs: its blocks split into maximal ranges that the same holders (pod and tier
//! bits) hold, so a chain held by the same pods is one run however long it is.
//!
//! A published run list changes in one way only: a chain's only holder appending to it grows
//! the last run and the length in place (the new blocks' hashes are written first, then the
//! run's end, then the length, so a reader that sees a length sees everything before it).
//! Every other change builds a new list (copy-on-write) that the tree swaps in, so a reader
//! always sees one consistent list. The functions here are pure: they take a list and return
//! the edited list and what changed, per position.

use std::sync::atomic::{AtomicU32, Ordering};

use smallvec::SmallVec;

use crate::index::pods::PodId;
use crate::index::tiers::MAX_TIERS;

/// One pod's residency of a block: pod id in the high 24 bits, tier bits in the low 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct Holder(u32);

impl Holder {
    pub fn new(pod: PodId, tiers: u8) -> Self {
        Holder((pod.0 << 8) | u32::from(tiers))
    }
    pub fn pod(self) -> PodId {
        PodId(self.0 >> 8)
    }
    pub fn tiers(self) -> u8 {
        self.0 as u8
    }
}

/// Holders of a run, sorted by pod.
pub type Holders = SmallVec<[Holder; 2]>;

/// Positions `[previous run's end, end)` of a segment, held by `holders` (possibly none: a
/// block kept only because later blocks or children hang off it).
#[derive(Debug)]
pub struct Run {
    end: AtomicU32,
    pub holders: Holders,
}

impl Run {
    fn new(end: u32, holders: Holders) -> Self {
        Run { end: AtomicU32::new(end), holders }
    }

    /// End of the run (may exceed the list's `len()` while an append is under way).
    #[inline]
    pub fn end(&self) -> u32 {
        self.end.load(Ordering::Acquire)
    }
}

impl Clone for Run {
    fn clone(&self) -> Self {
        Run::new(self.end(), self.holders.clone())
    }
}

impl PartialEq for Run {
    fn eq(&self, other: &Self) -> bool {
        self.end() == other.end() && self.holders == other.holders
    }
}

/// A segment's visible length and its runs (covering `[0, len)`, adjacent runs differ).
#[derive(Debug)]
pub struct Runs {
    len: AtomicU32,
    pub runs: SmallVec<[Run; 1]>,
}

impl Clone for Runs {
    fn clone(&self) -> Self {
        Runs { len: AtomicU32::new(self.len()), runs: self.runs.clone() }
    }
}

impl PartialEq for Runs {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.runs == other.runs
    }
}

/// What an edit changed, counted in positions (blocks) of the edited pod, plus the ranges
/// that lost their last holder or gained their first one.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EditStats {
    /// Positions the pod held in no tier before and holds now.
    pub gained: u64,
    /// Positions the pod held before and holds in no tier now.
    pub lost: u64,
    /// Positions that gained / lost each tier bit.
    pub tier_gained: [u64; MAX_TIERS],
    pub tier_lost: [u64; MAX_TIERS],
    /// Positions that had no holder and now have one.
    pub became_held: u64,
    /// Ranges `[start, end)` that had holders and now have none.
    pub became_unheld: SmallVec<[(u32, u32); 2]>,
    /// Per tier bit, the wrapping sum of the residency hashes (`digest::residency`) of the
    /// positions that gained it, less those of the positions that lost it: what the pod's
    /// digest moves by. Filled by the tree, which knows the blocks' keys.
    pub digest: [u64; MAX_TIERS],
}

impl EditStats {
    pub fn merge(&mut self, other: &EditStats) {
        self.gained += other.gained;
        self.lost += other.lost;
        for i in 0..MAX_TIERS {
            self.tier_gained[i] += other.tier_gained[i];
            self.tier_lost[i] += other.tier_lost[i];
        }
        self.became_held += other.became_held;
        self.became_unheld.extend_from_slice(&other.became_unheld);
        for (sum, d) in self.digest.iter_mut().zip(other.digest) {
            *sum = sum.wrapping_add(d);
        }
    }
}

impl Runs {
    fn empty(len: u32) -> Self {
        Runs { len: AtomicU32::new(len), runs: SmallVec::new() }
    }

    /// A new segment of `unheld` blocks nobody holds, then `held` blocks held by `holder`.
    pub fn new_held(unheld: u32, held: u32, holder: Holder) -> Self {
        Runs::empty(0).extended(unheld, held, holder)
    }

    /// Visible length: positions `[0, len)` are described and their hashes written.
    #[inline]
    pub fn len(&self) -> u32 {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `add` positions held by `holder` in place, when the last run is exactly
    /// `holder`'s (the caller wrote their hashes and holds the segment's writer lock).
    /// Returns false (changing nothing) otherwise.
    pub fn grow_in_place(&self, add: u32, holder: Holder) -> bool {
        match self.runs.last() {
            Some(last) if last.holders.len() == 1 && last.holders[0] == holder => {
                let len = self.len();
                last.end.store(len + add, Ordering::Release);
                self.len.store(len + add, Ordering::Release);
                true
            }
            _ => false,
        }
    }

    /// Index of the run holding position `pos` (< len).
    pub fn run_at(&self, pos: u32) -> usize {
        self.runs.partition_point(|r| r.end() <= pos)
    }

    /// Start of run `i`.
    pub fn start_of(&self, i: usize) -> u32 {
        if i == 0 {
            0
        } else {
            self.runs[i - 1].end()
        }
    }

    /// The tiers `pod` holds position `pos` in (0 = not held, or past the end).
    pub fn tiers_at(&self, pos: u32, pod: PodId) -> u8 {
        if pos >= self.len() {
            return 0;
        }
        tiers_in(&self.runs[self.run_at(pos)].holders, pod)
    }

    /// Whether `pod` holds any position of the segment.
    pub fn holds_any(&self, pod: PodId) -> bool {
        self.runs.iter().any(|r| tiers_in(&r.holders, pod) != 0)
    }

    /// End of the last held position (0 when nothing is held).
    pub fn held_end(&self) -> u32 {
        for i in (0..self.runs.len()).rev() {
            if !self.runs[i].holders.is_empty() {
                return self.runs[i].end().min(self.len());
            }
        }
        0
    }

    /// Positions in `[start, end)` that `pod` does not hold yet.
    pub fn unheld_by(&self, start: u32, end: u32, pod: PodId) -> u64 {
        let mut n = 0;
        self.for_each_piece(start, end, |s, e, hs| {
            if tiers_in(hs, pod) == 0 {
                n += u64::from(e - s);
            }
        });
        n
    }

    /// The sub-ranges of `[start, end)` that `pod` holds, with the tiers it holds each in.
    pub fn held_pieces(&self, start: u32, end: u32, pod: PodId) -> SmallVec<[(u32, u32, u8); 2]> {
        let mut out: SmallVec<[(u32, u32, u8); 2]> = SmallVec::new();
        self.for_each_piece(start, end, |s, e, hs| {
            let tiers = tiers_in(hs, pod);
            if tiers != 0 {
                match out.last_mut() {
                    Some(last) if last.1 == s && last.2 == tiers => last.1 = e,
                    _ => out.push((s, e, tiers)),
                }
            }
        });
        out
    }

    /// The end `e` ≤ `end` such that `[start, e)` holds exactly `grant` positions `pod` does not
    /// hold yet (or `end` when there are fewer).
    pub fn cut_after_new(&self, start: u32, end: u32, pod: PodId, grant: u64) -> u32 {
        let mut left = grant;
        let mut cut = end;
        let mut done = false;
        self.for_each_piece(start, end, |s, e, hs| {
            if done || tiers_in(hs, pod) != 0 {
                return;
            }
            let n = u64::from(e - s);
            if n > left {
                cut = s + left as u32;
                done = true;
            } else {
                left -= n;
            }
        });
        cut
    }

    fn for_each_piece(&self, start: u32, end: u32, mut f: impl FnMut(u32, u32, &Holders)) {
        let end = end.min(self.len());
        if start >= end {
            return;
        }
        let mut i = self.run_at(start);
        let mut s = start;
        while s < end {
            let e = self.runs[i].end().min(end);
            f(s, e, &self.runs[i].holders);
            s = e;
            i += 1;
        }
    }

    /// The list with `pod`'s tiers `t` replaced by `change(t)` on `[start, end)`.
    pub fn edit(&self, start: u32, end: u32, pod: PodId, change: impl Fn(u8) -> u8, stats: &mut EditStats) -> Runs {
        self.edit_with(start, end, pod, change, stats, |_, _, _, _| {})
    }

    /// [`edit`](Self::edit), telling `changed` each piece `[a, b)` whose tiers went from
    /// `before` to `after` (the tree folds them into the pod's digest).
    pub fn edit_with(
        &self,
        start: u32,
        end: u32,
        pod: PodId,
        change: impl Fn(u8) -> u8,
        stats: &mut EditStats,
        mut changed: impl FnMut(u32, u32, u8, u8),
    ) -> Runs {
        let len = self.len();
        let end = end.min(len);
        let mut out = Runs::empty(len);
        let mut s = 0;
        for run in &self.runs {
            let (rs, re) = (s, run.end().min(len));
            s = re;
            if re <= start || rs >= end {
                push_run(&mut out, re, run.holders.clone());
                continue;
            }
            if rs < start {
                push_run(&mut out, start, run.holders.clone());
            }
            let (a, b) = (rs.max(start), re.min(end));
            let n = u64::from(b - a);
            let before = tiers_in(&run.holders, pod);
            let after = change(before);
            let mut holders = run.holders.clone();
            set_tiers(&mut holders, pod, after);
            if before != after {
                changed(a, b, before, after);
            }
            if before == 0 && after != 0 {
                stats.gained += n;
            }
            if before != 0 && after == 0 {
                stats.lost += n;
            }
            for bit in 0..MAX_TIERS {
                let m = 1u8 << bit;
                if before & m == 0 && after & m != 0 {
                    stats.tier_gained[bit] += n;
                }
                if before & m != 0 && after & m == 0 {
                    stats.tier_lost[bit] += n;
                }
            }
            if run.holders.is_empty() && !holders.is_empty() {
                stats.became_held += n;
            }
            if !run.holders.is_empty() && holders.is_empty() {
                match stats.became_unheld.last_mut() {
                    Some(last) if last.1 == a => last.1 = b,
                    _ => stats.became_unheld.push((a, b)),
                }
            }
            push_run(&mut out, b, holders);
            if re > end {
                push_run(&mut out, re, run.holders.clone());
            }
        }
        out
    }

    /// The list grown by `unheld` positions nobody holds, then `held` positions held by
    /// `holder`.
    pub fn extended(&self, unheld: u32, held: u32, holder: Holder) -> Runs {
        let len = self.len();
        let mut out = self.truncated(len);
        *out.len.get_mut() = len + unheld + held;
        if unheld > 0 {
            push_run(&mut out, len + unheld, Holders::new());
        }
        if held > 0 {
            let mut holders = Holders::new();
            holders.push(holder);
            push_run(&mut out, len + unheld + held, holders);
        }
        out
    }

    /// The list cut to its first `len` positions.
    pub fn truncated(&self, len: u32) -> Runs {
        let mut out = Runs::empty(len);
        for run in &self.runs {
            if out.runs.last().is_some_and(|r| r.end() >= len) {
                break;
            }
            push_run(&mut out, run.end().min(len), run.holders.clone());
        }
        out
    }
}

/// Appends a run ending at `end`, merging it into the previous one when the holders are equal.
fn push_run(out: &mut Runs, end: u32, holders: Holders) {
    if let Some(last) = out.runs.last_mut() {
        if *last.end.get_mut() >= end {
            return;
        }
        if last.holders == holders {
            *last.end.get_mut() = end;
            return;
        }
    }
    out.runs.push(Run::new(end, holders));
}

/// The tiers `pod` holds in a sorted holder list (0 = none).
pub fn tiers_in(holders: &[Holder], pod: PodId) -> u8 {
    if holders.len() <= 4 {
        return holders.iter().find(|h| h.pod() == pod).map_or(0, |h| h.tiers());
    }
    holders.binary_search_by_key(&pod, |h| h.pod()).map_or(0, |i| holders[i].tiers())
}

fn set_tiers(holders: &mut Holders, pod: PodId, tiers: u8) {
    match holders.binary_search_by_key(&pod, |h| h.pod()) {
        Ok(i) if tiers == 0 => {
            holders.remove(i);
        }
        Ok(i) => holders[i] = Holder::new(pod, tiers),
        Err(_) if tiers == 0 => {}
        Err(i) => holders.insert(i, Holder::new(pod, tiers)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: u8 = 1;
    const CPU: u8 = 2;

    fn pods(runs: &Runs) -> Vec<(u32, Vec<(u32, u8)>)> {
        runs.runs.iter().map(|r| (r.end(), r.holders.iter().map(|h| (h.pod().0, h.tiers())).collect())).collect()
    }

    #[test]
    fn a_removal_inside_a_shared_run_splits_it_and_a_refill_merges_it_back() {
        let a = Runs::new_held(0, 10, Holder::new(PodId(1), GPU));
        let mut st = EditStats::default();
        let b = a.edit(0, 10, PodId(2), |t| t | GPU, &mut st);
        assert_eq!(pods(&b), vec![(10, vec![(1, GPU), (2, GPU)])]);
        assert_eq!((st.gained, st.became_held), (10, 0));
        let mut st = EditStats::default();
        let c = b.edit(4, 5, PodId(1), |t| t & !GPU, &mut st);
        assert_eq!(pods(&c), vec![(4, vec![(1, GPU), (2, GPU)]), (5, vec![(2, GPU)]), (10, vec![(1, GPU), (2, GPU)])]);
        assert_eq!((st.lost, st.tier_lost[0]), (1, 1));
        let mut st = EditStats::default();
        let d = c.edit(4, 5, PodId(1), |t| t | GPU, &mut st);
        assert_eq!(d, b, "refilling the hole merges the three runs back into one");
        assert_eq!(st.gained, 1);
    }

    #[test]
    fn tier_moves_split_runs_and_count_per_tier() {
        let a = Runs::new_held(0, 6, Holder::new(PodId(0), GPU));
        let mut st = EditStats::default();
        let b = a.edit(2, 4, PodId(0), |t| t | CPU, &mut st);
        assert_eq!(pods(&b), vec![(2, vec![(0, GPU)]), (4, vec![(0, GPU | CPU)]), (6, vec![(0, GPU)])]);
        assert_eq!((st.gained, st.tier_gained[1], st.tier_gained[0]), (0, 2, 0));
        assert_eq!(b.tiers_at(3, PodId(0)), GPU | CPU);
        assert_eq!(b.tiers_at(6, PodId(0)), 0, "past the end");
    }

    #[test]
    fn last_holder_leaving_reports_unheld_ranges_and_truncation_keeps_the_rest() {
        let a = Runs::new_held(0, 8, Holder::new(PodId(3), GPU));
        let mut st = EditStats::default();
        let b = a.edit(5, 8, PodId(3), |_| 0, &mut st);
        assert_eq!(st.became_unheld.as_slice(), &[(5, 8)]);
        assert_eq!(b.held_end(), 5);
        let c = b.truncated(5);
        assert_eq!(pods(&c), vec![(5, vec![(3, GPU)])]);
        assert_eq!(c.len(), 5);
        let d = c.extended(0, 2, Holder::new(PodId(3), GPU));
        assert_eq!(pods(&d), vec![(7, vec![(3, GPU)])], "an extension by the same holder merges");
        assert!(c.grow_in_place(3, Holder::new(PodId(3), GPU)), "the only holder appends in place");
        assert_eq!((pods(&c), c.len()), (vec![(8, vec![(3, GPU)])], 8));
        assert!(!c.grow_in_place(1, Holder::new(PodId(4), GPU)), "another holder needs a new list");
    }

    #[test]
    fn cut_after_new_grants_exactly_the_new_positions() {
        let a = Runs::new_held(0, 4, Holder::new(PodId(1), GPU)).extended(0, 4, Holder::new(PodId(2), GPU));
        // Pod 1 holds [0,4); new to it: [4,8).
        assert_eq!(a.unheld_by(0, 8, PodId(1)), 4);
        assert_eq!(a.cut_after_new(0, 8, PodId(1), 2), 6);
        assert_eq!(a.cut_after_new(0, 8, PodId(1), 9), 8);
        assert_eq!(a.cut_after_new(0, 8, PodId(1), 0), 4);
    }
}
