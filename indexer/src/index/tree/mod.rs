//! The residency tree: chains of blocks keyed by their own content, with who holds each run.
//!
//! Why this shape: a prompt's blocks form a chain, and pods hold chains, not scattered blocks.
//! The tree stores a chain as a *segment* (its blocks' hashes one after another) and the pods
//! holding it as *runs* (maximal ranges with the same holders), so a reader walking a prompt
//! compares consecutive hashes in one array and intersects holder sets once per run, instead
//! of probing a hash table per block. A block's hash covers only its own tokens (and extras);
//! the prefix is carried by the tree, so the prompt's hashes have no serial dependency (see
//! `keys`). Where chains diverge, a *branch* link (`children`) leads to the continuation.
//!
//! Sharded by the chain's first block under its namespace root: everything below one root
//! branch lives in one shard, so a walk touches one shard and writers of different branches
//! do not meet. Each shard has one writer lock; readers take no lock at all. They pin an epoch
//! (`crossbeam-epoch`) and read immutable run lists and write-once hash storage that writers
//! replace copy-on-write, so a reader never waits for a writer and never sees a torn state;
//! writers free what they replaced themselves (`retired`), so a reader never does a writer's
//! freeing either.
//!
//! What it keeps for the rest of the index: a packed position per block for the engine-hash
//! table (`engines`), per-pod residency counts per tier, and a bound on (block, pod)
//! residencies that refuses new ones (only under-reporting) once reached.

mod children;
mod engines;
mod retired;
pub mod runs;
mod segment;

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use parking_lot::Mutex;
use smallvec::SmallVec;

pub use self::children::ParentKey;
use self::children::{branch_hash, ChildTable};
use self::engines::{EngineTable, MAX_OFFSET};
use self::retired::Retired;
use self::runs::Runs;
pub use self::runs::{EditStats, Holder};

pub use self::segment::Pos;
use self::segment::{global, Segment, SegmentDir, Storage};
use crate::index::digest;
use crate::index::pods::PodId;
use crate::index::tiers::MAX_TIERS;

/// The hashes of a query's blocks, computed on demand: a walk stops at the first block no pod
/// holds, and blocks past it are never hashed.
pub trait BlockHashes {
    fn len(&self) -> usize;
    fn get(&mut self, i: usize) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl BlockHashes for &[u64] {
    fn len(&self) -> usize {
        <[u64]>::len(self)
    }
    fn get(&mut self, i: usize) -> u64 {
        self[i]
    }
}

/// Blocks `[depth, depth + len)` of a query, held by `holders` (sorted by pod).
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    pub depth: u32,
    pub len: u32,
    pub holders: &'a [Holder],
}

/// What one store records ([`Tree::store`]): `pod` holds, in tier `tier_bit`, the chain of
/// `hashes` continuing `parent` (a namespace root, or a block the caller checked the pod
/// holds). The first `hold_from` blocks are only followed (or created, unheld): a path the
/// pod's block hangs off without the pod holding it in this tree (a sliding-window or Mamba
/// group keeps later blocks without earlier ones). `ends` lists, in order, the index of each
/// engine block's last canonical block and its scoped engine hash: each block records the
/// first engine hash it is stored under, and with `index` also enters the engine table (a pod
/// whose lookups the engine table serves; see `index_pod`).
#[derive(Debug, Clone, Copy)]
pub struct HeldChain<'a> {
    pub pod: PodId,
    pub tier_bit: u8,
    pub parent: ParentKey,
    pub hashes: &'a [u64],
    pub hold_from: usize,
    pub ends: &'a [(usize, u64)],
    pub index: bool,
}

/// What a store did.
#[derive(Debug, Default)]
pub struct Stored {
    /// Leading blocks applied; the rest were refused by the residency bound.
    pub applied: usize,
    /// For each engine block end given (in order) that was applied: its position, and whether
    /// its engine hash is the block's recorded one (else the caller keeps an exception).
    pub ends: SmallVec<[(Pos, bool); 32]>,
    /// Position of the last block applied.
    pub last: Option<Pos>,
    /// Ranges of `hashes` indices the pod already held before this store, with the tiers it
    /// held them in.
    pub held_before: SmallVec<[(usize, usize, u8); 2]>,
    pub stats: EditStats,
    /// Segments the pod now holds something in (global numbers).
    pub segments: SmallVec<[u32; 4]>,
}

impl Stored {
    fn clear(&mut self) {
        self.applied = 0;
        self.ends.clear();
        self.last = None;
        self.held_before.clear();
        self.stats = EditStats::default();
        self.segments.clear();
    }
}

#[derive(Default)]
struct SegMeta {
    /// Grown in place no more (it lost its tail once).
    sealed: bool,
    /// Some of its blocks may be in the engine table (see `Tree::store`'s `index`).
    indexed: bool,
    /// Offsets that branches hang off, with how many, sorted by offset.
    kids: SmallVec<[(u32, u32); 1]>,
}

#[derive(Default)]
struct ShardWriter {
    next: u32,
    free: Vec<u32>,
    meta: Vec<SegMeta>,
    links: usize,
    tombstones: usize,
    /// What this shard's writers unlinked, freed by them once no reader can hold it.
    retired: Retired,
}

/// A segment to make: the chain it continues (`parent`), its blocks' hashes, and its one
/// holder, who holds all but the first `unheld` of them.
struct NewSegment<'h> {
    parent: ParentKey,
    hashes: &'h [u64],
    unheld: u32,
    holder: Holder,
}

/// Offsets `[s, e)` of the shard's segment `local`.
struct SegSpan {
    local: u32,
    s: u32,
    e: u32,
}

