//! A bounded, sharded cache of tokenized text prefixes, so that the next turn of a chat only
//! tokenizes what is new (see [`crate::incremental`] for when reusing a prefix is exact).
//!
//! **Privacy.** The cache holds prompt text and token ids, in process memory only: nothing in it
//! is ever logged, persisted, exported or returned to anyone but the request that supplied the
//! same text (its `Debug` shows counts only). Entries leave on LRU eviction and when their model
//! is unloaded; setting the budget to 0 disables the cache.
//!
//! **Layout.** A cached prefix is a chain of nodes. Each node holds one segment of text (from
//! one cut point to the next) and that segment's token ids, and is stored under the hash of the
//! *whole* prefix it ends: model instance, namespace and every byte before its end. A node names
//! its parent by the parent's key, so conversations sharing a beginning share its nodes, and a
//! conversation's turns cost one copy of its text. A lookup hashes the request's candidate cut
//! points, finds the longest one stored, and walks the chain to the start comparing **every
//! byte** of every segment with the request text: a hash collision, a stale or replaced node, or
//! a chain broken by eviction can only cause a shorter reuse or a miss, never wrong ids.
//!
//! **Bounds and locking.** The byte budget is split over up to 16 shards (one per 4 MiB, so a
//! small cache is one exact LRU); each shard is a mutex over a key → node map and a recency
//! order, held only for map operations: hashing, byte comparison, id copying and tokenization
//! run outside every lock. A request touches its whole chain leaf first, so ancestors are always
//! more recent than their descendants and eviction removes leaves before what they hang from.
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::Xxh3;

/// Default budget: 64 MiB holds roughly 1,000 distinct 8k-token conversations (ids only).
pub const DEFAULT_PREFIX_CACHE_BYTES: usize = 64 << 20;

/// Bytes per shard below which shards are not split further.
const MIN_SHARD_BYTES: usize = 4 << 20;
const MAX_SHARDS: usize = 16;

/// Bookkeeping charged per node on top of its text, ids and offsets (map slot, recency entry,
/// `Arc` header, boxed slices).
const NODE_OVERHEAD_BYTES: usize = 256;

/// One cached segment of a prefix: the text between two cut points and its token ids.
pub(crate) struct Node {
    /// The model instance that tokenized it (a reloaded model is a new instance).
    pub model: u64,
    /// Whether `offsets` is filled: id-only and offset requests never share nodes.
    pub with_offsets: bool,
    /// Byte offset of the segment in the whole text.
    pub start: usize,
    /// Key of the node ending at `start`; `None` exactly when `start` is 0.
    pub parent: Option<u64>,
    pub text: Box<str>,
    pub ids: Box<[u32]>,
    /// Character offsets relative to the segment's first character (empty unless `with_offsets`).
    pub offsets: Box<[(u32, u32)]>,
}

impl Node {
    fn bytes(&self) -> usize {
        NODE_OVERHEAD_BYTES + self.text.len() + self.ids.len() * 4 + self.offsets.len() * 8
    }
}

/// A stored prefix of a request's text that matched byte for byte.
pub(crate) struct CachedPrefix {
    /// Byte length of the prefix (a cut point of the request text).
    pub end: usize,
    /// The chain, first segment first.
    pub chain: Vec<Arc<Node>>,
    /// The chain's keys, in the same order.
    pub keys: Vec<u64>,
}

/// Reuse counters, for the router's and the service's metrics. Counts only, never content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Requests that reused a cached prefix.
    pub hits: u64,
    /// Requests that could have been cut but found no cached prefix (first sight).
    pub misses: u64,
    /// Requests tokenized in full without consulting the cache: the model cannot be cut
    /// provably (see `LoadedModel::incremental_disabled_reason`), the text has no cut point, or
    /// the cache is disabled.
    pub bypassed: u64,
    /// Token ids copied from the cache instead of being computed.
    pub tokens_reused: u64,
    /// Token ids computed by the tokenizer (in hits, misses and bypasses).
    pub tokens_tokenized: u64,
    /// Nodes evicted to stay within the budget.
    pub evictions: u64,
    /// Nodes currently stored.
    pub nodes: u64,
    /// Bytes currently charged (text, ids, offsets and bookkeeping).
    pub bytes: u64,
    /// The configured budget.
    pub capacity_bytes: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    bypassed: AtomicU64,
    tokens_reused: AtomicU64,
    tokens_tokenized: AtomicU64,
    evictions: AtomicU64,
}

struct Slot {
    node: Arc<Node>,
    tick: u64,
}

