//! Shared in-flight load: the requests router replicas are sending to each pod, as they reserved
//! them, so that every replica places by the load of all of them.
//!
//! A router replica knows only its own requests; four replicas each see a quarter of a burst and
//! send "their" cold prompts to the same pod. The indexer already hears about every pick
//! (RecordRoute), so it keeps the reservations and answers each pod's totals in ScoreTokens:
//! the requests whose response has not ended, and the uncached prompt blocks of those whose
//! first response byte has not come (prefill the pod still computes before anything sent now).
//!
//! A reservation is (caller, request id) → (pod, prefill blocks, expiry). Its caller releases
//! the prefill part at the first response byte and the whole at the end of the response; the
//! expiry is the backstop for a caller that dies (or loses its connection) before releasing.
//! A release may overtake its reservation on the wire (a response that fails at once): it is
//! remembered for a while ([`EARLY_RELEASE_MS`]) so the late reservation is taken already
//! released instead of counting until it expires. A caller releases only its own reservations.
//!
//! Bounded in total, per pod and per caller (the server names callers by peer address), and in
//! callers ([`MAX_CALLERS`]); past a bound a reservation is refused, which can only
//! under-count (routers keep their own counts as a floor). Pure: no I/O, no clock (time is
//! passed in, milliseconds on the server's monotonic clock).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use kvindex::speculative::Bound;
use rustc_hash::FxHashMap;

use crate::config::reservations::ReservationConfig;

/// Most distinct callers holding reservations at once; a new caller takes the slot of one that
/// holds none, and is refused while all of them hold some.
pub const MAX_CALLERS: usize = 4096;

/// How long a release that found no reservation is remembered, so a reservation arriving
/// after it (overtaken on the wire) is taken released.
pub const EARLY_RELEASE_MS: u64 = 10_000;

/// Approximate bytes per reservation (map slot, expiry entry, slack), for the memory gauge.
pub const ENTRY_BYTES: usize = 96;

/// What a release ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// The prefill: the first response byte came.
    Prefill,
    /// The whole request: its response ended.
    Request,
}

/// One reservation asked for.
#[derive(Debug, Clone, Copy)]
pub struct Reserve<'a> {
    pub pod: &'a str,
    pub request_id: u64,
    pub prefill_blocks: u32,
    /// 0 = the default; capped at the maximum.
    pub ttl_ms: u64,
}

/// What [`Reservations::reserve`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// A new reservation.
    New,
    /// The caller had it already (a repeated call): its expiry was extended.
    Renewed,
    /// Its release came first: nothing is held (or only the request, without its prefill).
    ReleasedEarly,
}

/// What [`Reservations::release`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The reservation (its prefill part, or the whole) ended.
    Ended,
    /// Nothing of it was held (expired, refused, released already, or not arrived yet: then
    /// remembered for [`EARLY_RELEASE_MS`]).
    NotHeld,
}

/// A pod's reserved load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodLoad {
    /// Reservations whose request has not ended.
    pub requests: u32,
    /// Their uncached prompt blocks whose prefill has not ended.
    pub prefill_blocks: u64,
}

struct Entry {
    pod: Arc<str>,
    /// 0 once the prefill part is released.
    prefill_blocks: u32,
    expires: u64,
}

/// One caller's slot: its reservations, and its releases that came before them.
#[derive(Default)]
struct Caller {
    name: Option<Arc<str>>,
    entries: FxHashMap<u64, Entry>,
    early: FxHashMap<u64, Part>,
}

impl Caller {
    fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.early.is_empty()
    }
}

/// The reservation table. Not synchronized: the server holds it behind one lock.
pub struct Reservations {
    config: ReservationConfig,
    callers: Vec<Caller>,
    caller_ids: FxHashMap<Arc<str>, u32>,
    pods: FxHashMap<Arc<str>, PodLoad>,
    /// (expiry, caller, request id) of every reservation, soonest first.
    expiry: BTreeSet<(u64, u32, u64)>,
    /// (forget at, caller, request id) of the early releases, in arrival order (their TTL is
    /// fixed, so also soonest first).
    early: VecDeque<(u64, u32, u64)>,
    entries: usize,
}

impl Reservations {
    pub fn new(config: ReservationConfig) -> Reservations {
        Reservations {
            config,
            callers: Vec::new(),
            caller_ids: FxHashMap::default(),
            pods: FxHashMap::default(),
            expiry: BTreeSet::new(),
            early: VecDeque::new(),
            entries: 0,
        }
    }

