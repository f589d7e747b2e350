//! Storage tiers (vLLM's `medium`: GPU, CPU, STORAGE, …) and their scoring weights.
//!
//! A residency records a bit per tier, so a pod holding a block on both GPU and CPU is one
//! entry. Names are case-insensitive; a missing `medium` (vLLM before 0.10.2) means GPU.
//!
//! The table has [`MAX_TIERS`] slots and `medium` is peer-supplied, so the slots are handed out
//! in a fixed order: vLLM's own names (GPU, CPU, STORAGE) first, then the tiers the operator
//! configures a weight for (before any event is applied), and only then names learned from
//! publishers, which must look like a tier name and are capped by [`TierLimits`]. Junk names
//! can therefore never take the slot of a predefined or configured tier, and a source that
//! sprays names is stopped at its own per-source cap (enforced by the pod's ingest state).

use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::RwLock;

/// At most this many distinct tiers; a tier set fits in one byte.
pub const MAX_TIERS: usize = 8;

/// The names vLLM itself defines (`MEDIUM_GPU`, and in 0.33 `CPU`, `STORAGE`).
pub const PREDEFINED: [&str; 3] = ["GPU", "CPU", "STORAGE"];

/// Longest tier name learned from a publisher.
pub const MAX_TIER_NAME: usize = 32;

/// A tier's bit position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TierId(pub u8);

impl TierId {
    pub const GPU: TierId = TierId(0);
    pub const CPU: TierId = TierId(1);
    pub const STORAGE: TierId = TierId(2);

    pub fn bit(self) -> u8 {
        1 << self.0
    }
}

/// Bounds on the tiers publishers may introduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierLimits {
    /// Distinct tiers one source's blocks may be held in (predefined ones included).
    pub max_per_source: usize,
    /// Names learned from publishers (neither predefined nor configured), all sources together.
    pub max_learned: usize,
}

impl Default for TierLimits {
    fn default() -> Self {
        TierLimits { max_per_source: 4, max_learned: MAX_TIERS - PREDEFINED.len() }
    }
}

/// Why a `medium` got no tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierRefusal {
    /// Not 1..=[`MAX_TIER_NAME`] bytes of ASCII letters, digits, `_`, `-`, `.`.
    BadName,
    /// The table, or the share of it learned names may take, is full.
    TableFull,
}

/// Interned tier names and weights. Shared by ingest and scoring.
#[derive(Debug)]
pub struct Tiers {
    names: RwLock<Vec<String>>,
    weights: RwLock<[f64; MAX_TIERS]>,
    len: AtomicU8,
    /// Names learned from publishers so far.
    learned: AtomicU8,
    limits: TierLimits,
}

impl Default for Tiers {
    fn default() -> Self {
        Self::new()
    }
}

impl Tiers {
    /// GPU (weight 1.0), CPU (0.8, as in llm-d) and STORAGE (1.0) are predefined; other tiers
    /// weigh 1.0 unless configured.
    pub fn new() -> Self {
        Self::with_limits(TierLimits::default())
    }

    pub fn with_limits(limits: TierLimits) -> Self {
        let mut weights = [1.0; MAX_TIERS];
        weights[TierId::CPU.0 as usize] = 0.8;
        Tiers {
            names: RwLock::new(PREDEFINED.iter().map(|n| n.to_string()).collect()),
            weights: RwLock::new(weights),
            len: AtomicU8::new(PREDEFINED.len() as u8),
            learned: AtomicU8::new(0),
            limits,
        }
    }

    pub fn limits(&self) -> TierLimits {
        self.limits
    }

    /// The id of `medium`, registering it on first sight as a learned name. `None` when it is
    /// refused (see [`Tiers::learn`]).
    pub fn intern(&self, medium: Option<&str>) -> Option<TierId> {
        match medium {
            None => Some(TierId::GPU),
            Some(medium) => self.learn(medium).ok(),
        }
    }

    /// The id of a publisher's `medium`, learning it if it is new: its name must be a plausible
    /// tier name and learned names must have room left (`max_learned`, and the table).
    pub fn learn(&self, medium: &str) -> Result<TierId, TierRefusal> {
        if let Some(id) = self.lookup(medium) {
            return Ok(id);
        }
        if !valid_name(medium) {
            return Err(TierRefusal::BadName);
        }
        if self.learned.load(Ordering::Acquire) as usize >= self.limits.max_learned {
            return Err(TierRefusal::TableFull);
        }
        let id = self.insert(medium).ok_or(TierRefusal::TableFull)?;
        Ok(id)
    }

    /// Registers a configured name (not counted as learned). `None` when the table is full.
    fn configure(&self, medium: &str) -> Option<TierId> {
        if let Some(id) = self.lookup(medium) {
            return Some(id);
        }
        let mut names = self.names.write();
        if names.len() >= MAX_TIERS {
            return None;
        }
        names.push(medium.to_ascii_uppercase());
        self.len.store(names.len() as u8, Ordering::Release);
        Some(TierId((names.len() - 1) as u8))
    }