#[derive(Default)]
struct Shard {
    slots: FxHashMap<u64, Slot>,
    /// tick → key, least recently used first.
    recency: BTreeMap<u64, u64>,
    bytes: usize,
}

impl Shard {
    fn remove(&mut self, key: u64) -> Option<Slot> {
        let slot = self.slots.remove(&key)?;
        self.recency.remove(&slot.tick);
        self.bytes -= slot.node.bytes();
        Some(slot)
    }

    fn set_tick(&mut self, key: u64, tick: u64) {
        if let Some(slot) = self.slots.get_mut(&key) {
            self.recency.remove(&slot.tick);
            slot.tick = tick;
            self.recency.insert(tick, key);
        }
    }

    /// Stores `node` under `key` unless an equivalent node is there (same model, namespace and
    /// span: then the stored one is kept and only its recency changes).
    fn insert(&mut self, key: u64, node: Node, tick: u64) {
        if let Some(slot) = self.slots.get(&key) {
            let old = &slot.node;
            if old.model == node.model
                && old.with_offsets == node.with_offsets
                && old.start == node.start
                && old.text.len() == node.text.len()
            {
                self.set_tick(key, tick);
                return;
            }
            self.remove(key);
        }
        self.bytes += node.bytes();
        self.slots.insert(key, Slot { node: Arc::new(node), tick });
        self.recency.insert(tick, key);
    }

    /// Evicts least recently used nodes until the shard fits `budget`; returns how many.
    fn evict_to(&mut self, budget: usize) -> u64 {
        let mut evicted = 0;
        while self.bytes > budget {
            let Some((_, key)) = self.recency.pop_first() else {
                break;
            };
            if let Some(slot) = self.slots.remove(&key) {
                self.bytes -= slot.node.bytes();
                evicted += 1;
            }
        }
        evicted
    }
}

/// What one request does to the cache once it is tokenized.
enum Op {
    Insert(u64, Node),
    Touch(u64),
}

/// The prefix cache. Shared by every model of a registry; keys include the model instance.
pub struct PrefixCache {
    shards: Box<[Mutex<Shard>]>,
    shard_budget: usize,
    capacity: usize,
    /// Random per process, so nobody can aim texts at one another's keys.
    seed: u64,
    clock: AtomicU64,
    counters: Counters,
}

impl std::fmt::Debug for PrefixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixCache").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

/// Longest chain a lookup follows before giving up (a chain grows by a few nodes per turn).
const MAX_CHAIN: usize = 1 << 16;