    pub fn config(&self) -> &ReservationConfig {
        &self.config
    }

    /// Whether reservations are kept at all (`max_entries > 0`).
    pub fn enabled(&self) -> bool {
        self.config.max_entries > 0
    }

    /// Reservations held (expired ones included until the next call that sweeps).
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Releases remembered because they came before their reservation.
    pub fn early_releases(&self) -> usize {
        self.early.len()
    }

    /// The TTL a request asking for `ttl_ms` gets: 0 means the default; longer than the
    /// maximum is capped to it.
    pub fn ttl(&self, ttl_ms: u64) -> u64 {
        let max = self.config.max_ttl_ms;
        if ttl_ms == 0 {
            self.config.default_ttl_ms.min(max)
        } else {
            ttl_ms.min(max)
        }
    }

    /// Reserves `r` for `caller` until `now_ms` + its TTL; a repeated reservation (same
    /// caller and request id) is extended, never counted twice. `Err` names the bound that
    /// refused it (nothing is held then).
    pub fn reserve(&mut self, caller: &str, r: Reserve<'_>, now_ms: u64) -> Result<Reserved, Bound> {
        self.sweep(now_ms);
        let expires = now_ms.saturating_add(self.ttl(r.ttl_ms));
        let caller_id = match self.caller_ids.get(caller) {
            Some(&id) => id,
            None => self.new_caller(caller).ok_or(Bound::Caller)?,
        };
        let slot = &mut self.callers[caller_id as usize];
        let early = slot.early.remove(&r.request_id);
        if early == Some(Part::Request) {
            self.forget_caller_if_empty(caller_id);
            return Ok(Reserved::ReleasedEarly);
        }
        let prefill_blocks = if early == Some(Part::Prefill) { 0 } else { r.prefill_blocks };
        if let Some(entry) = slot.entries.get_mut(&r.request_id) {
            if entry.expires < expires {
                self.expiry.remove(&(entry.expires, caller_id, r.request_id));
                self.expiry.insert((expires, caller_id, r.request_id));
                entry.expires = expires;
            }
            return Ok(Reserved::Renewed);
        }
        let pod_held = self.pods.get(r.pod).map_or(0, |l| l.requests as usize);
        let bound = if self.entries >= self.config.max_entries {
            Some(Bound::Table)
        } else if pod_held >= self.config.max_entries_per_pod {
            Some(Bound::Pod)
        } else if slot.entries.len() >= self.config.max_entries_per_caller {
            Some(Bound::Caller)
        } else {
            None
        };
        if let Some(bound) = bound {
            self.forget_caller_if_empty(caller_id);
            return Err(bound);
        }
        let pod: Arc<str> = match self.pods.get_key_value(r.pod) {
            Some((name, _)) => name.clone(),
            None => Arc::from(r.pod),
        };
        let load = self.pods.entry(pod.clone()).or_default();
        load.requests += 1;
        load.prefill_blocks += u64::from(prefill_blocks);
        slot.entries.insert(r.request_id, Entry { pod, prefill_blocks, expires });
        self.expiry.insert((expires, caller_id, r.request_id));
        self.entries += 1;
        Ok(if early.is_some() { Reserved::ReleasedEarly } else { Reserved::New })
    }

    /// Ends `part` of `caller`'s reservation `request_id` (the whole of it for
    /// [`Part::Request`]). A release that finds nothing is remembered for
    /// [`EARLY_RELEASE_MS`] (while the caller's share has room), in case its reservation is
    /// still on its way.
    pub fn release(&mut self, caller: &str, request_id: u64, part: Part, now_ms: u64) -> Released {
        self.sweep(now_ms);
        let caller_id = self.caller_ids.get(caller).copied();
        let held = caller_id.and_then(|id| {
            let slot = &mut self.callers[id as usize];
            match part {
                Part::Request => slot.entries.remove(&request_id).map(|e| (e, true)),
                Part::Prefill => slot.entries.get_mut(&request_id).map(|e| {
                    let blocks = std::mem::take(&mut e.prefill_blocks);
                    (Entry { pod: e.pod.clone(), prefill_blocks: blocks, expires: e.expires }, false)
                }),
            }
        });
        match (caller_id, held) {
            (Some(id), Some((entry, whole))) => {
                if whole {
                    self.expiry.remove(&(entry.expires, id, request_id));
                    self.entries -= 1;
                    self.forget_caller_if_empty(id);
                }
                self.unload(&entry, whole);
                Released::Ended
            }
            (id, None) => {
                self.remember_early(id, caller, request_id, part, now_ms);
                Released::NotHeld
            }
            (None, Some(_)) => unreachable!("a reservation is only found through its caller"),
        }
    }