    /// Inserts a learned name under the write lock (re-checking both bounds there).
    fn insert(&self, medium: &str) -> Option<TierId> {
        let mut names = self.names.write();
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(medium)) {
            return Some(TierId(i as u8));
        }
        if names.len() >= MAX_TIERS || self.learned.load(Ordering::Acquire) as usize >= self.limits.max_learned {
            return None;
        }
        names.push(medium.to_ascii_uppercase());
        self.learned.fetch_add(1, Ordering::AcqRel);
        self.len.store(names.len() as u8, Ordering::Release);
        Some(TierId((names.len() - 1) as u8))
    }

    pub fn lookup(&self, medium: &str) -> Option<TierId> {
        let names = self.names.read();
        names.iter().position(|n| n.eq_ignore_ascii_case(medium)).map(|i| TierId(i as u8))
    }

    /// Sets a configured tier's weight, registering the tier if needed (configured names are
    /// not bounded by the learned share, only by the table). Configure tiers before applying
    /// events, so that they get their slots before any publisher can learn names.
    pub fn set_weight(&self, medium: &str, weight: f64) -> Option<TierId> {
        let id = self.configure(medium)?;
        self.weights.write()[id.0 as usize] = weight;
        Some(id)
    }

    pub fn weights(&self) -> [f64; MAX_TIERS] {
        *self.weights.read()
    }

    pub fn name(&self, id: TierId) -> String {
        self.names.read().get(id.0 as usize).cloned().unwrap_or_else(|| format!("TIER{}", id.0))
    }

    pub fn count(&self) -> usize {
        self.len.load(Ordering::Acquire) as usize
    }

    /// The largest weight among the tiers in `mask`.
    pub fn best_weight(weights: &[f64; MAX_TIERS], mask: u8) -> f64 {
        (0..MAX_TIERS).filter(|i| mask & (1 << i) != 0).map(|i| weights[i]).fold(0.0, f64::max)
    }
}

/// Whether a peer-supplied `medium` looks like a tier name (`GPU`, `LOCAL_DISK`, `lmcache.cpu`).
pub fn valid_name(medium: &str) -> bool {
    (1..=MAX_TIER_NAME).contains(&medium.len())
        && medium.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_case_insensitive_and_missing_means_gpu() {
        let t = Tiers::new();
        assert_eq!(t.intern(None), Some(TierId::GPU));
        assert_eq!(t.intern(Some("gpu")), Some(TierId::GPU));
        assert_eq!(t.intern(Some("Cpu")), Some(TierId::CPU));
        let storage = t.intern(Some("storage")).unwrap();
        assert_eq!(t.intern(Some("STORAGE")), Some(storage));
        assert_eq!(t.name(storage), "STORAGE");
    }

    #[test]
    fn best_weight_takes_the_largest_tier() {
        let t = Tiers::new();
        let w = t.weights();
        assert_eq!(Tiers::best_weight(&w, TierId::CPU.bit()), 0.8);
        assert_eq!(Tiers::best_weight(&w, TierId::CPU.bit() | TierId::GPU.bit()), 1.0);
        assert_eq!(Tiers::best_weight(&w, 0), 0.0);
    }

    #[test]
    fn tier_slots_are_bounded() {
        let t = Tiers::new();
        for i in 0..(MAX_TIERS - PREDEFINED.len()) {
            assert!(t.intern(Some(&format!("t{i}"))).is_some());
        }
        assert_eq!(t.intern(Some("one-too-many")), None);
        assert_eq!(t.learn("one-too-many"), Err(TierRefusal::TableFull));
        assert_eq!(t.learn("gpu"), Ok(TierId::GPU), "known names still resolve");
    }

    #[test]
    fn configured_tiers_keep_their_slots_and_junk_names_are_refused() {
        let t = Tiers::with_limits(TierLimits { max_per_source: 4, max_learned: 2 });
        let disk = t.set_weight("LOCAL_DISK", 0.5).unwrap();
        assert_eq!(t.learn("bad\nname"), Err(TierRefusal::BadName));
        assert_eq!(t.learn(&"X".repeat(MAX_TIER_NAME + 1)), Err(TierRefusal::BadName));
        assert_eq!(t.learn(""), Err(TierRefusal::BadName));
        assert!(t.learn("junk1").is_ok() && t.learn("junk2").is_ok());
        assert_eq!(t.learn("junk3"), Err(TierRefusal::TableFull), "the learned share is full");
        assert_eq!(t.learn("local_disk"), Ok(disk), "a configured tier is never crowded out");
        assert_eq!(t.learn("storage"), Ok(TierId::STORAGE), "nor a predefined one");
        assert_eq!(t.weights()[disk.0 as usize], 0.5);
        assert_eq!(t.count(), PREDEFINED.len() + 3);
    }
}
