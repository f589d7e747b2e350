//! Speculative credit ("predict on route"): blocks a pod is expected to hold soon because a
//! router just sent it a prompt, kept apart from the index.
//!
//! A burst of requests sharing a new prefix reaches several router replicas before the engine
//! publishes any `BlockStored`; without a shared prediction each replica would place its copy
//! by load alone and the prefix would be computed on several pods. `RecordRoute` credits the
//! chosen pod with the prompt's blocks for a short TTL, and scoring reports the longest run of
//! prompt blocks each pod holds *or* is credited with, beside (never inside) the exact match.
//!
//! A credit ends on the first of: its TTL; the engine announcing the block (the exact match
//! covers it: the first score that sees it held deletes it, so a later eviction does not bring
//! the credit back); the pod being cleared, degraded or removed ([`SpeculativeCredits::clear_pod`]).
//! One case is left to the TTL: a block the engine stores and evicts again before any score
//! of that prefix runs keeps its credit until it expires (the credit is a prediction and is
//! reported as one; the exact match never includes it).
//!
//! The table keys blocks by its own chain of block hashes (namespace, cache salt, tokens), so
//! it depends on nothing inside the index. Memory is bounded globally, per pod and per caller
//! (entries of about [`ENTRY_BYTES`] each): each credit is owned by the caller that created it
//! (the server names callers by peer address), so one caller cannot take more than its share
//! of the table. Past a bound new credits are refused and counted, which can only
//! under-predict. Time is passed in (milliseconds on the caller's monotonic clock).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

/// Approximate bytes per credit (hash-map slot of key, pod, expiry, owner, plus load-factor
/// slack).
pub const ENTRY_BYTES: usize = 48;

/// Most distinct callers the table tracks at once; a new caller takes the slot of one that
/// holds no credit, and is refused while all of them hold some.
pub const MAX_CALLERS: usize = 4096;

/// Least time between two sweeps that a bound triggers (a sweep walks the whole table, so a
/// caller at its bound must not make every call pay one).
const BOUND_SWEEP_EVERY_MS: u64 = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// Tokens per block: the index's canonical block size.
    pub block_size: usize,
    /// TTL of a credit whose request asks for none.
    pub default_ttl_ms: u64,
    /// Longest TTL a request may ask for (longer requests are capped).
    pub max_ttl_ms: u64,
    /// Credits held across all pods.
    pub max_entries: usize,
    /// Credits held for one pod.
    pub max_entries_per_pod: usize,
    /// Credits one caller may have created and still hold, all pods together.
    pub max_entries_per_caller: usize,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        SpeculativeConfig {
            block_size: 16,
            default_ttl_ms: 2_000,
            max_ttl_ms: 10_000,
            max_entries: 1 << 20,
            max_entries_per_pod: 1 << 16,
            max_entries_per_caller: 1 << 18,
        }
    }
}

/// A prompt's block keys in the table's own recipe, computed once per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditKeys(Vec<u64>);

impl CreditKeys {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The bound that refused a credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `max_entries`: the whole table.
    Table,
    /// `max_entries_per_pod`.
    Pod,
    /// `max_entries_per_caller` (or every caller slot taken, [`MAX_CALLERS`]).
    Caller,
}

impl Bound {
    pub fn label(self) -> &'static str {
        match self {
            Bound::Table => "table",
            Bound::Pod => "pod",
            Bound::Caller => "caller",
        }
    }
}

/// What one [`SpeculativeCredits::record`] did, in blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordOutcome {
    /// Blocks newly credited, or whose credit was extended.
    pub credited: u32,
    /// Blocks past the pod's exact match not credited because a bound was reached.
    pub refused: u32,
    /// Which bound refused them (`None` when nothing was refused).
    pub bound: Option<Bound>,
    /// The TTL applied.
    pub ttl_ms: u64,
}

/// Seeds the chain: separates these keys from every other xxh3 use in the process.
const RECIPE_SEED: u64 = 0x7370_6563_5f76_3031; // "spec_v01"