impl PrefixCache {
    /// A cache holding at most `capacity_bytes` (0 disables it).
    pub fn new(capacity_bytes: usize) -> Self {
        let shards = (capacity_bytes / MIN_SHARD_BYTES).clamp(1, MAX_SHARDS);
        let shards = if shards.is_power_of_two() { shards } else { shards.next_power_of_two() / 2 };
        Self {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            shard_budget: capacity_bytes / shards,
            capacity: capacity_bytes,
            seed: std::collections::hash_map::RandomState::new().build_hasher().finish(),
            clock: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// A hasher over `(model, namespace, text...)`: feed the text and read `digest()` at each
    /// candidate cut point to get that prefix's key.
    pub(crate) fn prefix_hasher(&self, model: u64, with_offsets: bool) -> Xxh3 {
        let mut hasher = Xxh3::with_seed(self.seed);
        hasher.update(&model.to_le_bytes());
        hasher.update(&[u8::from(with_offsets)]);
        hasher
    }

    fn shard(&self, key: u64) -> &Mutex<Shard> {
        &self.shards[self.shard_index(key)]
    }

    fn get(&self, key: u64) -> Option<Arc<Node>> {
        self.shard(key).lock().slots.get(&key).map(|s| s.node.clone())
    }

    /// The longest stored prefix of `text` among `candidates` (`(end, key)`, ascending ends),
    /// verified byte for byte, probing at most `max_probes` candidates from the longest down.
    pub(crate) fn longest_prefix(
        &self,
        model: u64,
        with_offsets: bool,
        text: &str,
        candidates: &[(usize, u64)],
        max_probes: usize,
    ) -> Option<CachedPrefix> {
        candidates.iter().rev().take(max_probes).find_map(|&(end, key)| {
            let leaf = self.get(key)?;
            self.verified_chain(model, with_offsets, text, end, key, leaf)
        })
    }

    fn verified_chain(
        &self,
        model: u64,
        with_offsets: bool,
        text: &str,
        end: usize,
        key: u64,
        leaf: Arc<Node>,
    ) -> Option<CachedPrefix> {
        let bytes = text.as_bytes();
        let (mut chain, mut keys) = (Vec::new(), Vec::new());
        let (mut node, mut key, mut end) = (leaf, key, end);
        loop {
            let start = end.checked_sub(node.text.len())?;
            if node.model != model
                || node.with_offsets != with_offsets
                || node.start != start
                || bytes.get(start..end)? != node.text.as_bytes()
                || chain.len() >= MAX_CHAIN
            {
                return None;
            }
            let parent = node.parent;
            chain.push(node);
            keys.push(key);
            match parent {
                None if start == 0 => break,
                None => return None,
                Some(parent_key) => {
                    node = self.get(parent_key)?;
                    key = parent_key;
                    end = start;
                }
            }
        }
        let end = chain[0].start + chain[0].text.len();
        chain.reverse();
        keys.reverse();
        Some(CachedPrefix { end, chain, keys })
    }

    /// Stores `new` nodes (`(key, node)`, first segment first, each the parent of the next) and
    /// refreshes `reused` (the chain they hang from, first segment first). Recency runs leaf to
    /// root: the new leaf is the oldest of the lot and the chain's first node the newest, so no
    /// node is ever evicted before its descendants in the same shard.
    pub(crate) fn store(&self, new: Vec<(u64, Node)>, reused: &[u64]) {
        if !self.enabled() {
            return;
        }
        let total = (new.len() + reused.len()) as u64;
        let base = self.clock.fetch_add(total, Ordering::Relaxed);
        let mut ops: Vec<(usize, u64, Op)> = Vec::with_capacity(total as usize);
        let new_len = new.len();
        for (i, (key, node)) in new.into_iter().enumerate() {
            if node.bytes() <= self.shard_budget {
                ops.push((self.shard_index(key), base + (new_len - 1 - i) as u64, Op::Insert(key, node)));
            }
        }
        for (j, &key) in reused.iter().enumerate() {
            let tick = base + (new_len + reused.len() - 1 - j) as u64;
            ops.push((self.shard_index(key), tick, Op::Touch(key)));
        }
        ops.sort_by_key(|(shard, tick, _)| (*shard, *tick));
        let mut ops = ops.into_iter().peekable();
        while let Some(&(index, _, _)) = ops.peek() {
            let mut shard = self.shards[index].lock();
            while let Some((_, tick, op)) = ops.next_if(|(i, _, _)| *i == index) {
                match op {
                    Op::Insert(key, node) => shard.insert(key, node, tick),
                    Op::Touch(key) => shard.set_tick(key, tick),
                }
            }
            let evicted = shard.evict_to(self.shard_budget);
            drop(shard);
            if evicted > 0 {
                self.counters.evictions.fetch_add(evicted, Ordering::Relaxed);
                metrics::counter!(crate::telemetry::PREFIX_CACHE_EVICTIONS).increment(evicted);
            }
        }
    }

    /// Keys are uniform hashes: high bits choose the shard, the shard's map hashes the rest.
    fn shard_index(&self, key: u64) -> usize {
        (key >> 32) as usize & (self.shards.len() - 1)
    }

    /// Drops every node of a model instance (called when the model is unloaded).
    pub(crate) fn purge_model(&self, model: u64) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let keys: Vec<u64> = shard.slots.iter().filter(|(_, s)| s.node.model == model).map(|(k, _)| *k).collect();
            for key in keys {
                shard.remove(key);
            }
        }
    }

    pub(crate) fn record_hit(&self, reused: usize, tokenized: usize) {
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        self.add_tokens("hit", reused, tokenized);
    }

    pub(crate) fn record_miss(&self, tokenized: usize) {
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        self.add_tokens("miss", 0, tokenized);
    }

    pub(crate) fn record_bypass(&self, tokenized: usize) {
        self.counters.bypassed.fetch_add(1, Ordering::Relaxed);
        self.add_tokens("bypass", 0, tokenized);
    }

    /// Also counted as Prometheus metrics, for the service binary (a no-op without a recorder).
    fn add_tokens(&self, outcome: &'static str, reused: usize, tokenized: usize) {
        metrics::counter!(crate::telemetry::PREFIX_CACHE_REQUESTS, "outcome" => outcome).increment(1);
        if reused > 0 {
            self.counters.tokens_reused.fetch_add(reused as u64, Ordering::Relaxed);
            metrics::counter!(crate::telemetry::PREFIX_CACHE_TOKENS, "source" => "reused").increment(reused as u64);
        }
        self.counters.tokens_tokenized.fetch_add(tokenized as u64, Ordering::Relaxed);
        metrics::counter!(crate::telemetry::PREFIX_CACHE_TOKENS, "source" => "tokenized").increment(tokenized as u64);
    }