/// A change of one pod's tiers (`change` maps its tiers of a block to their new value), and
/// whether the pod's digest follows it.
struct PodEdit<F> {
    pod: PodId,
    change: F,
    digest: bool,
}

/// Blocks `[a, b)` of a segment went from tiers `before` to `after` (a pod's).
struct TierChange {
    a: u32,
    b: u32,
    before: u8,
    after: u8,
}

struct Shard {
    dir: SegmentDir,
    children: Atomic<ChildTable>,
    writer: Mutex<ShardWriter>,
}

impl Drop for Shard {
    fn drop(&mut self) {
        // SAFETY: the tree is being dropped; no reader remains.
        unsafe {
            let guard = epoch::unprotected();
            drop(self.children.load(Ordering::Relaxed, guard).try_into_owned());
        }
    }
}

/// Sharded chain tree with a bound on resident (block, pod) entries.
pub struct Tree {
    shards: Box<[Shard]>,
    shard_shift: u32,
    engines: EngineTable,
    entries: AtomicU64,
    keys: AtomicU64,
    max_entries: u64,
}

impl Tree {
    /// `shards` is rounded up to a power of two (at most 256); `max_entries` bounds (block, pod)
    /// residencies.
    pub fn new(shards: usize, max_entries: u64) -> Self {
        let shards = shards.clamp(1, 256).next_power_of_two();
        Tree {
            shards: (0..shards)
                .map(|_| Shard {
                    dir: SegmentDir::default(),
                    children: Atomic::new(ChildTable::with_capacity(16)),
                    writer: Mutex::new(ShardWriter::default()),
                })
                .collect(),
            shard_shift: 64 - shards.trailing_zeros(),
            engines: EngineTable::default(),
            entries: AtomicU64::new(0),
            keys: AtomicU64::new(0),
            max_entries,
        }
    }

    /// Resident (block, pod) entries.
    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// Distinct blocks with at least one holder.
    pub fn keys(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    pub fn max_entries(&self) -> u64 {
        self.max_entries
    }

    pub fn pin(&self) -> Guard {
        epoch::pin()
    }

    #[inline]
    fn root_shard(&self, root: u64, first: u64) -> usize {
        if self.shards.len() == 1 {
            return 0;
        }
        let x = (root ^ first.rotate_left(23)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (x >> self.shard_shift) as usize
    }

    fn segment<'g>(&self, seg: u32, guard: &'g Guard) -> Option<&'g Segment> {
        let pos = Pos { seg, off: 0 };
        self.shards.get(pos.shard())?.dir.get(pos.local(), guard)
    }

    /// The engine hash recorded for a packed position (0 = none or gone).
    fn engine_of(&self, packed: u64, guard: &Guard) -> u64 {
        let pos = Pos::unpack(packed);
        match self.segment(pos.seg, guard) {
            Some(seg) => {
                let st = seg.storage(guard);
                if (pos.off as usize) < st.cap() {
                    st.engine(pos.off as usize)
                } else {
                    0
                }
            }
            None => 0,
        }
    }