/// Names (pods or callers) to small ids, and the credits each holds.
#[derive(Default)]
struct Book {
    ids: FxHashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
    /// Credits held per id (expired ones included until swept).
    counts: Vec<usize>,
}

impl Book {
    /// The id of `name`, new if needed; with `limit` names known, a new name takes the id of
    /// one that holds no credit, or gets none.
    fn id(&mut self, name: &str, limit: usize) -> Option<u32> {
        if let Some(&id) = self.ids.get(name) {
            return Some(id);
        }
        let name: Arc<str> = Arc::from(name);
        if self.names.len() >= limit {
            let free = self.counts.iter().position(|&n| n == 0)?;
            self.ids.remove(&self.names[free]);
            self.names[free] = name.clone();
            self.ids.insert(name, free as u32);
            return Some(free as u32);
        }
        let id = self.names.len() as u32;
        self.names.push(name.clone());
        self.ids.insert(name, id);
        self.counts.push(0);
        Some(id)
    }
}

/// Pods and callers; counts change only under this lock, so they always match the shards.
#[derive(Default)]
struct Books {
    pods: Book,
    callers: Book,
}

impl Books {
    /// Takes `n` credits of `credit`'s pod and caller off the counts.
    fn forget(&mut self, credit: &Credit, pod: u32, n: usize) {
        let count = &mut self.pods.counts[pod as usize];
        *count = count.saturating_sub(n);
        let count = &mut self.callers.counts[credit.caller as usize];
        *count = count.saturating_sub(n);
    }
}

const SHARDS: usize = 16;

/// One credit: until when, and which caller created it (and holds it against its share).
#[derive(Debug, Clone, Copy)]
struct Credit {
    expires: u64,
    caller: u32,
}

/// One shard: (block key, pod id) → the credit.
type Shard = RwLock<FxHashMap<(u64, u32), Credit>>;

/// The bounded table of speculative credits: (block key, pod) → expiry.
pub struct SpeculativeCredits {
    config: SpeculativeConfig,
    shards: Box<[Shard]>,
    books: Mutex<Books>,
    entries: AtomicUsize,
    /// When the last periodic sweep ran (caller's milliseconds).
    last_sweep: AtomicU64,
}