    /// Each pod's reserved load (pods with none are absent), of `filter`'s pods if one is given.
    pub fn loads(&mut self, filter: Option<&[&str]>, now_ms: u64) -> Vec<(Arc<str>, PodLoad)> {
        self.sweep(now_ms);
        match filter {
            None => self.pods.iter().map(|(pod, load)| (pod.clone(), *load)).collect(),
            Some(pods) => pods
                .iter()
                .filter_map(|p| self.pods.get_key_value(*p))
                .map(|(pod, load)| (pod.clone(), *load))
                .collect(),
        }
    }

    /// Drops every reservation (and early release) past its time; returns the reservations
    /// that expired.
    pub fn sweep(&mut self, now_ms: u64) -> usize {
        let mut expired = 0;
        while let Some(&(expires, caller, id)) = self.expiry.first() {
            if expires > now_ms {
                break;
            }
            self.expiry.pop_first();
            if let Some(entry) = self.callers[caller as usize].entries.remove(&id) {
                self.entries -= 1;
                self.unload(&entry, true);
                self.forget_caller_if_empty(caller);
                expired += 1;
            }
        }
        while let Some(&(forget_at, caller, id)) = self.early.front() {
            if forget_at > now_ms {
                break;
            }
            self.early.pop_front();
            if self.callers[caller as usize].early.remove(&id).is_some() {
                self.forget_caller_if_empty(caller);
            }
        }
        expired
    }

    /// Takes `entry`'s prefill (and, for the whole reservation, its request) off its pod.
    fn unload(&mut self, entry: &Entry, whole: bool) {
        if let Some(load) = self.pods.get_mut(&entry.pod) {
            load.prefill_blocks -= u64::from(entry.prefill_blocks);
            if whole {
                load.requests -= 1;
                if load.requests == 0 {
                    self.pods.remove(&entry.pod);
                }
            }
        }
    }

    fn remember_early(&mut self, caller_id: Option<u32>, caller: &str, request_id: u64, part: Part, now_ms: u64) {
        if self.early.len() >= self.config.max_entries {
            return;
        }
        let Some(id) = caller_id.or_else(|| self.new_caller(caller)) else { return };
        let slot = &mut self.callers[id as usize];
        if slot.early.len() >= self.config.max_entries_per_caller {
            return;
        }
        match slot.early.entry(request_id) {
            std::collections::hash_map::Entry::Occupied(mut known) => {
                // The request's end after its prefill's: remember the stronger.
                let strongest = (*known.get()).max(part);
                known.insert(strongest);
            }
            std::collections::hash_map::Entry::Vacant(new) => {
                new.insert(part);
                self.early.push_back((now_ms.saturating_add(EARLY_RELEASE_MS), id, request_id));
            }
        }
    }

    /// A slot for a new caller: a fresh one while fewer than [`MAX_CALLERS`] exist, else one
    /// that holds nothing; `None` when every slot is in use.
    fn new_caller(&mut self, caller: &str) -> Option<u32> {
        let name: Arc<str> = Arc::from(caller);
        let id = if self.callers.len() < MAX_CALLERS {
            self.callers.push(Caller::default());
            self.callers.len() - 1
        } else {
            self.callers.iter().position(|c| c.name.is_none())?
        };
        self.callers[id].name = Some(name.clone());
        self.caller_ids.insert(name, id as u32);
        Some(id as u32)
    }