    /// The child of `parent` whose first block hashes to `first`, confirmed against the child.
    fn find_child<'g>(
        &self,
        shard: &Shard,
        parent: ParentKey,
        first: u64,
        guard: &'g Guard,
    ) -> Option<(u32, &'g Segment)> {
        // SAFETY: the table is replaced by swap + retire only, never null.
        let table = unsafe { shard.children.load(Ordering::Acquire, guard).deref() };
        let (raw, from_root) = match parent {
            ParentKey::Root(r) => (r, true),
            ParentKey::Block(p) => (p, false),
        };
        let mut found = None;
        let local = table.find(branch_hash(parent, first), |local| match shard.dir.get(local, guard) {
            Some(seg) if seg.first == first && seg.from_root == from_root && seg.parent == raw => {
                found = Some(seg);
                true
            }
            _ => false,
        })?;
        found.map(|seg| (local, seg))
    }

    // ---- readers ------------------------------------------------------------------------

    /// Walks the chain of `root` along `query`, calling `visit` for every run of consecutive
    /// matching blocks (holders may be empty) until the chain ends, the query ends, or `visit`
    /// returns false. Takes no lock.
    pub fn walk<Q: BlockHashes>(&self, root: u64, query: &mut Q, mut visit: impl FnMut(Span<'_>) -> bool) {
        let n = query.len();
        if n == 0 {
            return;
        }
        let guard = epoch::pin();
        let h0 = query.get(0);
        let shard_idx = self.root_shard(root, h0);
        let shard = &self.shards[shard_idx];
        let Some((mut local, mut seg)) = self.find_child(shard, ParentKey::Root(root), h0, &guard) else { return };
        let mut depth = 0usize;
        loop {
            let runs = seg.runs(&guard);
            let st = seg.storage(&guard);
            let lim = runs.len().min(st.cap() as u32);
            if lim == 0 {
                return;
            }
            // Position 0 of `seg` matches query block `depth` (the branch key says so).
            let mut j = 0;
            let mut p = 0u32;
            let mut d = depth;
            loop {
                let run = &runs.runs[j];
                let end = run.end().min(lim);
                let (sp, sd) = (p, d);
                p += 1;
                d += 1;
                while p < end && d < n && st.hash(p as usize) == query.get(d) {
                    p += 1;
                    d += 1;
                }
                if !visit(Span { depth: sd as u32, len: p - sp, holders: &run.holders }) {
                    return;
                }
                if p < end || d >= n || p >= lim || st.hash(p as usize) != query.get(d) {
                    break;
                }
                j += 1;
            }
            if d >= n {
                return;
            }
            let here = seg as *const Segment;
            let parent = Pos { seg: global(shard_idx, local), off: p - 1 };
            let Some((child_local, child)) =
                self.find_child(shard, ParentKey::Block(parent.pack()), query.get(d), &guard)
            else {
                return;
            };
            // The segment we stand on may have been freed and its number reused since we
            // entered it: then the child found hangs off another chain. Only follow it if our
            // segment is still the one at that number.
            if shard.dir.load(local, &guard).as_raw() != here {
                return;
            }
            local = child_local;
            seg = child;
            depth = d;
        }
    }

    /// The tiers `pod` holds the block at `pos` in (0 = not held or gone).
    pub fn tiers_at(&self, pos: Pos, pod: PodId, guard: &Guard) -> u8 {
        self.segment(pos.seg, guard).map_or(0, |seg| seg.runs(guard).tiers_at(pos.off, pod))
    }

    /// The first block key of `pos`'s segment: with the position, identifies the block even if
    /// its segment's number is later reused.
    pub fn first_key(&self, pos: Pos, guard: &Guard) -> Option<u64> {
        self.segment(pos.seg, guard).map(|s| s.first)
    }

    /// Whether `pod` holds any block of segment `seg`.
    pub fn holds_any(&self, seg: u32, pod: PodId, guard: &Guard) -> bool {
        self.segment(seg, guard).is_some_and(|s| s.runs(guard).holds_any(pod))
    }

    /// Starts fetching the engine-table slot `engine` will be recorded in (a hint: callers
    /// issue it as soon as they know the hash, so the miss overlaps their other work).
    #[inline]
    pub fn prefetch_engine(&self, engine: u64) {
        self.engines.prefetch(engine);
    }

    /// The block recorded for scoped engine hash `engine`, if any.
    pub fn engine_block(&self, engine: u64, guard: &Guard) -> Option<Pos> {
        if engine == 0 {
            return None;
        }
        self.engines.get(engine, |b| self.engine_of(b, guard), guard).map(Pos::unpack)
    }

    /// The keys of the chain from its namespace root to `pos` (inclusive).
    pub fn path_keys(&self, pos: Pos, guard: &Guard) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut at = Some(pos);
        while let Some(p) = at {
            let Some(seg) = self.segment(p.seg, guard) else { return Vec::new() };
            let st = seg.storage(guard);
            for off in (0..=p.off.min(st.cap() as u32 - 1)).rev() {
                keys.push(st.hash(off as usize));
            }
            at = (!seg.from_root).then(|| Pos::unpack(seg.parent));
        }
        keys.reverse();
        keys
    }

    /// The block before `pos` on its chain (None at a chain's first block).
    pub fn previous(&self, pos: Pos, guard: &Guard) -> Option<Pos> {
        if pos.off > 0 {
            return Some(Pos { seg: pos.seg, off: pos.off - 1 });
        }
        let seg = self.segment(pos.seg, guard)?;
        (!seg.from_root).then(|| Pos::unpack(seg.parent))
    }

    /// The block key at `pos` (None if its segment is gone or the offset is past its end).
    pub fn key_at(&self, pos: Pos, guard: &Guard) -> Option<u64> {
        let seg = self.segment(pos.seg, guard)?;
        let st = seg.storage(guard);
        ((pos.off as usize) < st.cap() && pos.off < seg.runs(guard).len()).then(|| st.hash(pos.off as usize))
    }

    /// The namespace root a chain starting at segment `seg`'s first block hangs off (None if
    /// the segment continues another block, or is gone).
    pub fn root_of(&self, seg: u32, guard: &Guard) -> Option<u64> {
        self.segment(seg, guard).filter(|s| s.from_root).map(|s| s.parent)
    }

    /// The blocks of segment `seg` that `pod` holds, in offset order, each with its key, its
    /// recorded engine hash (0 = none) and the pod's tiers of it (for exports: one segment
    /// lookup for all of them). Returns the segment's first key (see [`Tree::first_key`]; None:
    /// the segment is gone).
    pub fn held_in(&self, seg: u32, pod: PodId, guard: &Guard, out: &mut Vec<HeldBlock>) -> Option<u64> {
        let segment = self.segment(seg, guard)?;
        let runs = segment.runs(guard);
        let st = segment.storage(guard);
        let cap = st.cap() as u32;
        let mut start = 0;
        for run in &runs.runs {
            let end = run.end().min(runs.len()).min(cap);
            let tiers = runs::tiers_in(&run.holders, pod);
            if tiers != 0 {
                out.extend((start..end).map(|off| HeldBlock {
                    pos: Pos { seg, off },
                    key: st.hash(off as usize),
                    engine: st.engine(off as usize),
                    tiers,
                }));
            }
            start = end;
        }
        Some(segment.first)
    }

    // ---- writers ------------------------------------------------------------------------

    fn reserve(&self, want: u64) -> u64 {
        if want == 0 {
            return 0;
        }
        let mut cur = self.entries.load(Ordering::Relaxed);
        loop {
            let grant = want.min(self.max_entries.saturating_sub(cur));
            if grant == 0 {
                return 0;
            }
            match self.entries.compare_exchange_weak(cur, cur + grant, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return grant,
                Err(now) => cur = now,
            }
        }
    }

    /// Records that a pod holds a chain ([`HeldChain`] says which, from where, and what of it).
    pub fn store(&self, chain: HeldChain<'_>, guard: &Guard) -> Stored {
        let mut out = Stored::default();
        self.store_into(chain, guard, &mut out);
        out
    }

    /// [`store`](Self::store), into `out` (reset first): a store's result is large, and the
    /// ingest path reuses one instead of moving a fresh one through every return.
    pub fn store_into(&self, chain: HeldChain<'_>, guard: &Guard, out: &mut Stored) {
        let HeldChain { pod, tier_bit, parent, hashes, hold_from, .. } = chain;
        out.clear();
        let n = hashes.len();
        if n == 0 {
            return;
        }
        let shard_idx = match parent {
            ParentKey::Root(r) => self.root_shard(r, hashes[0]),
            ParentKey::Block(p) => Pos::unpack(p).shard(),
        };
        let shard = &self.shards[shard_idx];
        let mut w = shard.writer.lock();
        // What earlier stores replaced is freed here once no reader can hold it, even if
        // this store replaces nothing.
        w.retired.free_passed();

        // 1. Follow what already exists: ranges (segment, start, end, first query index).
        let mut ranges: SmallVec<[(u32, u32, u32, usize); 4]> = SmallVec::new();
        let mut cur = parent;
        let mut i = 0;
        while i < n {
            if let ParentKey::Block(p) = cur {
                let pos = Pos::unpack(p);
                let seg = shard.dir.get(pos.local(), guard).expect("a held block's segment is live");
                let lim = seg.runs(guard).len().min(seg.storage(guard).cap() as u32);
                let st = seg.storage(guard);
                let (start, first) = (pos.off + 1, i);
                let mut o = start;
                while o < lim && i < n && st.hash(o as usize) == hashes[i] {
                    o += 1;
                    i += 1;
                }
                if o > start {
                    ranges.push((pos.local(), start, o, first));
                    cur = ParentKey::Block(Pos { seg: pos.seg, off: o - 1 }.pack());
                    continue;
                }
            }
            let Some((local, seg)) = self.find_child(shard, cur, hashes[i], guard) else { break };
            let lim = seg.runs(guard).len().min(seg.storage(guard).cap() as u32);
            let st = seg.storage(guard);
            let first = i;
            let mut o = 0;
            while o < lim && i < n && st.hash(o as usize) == hashes[i] {
                o += 1;
                i += 1;
            }
            if o == 0 {
                break; // an emptied segment still linked: treat as absent
            }
            ranges.push((local, 0, o, first));
            cur = ParentKey::Block(Pos { seg: global(shard_idx, local), off: o - 1 }.pack());
        }
        let existing_end = i;

        // 2. Hold the existing blocks, in chain order, as far as the bound allows.
        let holder_bit = |t: u8| t | tier_bit;
        let mut refused = false;
        for &(local, s0, e, first) in &ranges {
            // Blocks before `hold_from` are walked, not held.
            let s = s0 + hold_from.saturating_sub(first).min((e - s0) as usize) as u32;
            let first = first + (s - s0) as usize;
            if s == e {
                continue;
            }
            let seg = shard.dir.get(local, guard).expect("live");
            let runs = seg.runs(guard);
            for (a, b, tiers) in runs.held_pieces(s, e, pod) {
                out.held_before.push((first + (a - s) as usize, first + (b - s) as usize, tiers));
            }
            let need = runs.unheld_by(s, e, pod);
            let grant = self.reserve(need);
            let cut = if grant < need { runs.cut_after_new(s, e, pod, grant) } else { e };
            if cut > s {
                let mut stats = EditStats::default();
                let mut sums = [0u64; MAX_TIERS];
                let edited = runs.edit_with(s, cut, pod, holder_bit, &mut stats, |a, b, before, after| {
                    self.fold_digest(seg, guard, &mut sums, TierChange { a, b, before, after })
                });
                add_sums(&mut stats.digest, &sums);
                seg.set_runs(edited, &mut w.retired, guard);
                self.keys.fetch_add(stats.became_held, Ordering::Relaxed);
                // Reserved `grant` positions; exactly `stats.gained` of them were new.
                self.entries.fetch_sub(grant - stats.gained.min(grant), Ordering::Relaxed);
                out.stats.merge(&stats);
                push_unique(&mut out.segments, global(shard_idx, local));
            }
            out.applied = first + (cut - s) as usize;
            if cut < e {
                refused = true;
                break;
            }
        }
        if !refused {
            out.applied = existing_end;
        }

        // 3. The rest is new: grow the chain's segment in place, or start a branch (several,
        //    past a segment's length limit). Blocks before `hold_from` are created unheld.
        if !refused && existing_end < n {
            let held_start = existing_end.max(hold_from.min(n));
            let grant = self.reserve((n - held_start) as u64) as usize;
            let add = if grant == 0 { 0 } else { held_start - existing_end + grant };
            let holder = Holder::new(pod, tier_bit);
            let mut done = 0;
            while done < add {
                let first = existing_end + done;
                let (local, start, len) = match cur {
                    ParentKey::Block(p) if self.can_extend(shard, &w, Pos::unpack(p), guard) => {
                        let pos = Pos::unpack(p);
                        let seg = shard.dir.get(pos.local(), guard).expect("live");
                        let runs = seg.runs(guard);
                        let len = runs.len() as usize;
                        let k = (add - done).min(MAX_OFFSET as usize - len);
                        let new = &hashes[first..first + k];
                        let st = seg.storage(guard);
                        if len + k > st.cap() {
                            let cap = (len + k).max(st.cap() + st.cap() / 2).min(MAX_OFFSET as usize);
                            seg.set_storage(st.copied(len, cap, new), &mut w.retired, guard);
                        } else {
                            write_hashes(st, len, new);
                        }
                        let unheld = held_start.saturating_sub(first).min(k) as u32;
                        if unheld > 0 || !runs.grow_in_place(k as u32, holder) {
                            seg.set_runs(runs.extended(unheld, k as u32 - unheld, holder), &mut w.retired, guard);
                        }
                        (pos.local(), len as u32, k)
                    }
                    _ => {
                        let k = (add - done).min(MAX_OFFSET as usize);
                        let unheld = held_start.saturating_sub(first).min(k) as u32;
                        let new = &hashes[first..first + k];
                        let segment = NewSegment { parent: cur, hashes: new, unheld, holder };
                        match self.new_segment(shard_idx, &mut w, segment, guard) {
                            Some(local) => (local, 0, k),
                            None => break,
                        }
                    }
                };
                ranges.push((local, start, start + len as u32, first));
                cur = ParentKey::Block(Pos { seg: global(shard_idx, local), off: start + len as u32 - 1 }.pack());
                push_unique(&mut out.segments, global(shard_idx, local));
                done += len;
            }
            let held = (existing_end + done).saturating_sub(held_start);
            if held < grant {
                self.entries.fetch_sub((grant - held) as u64, Ordering::Relaxed);
            }
            self.keys.fetch_add(held as u64, Ordering::Relaxed);
            let stored_to = (existing_end + done) as u32;
            let before_held = match held_start.checked_sub(1) {
                Some(i) => hashes[i],
                None => match parent {
                    ParentKey::Root(r) => r,
                    ParentKey::Block(p) => self.key_at(Pos::unpack(p), guard).unwrap_or(0),
                },
            };
            let sums = &mut out.stats.digest;
            digest::fold(sums, held_start as u32, stored_to, 0, tier_bit, before_held, |i| hashes[i as usize]);
            out.stats.gained += held as u64;
            out.stats.became_held += held as u64;
            out.stats.tier_gained[tier_bit.trailing_zeros() as usize] += held as u64;
            out.applied = existing_end + done;
        }
        self.finish_store(shard_idx, &mut w, out, &ranges, &chain, guard);
    }

    /// Resolves the engine block ends of a store to positions and records their engine hashes.
    fn finish_store(
        &self,
        shard_idx: usize,
        w: &mut ShardWriter,
        out: &mut Stored,
        ranges: &[(u32, u32, u32, usize)],
        chain: &HeldChain<'_>,
        guard: &Guard,
    ) {
        let HeldChain { ends, index, .. } = *chain;
        let shard = &self.shards[shard_idx];
        // Ranges and ends both follow the chain (ranges by their first index, strictly
        // increasing): one cursor finds each end's range, and each range's storage is loaded
        // once, not once per end.
        let mut r = 0;
        let mut storage: Option<(usize, &Storage)> = None;
        for &(idx, engine) in ends {
            if idx >= out.applied {
                break;
            }
            while r + 1 < ranges.len() && ranges[r + 1].3 <= idx {
                r += 1;
            }
            debug_assert!(ranges[r].3 <= idx, "applied blocks lie in a range");
            let pos = position_in(shard_idx, ranges[r], idx);
            let local = ranges[r].0;
            let recorded = if index || engine == 0 {
                self.record_engine(w, pos, engine, index, guard)
            } else {
                let st = match storage {
                    Some((at, st)) if at == r => Some(st),
                    _ => shard.dir.get(local, guard).map(|seg| seg.storage(guard)),
                };
                storage = st.map(|st| (r, st));
                st.is_some_and(|st| record_in(st, pos.off as usize, engine))
            };
            out.ends.push((pos, recorded));
        }
        out.last = out.applied.checked_sub(1).map(|idx| {
            let range = ranges.iter().rev().find(|r| r.3 <= idx).expect("applied blocks lie in a range");
            position_in(shard_idx, *range, idx)
        });
    }

    /// Records `engine` as the block's engine hash unless it has another one (false: the caller
    /// keeps an exception). With `index`, also makes the engine table name the block, unless the
    /// hash names another block already. The caller holds the block's shard lock.
    fn record_engine(&self, w: &mut ShardWriter, pos: Pos, engine: u64, index: bool, guard: &Guard) -> bool {
        if engine == 0 {
            return false;
        }
        let Some(seg) = self.segment(pos.seg, guard) else { return false };
        let st = seg.storage(guard);
        if !index {
            return record_in(st, pos.off as usize, engine);
        }
        let recorded = st.engine(pos.off as usize);
        if recorded != 0 && recorded != engine {
            return false;
        }
        w.meta[pos.local() as usize].indexed = true;
        self.engines.insert(
            engine,
            pos.pack(),
            |b| self.engine_of(b, guard),
            || st.set_engine(pos.off as usize, engine),
            guard,
        ) || self.engines.get(engine, |b| self.engine_of(b, guard), guard) == Some(pos.pack())
    }

    /// Enters into the engine table every block of `segments` that `pod` holds and that has a
    /// recorded engine hash: what a pod's lookups need once they cannot rely on its chain ends
    /// (see `ingest`). Costs O(the pod's blocks) once.
    pub fn index_pod(&self, pod: PodId, segments: impl IntoIterator<Item = u32>, guard: &Guard) {
        for seg in segments {
            let p = Pos { seg, off: 0 };
            let Some(shard) = self.shards.get(p.shard()) else { continue };
            let mut w = shard.writer.lock();
            let Some(segment) = shard.dir.get(p.local(), guard) else { continue };
            let runs = segment.runs(guard);
            let st = segment.storage(guard);
            let mut start = 0;
            let mut any = false;
            for run in &runs.runs {
                let end = run.end().min(runs.len()).min(st.cap() as u32);
                if runs::tiers_in(&run.holders, pod) != 0 {
                    for off in start..end {
                        let engine = st.engine(off as usize);
                        if engine != 0 {
                            any = true;
                            let pos = Pos { seg, off }.pack();
                            self.engines.insert(engine, pos, |b| self.engine_of(b, guard), || {}, guard);
                        }
                    }
                }
                start = end;
            }
            if any {
                w.meta[p.local() as usize].indexed = true;
            }
        }
    }

    /// The engine hash recorded for the block at `pos` (0 = none).
    pub fn engine_at(&self, pos: Pos, guard: &Guard) -> u64 {
        self.engine_of(pos.pack(), guard)
    }

    fn can_extend(&self, shard: &Shard, w: &ShardWriter, pos: Pos, guard: &Guard) -> bool {
        let Some(seg) = shard.dir.get(pos.local(), guard) else { return false };
        let meta_sealed = w.meta.get(pos.local() as usize).is_some_and(|m| m.sealed);
        !meta_sealed && pos.off + 1 == seg.runs(guard).len() && pos.off + 1 < MAX_OFFSET
    }

    /// Puts `segment` in a free slot of the shard and links it under its parent; `None` when
    /// the shard's directory is full.
    fn new_segment(
        &self,
        shard_idx: usize,
        w: &mut ShardWriter,
        segment: NewSegment<'_>,
        guard: &Guard,
    ) -> Option<u32> {
        let NewSegment { parent, hashes, unheld, holder } = segment;
        let shard = &self.shards[shard_idx];
        let local = match w.free.pop() {
            Some(l) => l,
            None if w.next < SegmentDir::MAX => {
                w.next += 1;
                w.next - 1
            }
            None => return None,
        };
        if w.meta.len() <= local as usize {
            w.meta.resize_with(local as usize + 1, SegMeta::default);
        }
        w.meta[local as usize] = SegMeta::default();
        let st = Storage::of(hashes);
        let (raw, from_root) = match parent {
            ParentKey::Root(r) => (r, true),
            ParentKey::Block(p) => (p, false),
        };
        shard.dir.put(
            local,
            Segment {
                parent: raw,
                from_root,
                first: hashes[0],
                storage: Atomic::new(st),
                runs: Atomic::new(Runs::new_held(unheld, hashes.len() as u32 - unheld, holder)),
            },
        );
        if let ParentKey::Block(p) = parent {
            add_kid(&mut w.meta[Pos::unpack(p).local() as usize], Pos::unpack(p).off);
        }
        self.link(shard, w, branch_hash(parent, hashes[0]), local, guard);
        Some(local)
    }

    fn link(&self, shard: &Shard, w: &mut ShardWriter, hash: u64, local: u32, guard: &Guard) {
        // SAFETY: replaced by swap + retire only, never null.
        let mut table = unsafe { shard.children.load(Ordering::Acquire, guard).deref() };
        if (w.links + w.tombstones + 1) * 4 > table.capacity() * 3 {
            let rebuilt = ChildTable::with_capacity((w.links + 1) * 2);
            for child in table.live() {
                if let Some(seg) = shard.dir.get(child, guard) {
                    let key = if seg.from_root { ParentKey::Root(seg.parent) } else { ParentKey::Block(seg.parent) };
                    rebuilt.insert(branch_hash(key, seg.first), child);
                }
            }
            let old = shard.children.swap(Owned::new(rebuilt), Ordering::AcqRel, guard);
            // SAFETY: unlinked by the swap (never null) and retired once; readers that loaded
            // it are pinned.
            unsafe { w.retired.retire(old, table.bytes() as usize, guard) };
            w.tombstones = 0;
            // SAFETY: just stored, never null.
            table = unsafe { shard.children.load(Ordering::Acquire, guard).deref() };
        }
        if table.insert(hash, local) {
            w.tombstones -= 1;
        }
        w.links += 1;
    }

    /// Removes the tiers in `mask` from `pod`'s residency of the `count` blocks of a chain that
    /// end at `last`. Returns the pod's tiers of `last` before and after, and what changed.
    pub fn release(&self, pod: PodId, last: Pos, count: u32, mask: u8, guard: &Guard) -> (u8, u8, EditStats) {
        let shard_idx = last.shard();
        let shard = &self.shards[shard_idx];
        let mut w = shard.writer.lock();
        let before = self.tiers_at(last, pod, guard);
        let mut stats = EditStats::default();
        let mut pos = Some(last);
        let mut left = count;
        while let (Some(p), true) = (pos, left > 0) {
            let Some(seg) = shard.dir.get(p.local(), guard) else { break };
            let take = left.min(p.off + 1);
            let span = SegSpan { local: p.local(), s: p.off + 1 - take, e: p.off + 1 };
            let edit = PodEdit { pod, change: |t| t & !mask, digest: true };
            self.edit_segment(shard_idx, &mut w, span, edit, &mut stats, guard);
            left -= take;
            pos = if left > 0 && !seg.from_root { Some(Pos::unpack(seg.parent)) } else { None };
        }
        let after = self.tiers_at(last, pod, guard);
        (before, after, stats)
    }

    /// Adds tier `tier_bit` to `pod`'s residency of the `count` blocks of a chain ending at
    /// `last` (a tier re-announcement). Returns what changed; positions the bound refuses are
    /// left out (counted in `refused`).
    pub fn retier(&self, pod: PodId, last: Pos, count: u32, tier_bit: u8, guard: &Guard) -> (EditStats, u64) {
        let shard_idx = last.shard();
        let shard = &self.shards[shard_idx];
        let mut w = shard.writer.lock();
        let mut stats = EditStats::default();
        let mut refused = 0;
        let mut pos = Some(last);
        let mut left = count;
        while let (Some(p), true) = (pos, left > 0) {
            let Some(seg) = shard.dir.get(p.local(), guard) else { break };
            let take = left.min(p.off + 1);
            let (s, e) = (p.off + 1 - take, p.off + 1);
            let runs = seg.runs(guard);
            let need = runs.unheld_by(s, e, pod);
            let grant = self.reserve(need);
            refused += need - grant;
            if grant == need {
                let mut st = EditStats::default();
                let mut sums = [0u64; MAX_TIERS];
                let edited = runs.edit_with(
                    s,
                    e,
                    pod,
                    |t| t | tier_bit,
                    &mut st,
                    |a, b, before, after| self.fold_digest(seg, guard, &mut sums, TierChange { a, b, before, after }),
                );
                add_sums(&mut st.digest, &sums);
                self.keys.fetch_add(st.became_held, Ordering::Relaxed);
                seg.set_runs(edited, &mut w.retired, guard);
                stats.merge(&st);
            } else {
                self.entries.fetch_sub(grant, Ordering::Relaxed);
            }
            left -= take;
            pos = if left > 0 && !seg.from_root { Some(Pos::unpack(seg.parent)) } else { None };
        }
        drop(w);
        (stats, refused)
    }

    /// Drops every residency of `pod` in the given segments (its reverse set). Costs
    /// O(those segments' runs).
    pub fn clear_pod(&self, pod: PodId, segments: impl IntoIterator<Item = u32>, guard: &Guard) -> EditStats {
        let mut by_shard: Vec<Vec<u32>> = vec![Vec::new(); self.shards.len()];
        for seg in segments {
            let p = Pos { seg, off: 0 };
            if let Some(v) = by_shard.get_mut(p.shard()) {
                v.push(p.local());
            }
        }
        let mut stats = EditStats::default();
        for (shard_idx, locals) in by_shard.into_iter().enumerate() {
            if locals.is_empty() {
                continue;
            }
            let shard = &self.shards[shard_idx];
            let mut w = shard.writer.lock();
            for local in locals {
                let Some(seg) = shard.dir.get(local, guard) else { continue };
                let runs = seg.runs(guard);
                if runs.holds_any(pod) {
                    // The pod's digest starts over with its clear: no need to fold what it loses.
                    let span = SegSpan { local, s: 0, e: runs.len() };
                    let edit = PodEdit { pod, change: |_| 0, digest: false };
                    self.edit_segment(shard_idx, &mut w, span, edit, &mut stats, guard);
                }
            }
        }
        stats
    }

    /// Applies `edit` to its pod's tiers on `span` of a segment (never adding residencies),
    /// then cleans up what lost its last holder.
    fn edit_segment(
        &self,
        shard_idx: usize,
        w: &mut ShardWriter,
        span: SegSpan,
        edit: PodEdit<impl Fn(u8) -> u8>,
        stats: &mut EditStats,
        guard: &Guard,
    ) {
        let (SegSpan { local, s, e }, PodEdit { pod, change, digest }) = (span, edit);
        let shard = &self.shards[shard_idx];
        let Some(seg) = shard.dir.get(local, guard) else { return };
        let runs = seg.runs(guard);
        let mut st = EditStats::default();
        let mut sums = [0u64; MAX_TIERS];
        let edited = runs.edit_with(s, e, pod, change, &mut st, |a, b, before, after| {
            if digest {
                self.fold_digest(seg, guard, &mut sums, TierChange { a, b, before, after })
            }
        });
        add_sums(&mut st.digest, &sums);
        if edited == *runs {
            return;
        }
        seg.set_runs(edited, &mut w.retired, guard);
        self.entries.fetch_sub(st.lost, Ordering::Relaxed);
        if !st.became_unheld.is_empty() {
            let storage = seg.storage(guard);
            let indexed = w.meta[local as usize].indexed;
            let mut unheld = 0;
            for &(a, b) in &st.became_unheld {
                unheld += u64::from(b - a);
                for off in a..b.min(storage.cap() as u32) {
                    let engine = storage.engine(off as usize);
                    if engine != 0 {
                        if indexed {
                            self.engines.remove(engine, Pos { seg: global(shard_idx, local), off }.pack(), guard);
                        }
                        storage.set_engine(off as usize, 0);
                    }
                }
            }
            self.keys.fetch_sub(unheld, Ordering::Relaxed);
            self.trim(shard_idx, w, local, guard);
        }
        stats.merge(&st);
    }

    /// Folds into `sums` what `change` (blocks `[a, b)` of `seg`, from tiers `before` to
    /// `after`) moved the pod's digest by (see `digest`).
    fn fold_digest(&self, seg: &Segment, guard: &Guard, sums: &mut [u64; MAX_TIERS], change: TierChange) {
        let TierChange { a, b, before, after } = change;
        let st = seg.storage(guard);
        let b = b.min(st.cap() as u32);
        let parent = match a.checked_sub(1) {
            Some(prev) => st.hash(prev as usize),
            None if seg.from_root => seg.parent,
            None => self.key_at(Pos::unpack(seg.parent), guard).unwrap_or(0),
        };
        digest::fold(sums, a, b, before, after, parent, |i| st.hash(i as usize));
    }

    /// Cuts a segment's unheld tail (keeping blocks that branches hang off), and frees the
    /// segment, then its parent's tail, once nothing is left.
    fn trim(&self, shard_idx: usize, w: &mut ShardWriter, mut local: u32, guard: &Guard) {
        let shard = &self.shards[shard_idx];
        loop {
            let Some(seg) = shard.dir.get(local, guard) else { return };
            let runs = seg.runs(guard);
            let meta = &mut w.meta[local as usize];
            let kid_end = meta.kids.last().map_or(0, |&(o, _)| o + 1);
            let keep = runs.held_end().max(kid_end);
            if keep >= runs.len() {
                return;
            }
            meta.sealed = true;
            if keep > 0 {
                seg.set_runs(runs.truncated(keep), &mut w.retired, guard);
                let st = seg.storage(guard);
                if st.cap() > 2 * keep as usize + 16 {
                    seg.set_storage(st.copied(keep as usize, keep as usize, &[]), &mut w.retired, guard);
                }
                return;
            }
            // Nothing left: unlink the branch, free the number, and trim the parent.
            let key = if seg.from_root { ParentKey::Root(seg.parent) } else { ParentKey::Block(seg.parent) };
            // SAFETY: replaced by swap + retire only, never null.
            let table = unsafe { shard.children.load(Ordering::Acquire, guard).deref() };
            if table.remove(branch_hash(key, seg.first), local) {
                w.links -= 1;
                w.tombstones += 1;
            }
            let parent = (!seg.from_root).then(|| Pos::unpack(seg.parent));
            shard.dir.take(local, &mut w.retired, guard);
            w.meta[local as usize] = SegMeta::default();
            w.free.push(local);
            let Some(p) = parent else { return };
            remove_kid(&mut w.meta[p.local() as usize], p.off);
            local = p.local();
        }
    }

    /// Heap bytes held by the tree: segments (hashes, recorded engine hashes, runs), branch
    /// tables, directories and the engine table.
    pub fn approx_bytes(&self) -> u64 {
        let guard = epoch::pin();
        let mut bytes = self.engines.bytes();
        for shard in self.shards.iter() {
            let w = shard.writer.lock();
            bytes += shard.dir.directory_bytes() as u64;
            // SAFETY: never null; see `link`.
            bytes += unsafe { shard.children.load(Ordering::Acquire, &guard).deref() }.bytes();
            bytes += (w.meta.capacity() * std::mem::size_of::<SegMeta>() + w.free.capacity() * 4) as u64;
            for local in 0..w.next {
                if let Some(seg) = shard.dir.get(local, &guard) {
                    let runs = seg.runs(&guard);
                    bytes += (std::mem::size_of::<Segment>() + std::mem::size_of::<Runs>() + 16) as u64;
                    bytes += seg.storage(&guard).bytes() as u64;
                    if runs.runs.spilled() {
                        bytes += (runs.runs.capacity() * std::mem::size_of::<runs::Run>()) as u64;
                    }
                    for run in &runs.runs {
                        if run.holders.spilled() {
                            bytes += (run.holders.capacity() * 4) as u64;
                        }
                    }
                }
            }
        }
        bytes
    }

    /// Segments, links and engine entries, for tests and debugging.
    pub fn shape(&self) -> TreeShape {
        let guard = epoch::pin();
        let mut shape = TreeShape { engine_entries: self.engines.len() as u64, ..Default::default() };
        for shard in self.shards.iter() {
            let w = shard.writer.lock();
            shape.links += w.links as u64;
            for local in 0..w.next {
                if let Some(seg) = shard.dir.get(local, &guard) {
                    shape.segments += 1;
                    let runs = seg.runs(&guard);
                    shape.runs += runs.runs.len() as u64;
                    shape.positions += u64::from(runs.len());
                }
            }
        }
        shape
    }
}