    /// Counters since start-up plus the current size.
    pub fn stats(&self) -> PrefixCacheStats {
        let (mut nodes, mut bytes) = (0u64, 0u64);
        for shard in self.shards.iter() {
            let shard = shard.lock();
            nodes += shard.slots.len() as u64;
            bytes += shard.bytes as u64;
        }
        let c = &self.counters;
        PrefixCacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            bypassed: c.bypassed.load(Ordering::Relaxed),
            tokens_reused: c.tokens_reused.load(Ordering::Relaxed),
            tokens_tokenized: c.tokens_tokenized.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            nodes,
            bytes,
            capacity_bytes: self.capacity as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: u64 = 7;

    fn key(cache: &PrefixCache, text: &str) -> u64 {
        let mut hasher = cache.prefix_hasher(MODEL, false);
        hasher.update(text.as_bytes());
        hasher.digest()
    }

    /// Nodes for `text` cut at `cuts` (byte ends), ids = segment lengths.
    fn chain(cache: &PrefixCache, text: &str, cuts: &[usize]) -> Vec<(u64, Node)> {
        let mut start = 0;
        let mut parent = None;
        cuts.iter()
            .map(|&end| {
                let k = key(cache, &text[..end]);
                let node = Node {
                    model: MODEL,
                    with_offsets: false,
                    start,
                    parent,
                    text: text[start..end].into(),
                    ids: vec![end as u32].into(),
                    offsets: Box::new([]),
                };
                (start, parent) = (end, Some(k));
                (k, node)
            })
            .collect()
    }

    fn candidates(cache: &PrefixCache, text: &str, ends: &[usize]) -> Vec<(usize, u64)> {
        ends.iter().map(|&e| (e, key(cache, &text[..e]))).collect()
    }

    #[test]
    fn finds_the_longest_stored_prefix_and_checks_every_byte() {
        let cache = PrefixCache::new(1 << 20);
        let text = "aaaa|bbbb|cccc|";
        cache.store(chain(&cache, text, &[5, 10, 15]), &[]);
        let found = cache
            .longest_prefix(MODEL, false, "aaaa|bbbb|cccc|dd", &candidates(&cache, text, &[5, 10, 15]), 8)
            .unwrap();
        assert_eq!((found.end, found.chain.len()), (15, 3));
        // Same keys, different bytes in the middle (as a hash collision would be): no match.
        assert!(cache.longest_prefix(MODEL, false, "aaaa|bXbb|cccc|", &candidates(&cache, text, &[15]), 8).is_none());
        // Another model or namespace never matches.
        assert!(cache.longest_prefix(MODEL + 1, false, text, &candidates(&cache, text, &[15]), 8).is_none());
        assert!(cache.longest_prefix(MODEL, true, text, &candidates(&cache, text, &[15]), 8).is_none());
    }

    #[test]
    fn stays_within_budget_and_evicts_leaves_before_their_ancestors() {
        let text = "x".repeat(300) + "|" + &"y".repeat(300) + "|";
        let node_bytes = chain(&PrefixCache::new(1), &text, &[301])[0].1.bytes();
        // Room for two nodes of this size.
        let cache = PrefixCache::new(2 * node_bytes + node_bytes / 2);
        cache.store(chain(&cache, &text, &[301, 602]), &[]);
        assert_eq!(cache.stats().nodes, 2);
        let other = "z".repeat(300) + "|";
        cache.store(chain(&cache, &other, &[301]), &[]);
        let stats = cache.stats();
        assert_eq!((stats.nodes, stats.evictions), (2, 1));
        assert!(stats.bytes <= stats.capacity_bytes);
        // The leaf (…y|) went first: its root still serves the shorter prefix.
        let found = cache.longest_prefix(MODEL, false, &text, &candidates(&cache, &text, &[301, 602]), 8).unwrap();
        assert_eq!(found.end, 301);
    }

    #[test]
    fn purging_a_model_drops_its_nodes_and_a_zero_budget_stores_nothing() {
        let cache = PrefixCache::new(1 << 20);
        cache.store(chain(&cache, "ab|cd|", &[3, 6]), &[]);
        cache.purge_model(MODEL);
        assert_eq!((cache.stats().nodes, cache.stats().bytes), (0, 0));
        let disabled = PrefixCache::new(0);
        assert!(!disabled.enabled());
        disabled.store(chain(&disabled, "ab|", &[3]), &[]);
        assert_eq!(disabled.stats().nodes, 0);
    }
}