    /// Frees a caller's slot once it holds nothing (its early releases' queue entries, if any,
    /// find nothing when they come due).
    fn forget_caller_if_empty(&mut self, id: u32) {
        let slot = &mut self.callers[id as usize];
        if slot.is_empty() {
            if let Some(name) = slot.name.take() {
                self.caller_ids.remove(&name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max_entries: usize, per_pod: usize, per_caller: usize) -> Reservations {
        Reservations::new(ReservationConfig {
            default_ttl_ms: 1_000,
            max_ttl_ms: 5_000,
            max_entries,
            max_entries_per_pod: per_pod,
            max_entries_per_caller: per_caller,
        })
    }

    fn reserve(pod: &str, request_id: u64, prefill_blocks: u32) -> Reserve<'_> {
        Reserve { pod, request_id, prefill_blocks, ttl_ms: 0 }
    }

    fn load(t: &mut Reservations, pod: &str, now: u64) -> PodLoad {
        t.loads(Some(&[pod]), now).first().map_or(PodLoad::default(), |(_, l)| *l)
    }

    #[test]
    fn a_reservation_counts_until_its_prefill_and_then_its_request_are_released() {
        let mut t = table(100, 100, 100);
        assert_eq!(t.reserve("r1", reserve("a", 1, 60), 0), Ok(Reserved::New));
        assert_eq!(t.reserve("r2", reserve("a", 1, 40), 0), Ok(Reserved::New), "ids are per caller");
        assert_eq!(t.reserve("r1", reserve("b", 2, 7), 0), Ok(Reserved::New));
        assert_eq!(load(&mut t, "a", 1), PodLoad { requests: 2, prefill_blocks: 100 });
        assert_eq!(t.release("r1", 1, Part::Prefill, 1), Released::Ended);
        assert_eq!(t.release("r1", 1, Part::Prefill, 1), Released::Ended, "idempotent");
        assert_eq!(load(&mut t, "a", 1), PodLoad { requests: 2, prefill_blocks: 40 });
        assert_eq!(t.release("r1", 1, Part::Request, 2), Released::Ended);
        assert_eq!(load(&mut t, "a", 2), PodLoad { requests: 1, prefill_blocks: 40 });
        // Ending the whole request ends its prefill too.
        assert_eq!(t.release("r2", 1, Part::Request, 2), Released::Ended);
        assert_eq!(t.loads(None, 2), vec![(Arc::from("b"), PodLoad { requests: 1, prefill_blocks: 7 })]);
        assert_eq!(t.entries(), 1);
    }

    #[test]
    fn a_caller_releases_only_its_own() {
        let mut t = table(100, 100, 100);
        t.reserve("r1", reserve("a", 1, 60), 0).unwrap();
        assert_eq!(t.release("r2", 1, Part::Request, 1), Released::NotHeld);
        assert_eq!(load(&mut t, "a", 1), PodLoad { requests: 1, prefill_blocks: 60 });
    }

    #[test]
    fn a_repeated_reservation_is_extended_not_counted_twice() {
        let mut t = table(100, 100, 100);
        t.reserve("r1", Reserve { ttl_ms: 1_000, ..reserve("a", 1, 60) }, 0).unwrap();
        assert_eq!(t.reserve("r1", Reserve { ttl_ms: 1_000, ..reserve("a", 1, 60) }, 500), Ok(Reserved::Renewed));
        assert_eq!(load(&mut t, "a", 1_200), PodLoad { requests: 1, prefill_blocks: 60 }, "extended to 1500");
        assert_eq!(load(&mut t, "a", 1_500), PodLoad::default());
        assert_eq!(t.entries(), 0);
    }

    #[test]
    fn reservations_expire_at_their_ttl_capped_at_the_maximum() {
        let mut t = table(100, 100, 100);
        t.reserve("dead", reserve("a", 1, 60), 0).unwrap(); // default 1000
        t.reserve("dead", Reserve { ttl_ms: 60_000, ..reserve("a", 2, 5) }, 0).unwrap(); // capped: 5000
        assert_eq!(t.ttl(0), 1_000);
        assert_eq!(t.ttl(60_000), 5_000);
        assert_eq!(load(&mut t, "a", 999), PodLoad { requests: 2, prefill_blocks: 65 });
        assert_eq!(load(&mut t, "a", 1_000), PodLoad { requests: 1, prefill_blocks: 5 });
        assert_eq!(t.sweep(4_999), 0);
        assert_eq!(t.sweep(5_000), 1);
        assert_eq!((t.entries(), t.loads(None, 5_000).len()), (0, 0));
        assert_eq!(t.release("dead", 1, Part::Request, 5_001), Released::NotHeld, "nothing left to release");
    }

    #[test]
    fn each_bound_refuses_and_frees_room_when_released() {
        let mut t = table(4, 2, 3);
        t.reserve("r1", reserve("a", 1, 1), 0).unwrap();
        t.reserve("r1", reserve("a", 2, 1), 0).unwrap();
        assert_eq!(t.reserve("r2", reserve("a", 3, 1), 0), Err(Bound::Pod));
        t.reserve("r1", reserve("b", 3, 1), 0).unwrap();
        assert_eq!(t.reserve("r1", reserve("c", 4, 1), 0), Err(Bound::Caller));
        t.reserve("r2", reserve("c", 4, 1), 0).unwrap();
        assert_eq!(t.reserve("r3", reserve("d", 5, 1), 0), Err(Bound::Table));
        assert_eq!(t.entries(), 4, "refusals hold nothing");
        t.release("r1", 1, Part::Request, 1);
        assert_eq!(t.reserve("r3", reserve("d", 5, 1), 1), Ok(Reserved::New));
        assert_eq!(t.reserve("r2", reserve("a", 6, 1), 1), Err(Bound::Table));
    }

    #[test]
    fn off_refuses_everything() {
        let mut t = table(0, 1, 1);
        assert!(!t.enabled());
        assert_eq!(t.reserve("r1", reserve("a", 1, 1), 0), Err(Bound::Table));
        assert_eq!(t.release("r1", 1, Part::Request, 0), Released::NotHeld);
        assert_eq!(t.early_releases(), 0, "nothing remembered either");
    }

    #[test]
    fn a_release_that_overtakes_its_reservation_still_ends_it() {
        let mut t = table(100, 100, 100);
        assert_eq!(t.release("r1", 7, Part::Request, 0), Released::NotHeld);
        assert_eq!(t.reserve("r1", reserve("a", 7, 60), 5), Ok(Reserved::ReleasedEarly));
        assert_eq!(load(&mut t, "a", 5), PodLoad::default());
        // The prefill only: the request still counts, without its prefill.
        t.release("r1", 8, Part::Prefill, 5);
        assert_eq!(t.reserve("r1", reserve("a", 8, 60), 6), Ok(Reserved::ReleasedEarly));
        assert_eq!(load(&mut t, "a", 6), PodLoad { requests: 1, prefill_blocks: 0 });
        // Remembered for a while only.
        t.release("r1", 9, Part::Request, 10);
        assert_eq!(t.early_releases(), 3);
        t.sweep(10 + EARLY_RELEASE_MS);
        assert_eq!(t.early_releases(), 0);
        assert_eq!(t.reserve("r1", reserve("a", 9, 60), 10 + EARLY_RELEASE_MS), Ok(Reserved::New));
    }

    #[test]
    fn early_releases_are_bounded_per_caller_and_in_total() {
        let mut t = table(4, 100, 2);
        for id in 0..5 {
            t.release("r1", id, Part::Request, 0);
        }
        assert_eq!(t.early_releases(), 2, "the caller's share");
        for id in 0..5 {
            t.release("r2", id, Part::Request, 0);
            t.release("r3", id, Part::Request, 0);
        }
        assert_eq!(t.early_releases(), 4, "the table's");
    }

    #[test]
    fn callers_are_bounded_and_a_caller_holding_nothing_gives_its_slot_up() {
        let mut t = table(usize::MAX, usize::MAX, usize::MAX);
        for c in 0..MAX_CALLERS {
            t.reserve(&format!("c{c}"), reserve("a", 1, 0), 0).unwrap();
        }
        assert_eq!(t.reserve("late", reserve("a", 1, 0), 0), Err(Bound::Caller));
        t.release("c7", 1, Part::Request, 0);
        assert_eq!(t.reserve("late", reserve("a", 1, 0), 0), Ok(Reserved::New));
        assert_eq!(load(&mut t, "a", 0).requests as usize, MAX_CALLERS);
        // Its slot was reused: the old caller's name finds nothing.
        assert_eq!(t.release("c7", 1, Part::Request, 0), Released::NotHeld);
        assert_eq!(load(&mut t, "a", 0).requests as usize, MAX_CALLERS);
    }

    #[test]
    fn loads_filter_by_pod() {
        let mut t = table(100, 100, 100);
        t.reserve("r1", reserve("a", 1, 3), 0).unwrap();
        t.reserve("r1", reserve("b", 2, 4), 0).unwrap();
        let mut all = t.loads(None, 0);
        all.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(all.len(), 2);
        assert_eq!(t.loads(Some(&["b", "z"]), 0), vec![(Arc::from("b"), PodLoad { requests: 1, prefill_blocks: 4 })]);
    }
}