/// A block a pod holds (see `Tree::held_in`).
#[derive(Debug, Clone, Copy)]
pub struct HeldBlock {
    pub pos: Pos,
    pub key: u64,
    /// The engine hash recorded on the block (0 = none).
    pub engine: u64,
    pub tiers: u8,
}

/// Counts of the tree's parts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TreeShape {
    pub segments: u64,
    pub runs: u64,
    pub positions: u64,
    pub links: u64,
    pub engine_entries: u64,
}

fn add_sums(into: &mut [u64; MAX_TIERS], sums: &[u64; MAX_TIERS]) {
    for (sum, d) in into.iter_mut().zip(sums) {
        *sum = sum.wrapping_add(*d);
    }
}

/// The position of a store's block `idx` in the range of the store that holds it: (segment
/// number in the shard, first offset, _, the range's first index in the store).
#[inline]
fn position_in(shard_idx: usize, (local, off, _, first): (u32, u32, u32, usize), idx: usize) -> Pos {
    Pos { seg: global(shard_idx, local), off: off + (idx - first) as u32 }
}

/// Records `engine` on the block at `off` unless it has another one recorded (false).
#[inline]
fn record_in(st: &Storage, off: usize, engine: u64) -> bool {
    let recorded = st.engine(off);
    if recorded != 0 && recorded != engine {
        return false;
    }
    st.set_engine(off, engine);
    true
}

fn write_hashes(st: &Storage, at: usize, hashes: &[u64]) {
    for (k, &h) in hashes.iter().enumerate() {
        st.set_hash(at + k, h);
        st.set_engine(at + k, 0);
    }
}

fn push_unique(v: &mut SmallVec<[u32; 4]>, x: u32) {
    if !v.contains(&x) {
        v.push(x);
    }
}

fn add_kid(meta: &mut SegMeta, off: u32) {
    match meta.kids.binary_search_by_key(&off, |k| k.0) {
        Ok(i) => meta.kids[i].1 += 1,
        Err(i) => meta.kids.insert(i, (off, 1)),
    }
}

fn remove_kid(meta: &mut SegMeta, off: u32) {
    if let Ok(i) = meta.kids.binary_search_by_key(&off, |k| k.0) {
        meta.kids[i].1 -= 1;
        if meta.kids[i].1 == 0 {
            meta.kids.remove(i);
        }
    }
}

#[cfg(test)]
mod tests;