impl SpeculativeCredits {
    pub fn new(config: SpeculativeConfig) -> Self {
        assert!(config.block_size > 0, "block_size must be positive");
        SpeculativeCredits {
            config,
            shards: (0..SHARDS).map(|_| RwLock::new(FxHashMap::default())).collect(),
            books: Mutex::new(Books::default()),
            entries: AtomicUsize::new(0),
            last_sweep: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &SpeculativeConfig {
        &self.config
    }

    /// Credits held, expired ones included until the next sweep.
    pub fn entries(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    pub fn approx_bytes(&self) -> usize {
        self.entries() * ENTRY_BYTES
    }

    /// The TTL a request asking for `ttl_ms` gets: 0 means the default; longer than the maximum
    /// is capped to it.
    pub fn ttl(&self, ttl_ms: u64) -> u64 {
        if ttl_ms == 0 {
            self.config.default_ttl_ms.min(self.config.max_ttl_ms)
        } else {
            ttl_ms.min(self.config.max_ttl_ms)
        }
    }

    /// The keys of a prompt's full blocks in `namespace` (the model, or the LoRA adapter).
    pub fn keys(&self, namespace: &str, cache_salt: Option<&str>, token_ids: &[u32]) -> CreditKeys {
        let mut root = Xxh3::with_seed(RECIPE_SEED);
        root.update(namespace.as_bytes());
        root.update(&[0]);
        root.update(cache_salt.unwrap_or("").as_bytes());
        let mut parent = root.digest();
        let bs = self.config.block_size;
        let mut keys = Vec::with_capacity(token_ids.len() / bs);
        let mut bytes = Vec::with_capacity(bs * 4);
        for block in token_ids.chunks_exact(bs) {
            bytes.clear();
            for t in block {
                bytes.extend_from_slice(&t.to_le_bytes());
            }
            parent = xxh3_64_with_seed(&bytes, parent);
            keys.push(parent);
        }
        CreditKeys(keys)
    }

    fn shard(&self, key: u64) -> &Shard {
        &self.shards[(key >> 59) as usize % SHARDS]
    }

    /// Credits `pod` with the blocks of `keys` past the `held` it already holds exactly, until
    /// `now_ms + ttl` (see [`ttl`](Self::ttl)), on behalf of `caller`: new credits count
    /// against the caller's share (`max_entries_per_caller`) as well as the pod's and the
    /// table's. An existing credit is extended, never shortened, and stays its creator's.
    pub fn record(
        &self,
        pod: &str,
        caller: &str,
        keys: &CreditKeys,
        held: u32,
        ttl_ms: u64,
        now_ms: u64,
    ) -> RecordOutcome {
        let ttl_ms = self.ttl(ttl_ms);
        let mut outcome = RecordOutcome { ttl_ms, ..Default::default() };
        let wanted = keys.0.get(held as usize..).unwrap_or(&[]);
        if wanted.is_empty() || ttl_ms == 0 {
            return outcome;
        }
        let expires = now_ms.saturating_add(ttl_ms);
        let mut books = self.books.lock();
        let (mut room, mut bound) = self.room(&books, pod, caller);
        if room < wanted.len() && self.sweep_due(now_ms) {
            // Expired credits may be what fills a bound.
            self.sweep_locked(&mut books, now_ms);
            (room, bound) = self.room(&books, pod, caller);
        }
        let (Some(pod_id), Some(caller_id)) = (books.pods.id(pod, usize::MAX), books.callers.id(caller, MAX_CALLERS))
        else {
            outcome.refused = wanted.len() as u32;
            outcome.bound = Some(Bound::Caller);
            return outcome;
        };
        let mut added = 0;
        for (i, &key) in wanted.iter().enumerate() {
            let mut shard = self.shard(key).write();
            match shard.get_mut(&(key, pod_id)) {
                Some(e) => e.expires = e.expires.max(expires),
                None if room > 0 => {
                    shard.insert((key, pod_id), Credit { expires, caller: caller_id });
                    room -= 1;
                    added += 1;
                }
                None => {
                    // Credit is a run from the exact match: past a refused block nothing counts.
                    outcome.refused = (wanted.len() - i) as u32;
                    outcome.bound = Some(bound);
                    break;
                }
            }
            outcome.credited += 1;
        }
        books.pods.counts[pod_id as usize] += added;
        books.callers.counts[caller_id as usize] += added;
        self.entries.fetch_add(added, Ordering::Relaxed);
        outcome
    }

    /// New credits `pod` may get from `caller` now, and the bound that sets that number.
    fn room(&self, books: &Books, pod: &str, caller: &str) -> (usize, Bound) {
        let held = |book: &Book, name: &str| book.ids.get(name).map_or(0, |&id| book.counts[id as usize]);
        let caller_room = if books.callers.ids.contains_key(caller)
            || books.callers.names.len() < MAX_CALLERS
            || books.callers.counts.contains(&0)
        {
            self.config.max_entries_per_caller.saturating_sub(held(&books.callers, caller))
        } else {
            0
        };
        let rooms = [
            (self.config.max_entries.saturating_sub(self.entries()), Bound::Table),
            (self.config.max_entries_per_pod.saturating_sub(held(&books.pods, pod)), Bound::Pod),
            (caller_room, Bound::Caller),
        ];
        let (room, bound) = rooms.into_iter().min_by_key(|&(room, _)| room).unwrap_or((0, Bound::Table));
        (room, bound)
    }

    /// Whether a bound may sweep now: at most once per [`BOUND_SWEEP_EVERY_MS`].
    fn sweep_due(&self, now_ms: u64) -> bool {
        let last = self.last_sweep.load(Ordering::Relaxed);
        if self.entries() == 0 || now_ms.saturating_sub(last) < BOUND_SWEEP_EVERY_MS {
            return false;
        }
        self.last_sweep.store(now_ms, Ordering::Relaxed);
        true
    }

    /// Each credited pod's speculative run for a prompt: the longest run of blocks from block 0
    /// that the pod holds (its exact `matched` blocks) or is credited with at `now_ms`.
    /// `matched` names a pod's exact match, or `None` when the pod is not to be scored (filtered
    /// out, or not EXACT). Only runs longer than the exact match are returned. Credits of blocks
    /// the pod now holds exactly are deleted: the engine's events replaced them.
    pub fn runs(
        &self,
        keys: &CreditKeys,
        now_ms: u64,
        mut matched: impl FnMut(&str) -> Option<u32>,
    ) -> Vec<(Arc<str>, u32)> {
        if self.entries() == 0 || keys.is_empty() {
            return Vec::new();
        }
        let credited: Vec<(u32, Arc<str>)> = {
            let books = self.books.lock();
            let pods = &books.pods;
            pods.counts
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(id, _)| (id as u32, pods.names[id].clone()))
                .collect()
        };
        let mut runs = Vec::new();
        for (id, name) in credited {
            let Some(held) = matched(&name) else { continue };
            let held = (held as usize).min(keys.len());
            self.settle(id, &keys.0[..held]);
            let mut run = held;
            while let Some(&key) = keys.0.get(run) {
                let live = self.shard(key).read().get(&(key, id)).is_some_and(|e| e.expires > now_ms);
                if !live {
                    break;
                }
                run += 1;
            }
            if run > held {
                runs.push((name, run as u32));
            }
        }
        runs
    }

    /// Deletes `pod`'s credits for `held` blocks (a prefix the engine announced), walking back
    /// from its end while credited: one lookup when there is nothing to settle.
    fn settle(&self, id: u32, held: &[u64]) {
        if !held.last().is_some_and(|&key| self.shard(key).read().contains_key(&(key, id))) {
            return;
        }
        let mut books = self.books.lock();
        let mut removed = 0;
        for &key in held.iter().rev() {
            let Some(credit) = self.shard(key).write().remove(&(key, id)) else { break };
            books.forget(&credit, id, 1);
            removed += 1;
        }
        self.entries.fetch_sub(removed, Ordering::Relaxed);
    }

    /// Ends every credit of `pod` (cleared, degraded or removed). Returns the credits dropped.
    pub fn clear_pod(&self, pod: &str) -> usize {
        let mut books = self.books.lock();
        let id = match books.pods.ids.get(pod) {
            Some(&id) if books.pods.counts[id as usize] > 0 => id,
            _ => return 0,
        };
        let mut removed = 0;
        for shard in self.shards.iter() {
            shard.write().retain(|&(_, p), credit| {
                let keep = p != id;
                if !keep {
                    books.forget(credit, p, 1);
                    removed += 1;
                }
                keep
            });
        }
        self.entries.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Sweeps when credits are held and the last sweep is at least `every_ms` old: for a caller
    /// that ticks more often than a sweep (O(credits)) is worth. Returns credits dropped.
    pub fn sweep_every(&self, every_ms: u64, now_ms: u64) -> usize {
        let last = self.last_sweep.load(Ordering::Relaxed);
        if self.entries() == 0 || now_ms.saturating_sub(last) < every_ms {
            return 0;
        }
        self.last_sweep.store(now_ms, Ordering::Relaxed);
        self.sweep(now_ms)
    }

    /// Drops expired credits. Returns how many.
    pub fn sweep(&self, now_ms: u64) -> usize {
        let mut books = self.books.lock();
        self.sweep_locked(&mut books, now_ms)
    }

    fn sweep_locked(&self, books: &mut Books, now_ms: u64) -> usize {
        let mut total = 0;
        for shard in self.shards.iter() {
            shard.write().retain(|&(_, pod), credit| {
                let keep = credit.expires > now_ms;
                if !keep {
                    books.forget(credit, pod, 1);
                    total += 1;
                }
                keep
            });
        }
        self.entries.fetch_sub(total, Ordering::Relaxed);
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table(max_entries: usize, per_pod: usize) -> SpeculativeCredits {
        table_with_callers(max_entries, per_pod, max_entries)
    }

    fn table_with_callers(max_entries: usize, per_pod: usize, per_caller: usize) -> SpeculativeCredits {
        SpeculativeCredits::new(SpeculativeConfig {
            block_size: 2,
            default_ttl_ms: 100,
            max_ttl_ms: 1_000,
            max_entries,
            max_entries_per_pod: per_pod,
            max_entries_per_caller: per_caller,
        })
    }

    fn runs(t: &SpeculativeCredits, keys: &CreditKeys, now: u64, matched: &[(&str, u32)]) -> Vec<(String, u32)> {
        let mut got: Vec<(String, u32)> = t
            .runs(keys, now, |p| Some(matched.iter().find(|(n, _)| *n == p).map_or(0, |(_, m)| *m)))
            .into_iter()
            .map(|(p, n)| (p.to_string(), n))
            .collect();
        got.sort();
        got
    }

    #[test]
    fn keys_are_chained_per_namespace_and_salt() {
        let t = table(100, 100);
        let a = t.keys("m", None, &[1, 2, 3, 4, 5]);
        assert_eq!(a.len(), 2, "only full blocks");
        let b = t.keys("m", None, &[1, 2, 3, 4]);
        assert_eq!(a, b);
        assert_ne!(t.keys("m", None, &[9, 9, 3, 4]).0[1], a.0[1], "a block's key depends on its prefix");
        assert_ne!(t.keys("other", None, &[1, 2]).0[0], a.0[0]);
        assert_ne!(t.keys("m", Some("salt"), &[1, 2]).0[0], a.0[0]);
    }

    #[test]
    fn a_credit_is_a_run_past_the_exact_match_until_its_ttl() {
        let t = table(100, 100);
        let keys = t.keys("m", None, &(0..10).collect::<Vec<_>>());
        let out = t.record("a", "r", &keys, 0, 0, 1_000);
        assert_eq!(out, RecordOutcome { credited: 5, refused: 0, bound: None, ttl_ms: 100 });
        assert_eq!(runs(&t, &keys, 1_050, &[]), [("a".to_string(), 5)]);
        // A sibling prompt sharing 3 blocks gets a run of 3.
        let sibling = t.keys("m", None, &[0, 1, 2, 3, 4, 5, 99, 99]);
        assert_eq!(runs(&t, &sibling, 1_050, &[]), [("a".to_string(), 3)]);
        assert!(runs(&t, &keys, 1_100, &[]).is_empty(), "expired at now + ttl");
        assert_eq!(t.sweep_every(1_000, 1_100), 5);
        assert_eq!(t.entries(), 0);
        t.record("a", "r", &keys, 0, 10, 1_100);
        assert_eq!(t.sweep_every(1_000, 1_500), 0, "not due: swept 400 ms ago");
        assert_eq!(t.entries(), 5, "expired but not swept yet");
        assert!(runs(&t, &keys, 1_500, &[]).is_empty(), "expired credit is ignored before any sweep");
        assert_eq!(t.sweep_every(1_000, 2_100), 5);
    }

    #[test]
    fn ttl_defaults_and_is_capped() {
        let t = table(100, 100);
        assert_eq!(t.ttl(0), 100);
        assert_eq!(t.ttl(50), 50);
        assert_eq!(t.ttl(60_000), 1_000);
        let keys = t.keys("m", None, &[1, 2]);
        assert_eq!(t.record("a", "r", &keys, 0, 60_000, 0).ttl_ms, 1_000);
        assert!(runs(&t, &keys, 1_000, &[]).is_empty());
    }

    #[test]
    fn blocks_held_exactly_are_not_credited_and_credits_they_cover_end() {
        let t = table(100, 100);
        let keys = t.keys("m", None, &(0..12).collect::<Vec<_>>());
        assert_eq!(t.record("a", "r", &keys, 2, 0, 0).credited, 4, "the 2 held blocks are not credited");
        assert_eq!(runs(&t, &keys, 10, &[("a", 2)]), [("a".to_string(), 6)]);
        // The engine announced 4 blocks: those credits end, the rest still extend the run.
        assert_eq!(runs(&t, &keys, 10, &[("a", 4)]), [("a".to_string(), 6)]);
        assert_eq!(t.entries(), 2);
        // It then evicted them all: the settled credits do not come back.
        assert_eq!(runs(&t, &keys, 10, &[("a", 0)]), Vec::<(String, u32)>::new());
        // Everything announced: no credit left, nothing past the exact match.
        assert!(runs(&t, &keys, 10, &[("a", 6)]).is_empty());
        assert_eq!(t.entries(), 0);
    }

    #[test]
    fn unscored_pods_are_skipped_and_cleared_pods_lose_their_credit() {
        let t = table(100, 100);
        let keys = t.keys("m", None, &[1, 2, 3, 4]);
        t.record("a", "r", &keys, 0, 0, 0);
        t.record("b", "r", &keys, 0, 0, 0);
        let only_b: Vec<_> =
            t.runs(&keys, 1, |p| (p == "b").then_some(0)).into_iter().map(|(p, n)| (p.to_string(), n)).collect();
        assert_eq!(only_b, [("b".to_string(), 2)]);
        assert_eq!(t.clear_pod("a"), 2);
        assert_eq!(t.clear_pod("a"), 0);
        assert_eq!(runs(&t, &keys, 1, &[]), [("b".to_string(), 2)]);
        assert_eq!(t.entries(), 2);
    }

    #[test]
    fn bounds_refuse_new_credit_and_count_it() {
        let t = table(5, 3);
        let keys = t.keys("m", None, &(0..10).collect::<Vec<_>>());
        let refused = |credited, refused, bound| RecordOutcome { credited, refused, bound: Some(bound), ttl_ms: 100 };
        assert_eq!(t.record("a", "r", &keys, 0, 0, 0), refused(3, 2, Bound::Pod));
        assert_eq!(t.record("b", "r", &keys, 0, 0, 0), refused(2, 3, Bound::Table));
        assert_eq!(t.entries(), 5);
        assert_eq!(t.approx_bytes(), 5 * ENTRY_BYTES);
        // Refreshing existing credit needs no room.
        assert_eq!(t.record("a", "r", &keys, 0, 0, 50).credited, 3);
        // Once expired, a full table sweeps before refusing.
        assert_eq!(t.record("c", "r", &keys, 0, 0, 200), refused(3, 2, Bound::Pod));
        assert_eq!(t.entries(), 3);
    }

    #[test]
    fn one_caller_cannot_take_more_than_its_share_of_the_table() {
        let t = table_with_callers(100, 100, 4);
        let keys = t.keys("m", None, &(0..20).collect::<Vec<_>>());
        let outcome = |credited, refused| RecordOutcome { credited, refused, bound: Some(Bound::Caller), ttl_ms: 100 };
        assert_eq!(t.record("a", "r1", &keys, 0, 0, 0), outcome(4, 6));
        // The share is the caller's, all pods together.
        assert_eq!(t.record("b", "r1", &keys, 0, 0, 0), outcome(0, 10));
        // Another caller has its own; extending r1's credits costs it nothing.
        assert_eq!(t.record("a", "r2", &keys, 0, 0, 0), outcome(8, 2));
        assert_eq!(t.entries(), 8);
        assert_eq!(runs(&t, &keys, 1, &[]), [("a".to_string(), 8)]);
        // Credits that end give the share back: settled ones (r1's first two blocks) ...
        assert!(runs(&t, &keys, 1, &[("a", 2)]).len() == 1);
        assert_eq!(t.record("b", "r1", &keys, 0, 0, 0), outcome(2, 8));
        // ... cleared ones, and expired ones once swept.
        assert_eq!(t.clear_pod("a"), 6);
        assert_eq!(t.record("c", "r2", &keys, 0, 0, 0), outcome(4, 6));
        assert_eq!(t.record("c", "r2", &keys, 0, 0, 200).credited, 4, "the bound swept the expired credits");
        assert_eq!(t.entries(), 4);
    }

    #[test]
    fn callers_are_bounded_and_a_slot_is_reused_once_its_credits_end() {
        let t = table_with_callers(1 << 20, 1 << 20, 1);
        for c in 0..MAX_CALLERS as u32 {
            let keys = t.keys("m", None, &[c, c]);
            assert_eq!(t.record("a", &format!("r{c}"), &keys, 0, 0, 0).credited, 1);
        }
        let keys = t.keys("m", None, &[u32::MAX, u32::MAX]);
        let refused = RecordOutcome { credited: 0, refused: 1, bound: Some(Bound::Caller), ttl_ms: 100 };
        assert_eq!(t.record("a", "newcomer", &keys, 0, 0, 50), refused);
        assert_eq!(t.record("a", "newcomer", &keys, 0, 0, 150).credited, 1, "expired credits free their callers");
        assert_eq!(t.books.lock().callers.names.len(), MAX_CALLERS);
    }

    proptest! {
        /// Whatever is recorded, settled, cleared or swept: the run never exceeds the prompt,
        /// never counts an expired or cleared pod, entries equal the credits actually held, and
        /// the bounds hold.
        #[test]
        fn runs_and_bounds_stay_consistent(
            ops in proptest::collection::vec((0u8..4, 0usize..3, 0usize..4, 0u32..8, 0u64..40, 0usize..3), 1..60),
        ) {
            let t = table_with_callers(20, 9, 7);
            let callers = ["r0", "r1", "r2"];
            let pods = ["p0", "p1", "p2"];
            let prompts: Vec<CreditKeys> =
                (0..4u32).map(|i| t.keys("m", None, &(0..16).map(|x| if x < 6 { x } else { x * 10 + i }).collect::<Vec<_>>())).collect();
            let mut now = 0;
            let mut cleared_at: FxHashMap<usize, u64> = FxHashMap::default();
            for (op, pod, prompt, held, dt, caller) in ops {
                now += dt;
                let keys = &prompts[prompt];
                match op {
                    0 => { t.record(pods[pod], callers[caller], keys, held, 30, now); cleared_at.remove(&pod); }
                    1 => { t.clear_pod(pods[pod]); cleared_at.insert(pod, now); }
                    2 => { t.sweep(now); }
                    _ => {
                        for (name, run) in t.runs(keys, now, |_| Some(held)) {
                            prop_assert!(run as usize <= keys.len());
                            prop_assert!(run > held);
                            let p = pods.iter().position(|x| **x == *name).unwrap();
                            prop_assert!(!cleared_at.contains_key(&p), "a cleared pod has no credit");
                        }
                    }
                }
                let held_now: usize = t.shards.iter().map(|s| s.read().len()).sum();
                prop_assert_eq!(held_now, t.entries());
                prop_assert!(t.entries() <= 20);
                let books = t.books.lock();
                prop_assert!(books.pods.counts.iter().all(|&n| n <= 9));
                prop_assert_eq!(books.pods.counts.iter().sum::<usize>(), held_now);
                prop_assert!(books.callers.counts.iter().all(|&n| n <= 7));
                prop_assert_eq!(books.callers.counts.iter().sum::<usize>(), held_now);
            }
            // Past every TTL nothing is credited.
            for keys in &prompts {
                prop_assert!(t.runs(keys, now + 31, |_| Some(0)).is_empty());
            }
        }
    }
}
