//! Storage tiers (the engines' `medium`: vLLM's GPU, CPU, STORAGE; SGLang's GPU, CPU_PINNED,
//! DISK, EXTERNAL; …) and their scoring weights.
//!
//! Weights follow llm-d's tier classes (llm-d-router#2809): gpu 1.0, cpu 0.8, shared_storage
//! 0.4, object_store 0.2, and 0 for a tier of no known class, whose blocks are still held but
//! counted (`ApplyReport::unweighted_tier_blocks`). [`TierWeights`] changes the class weights;
//! a configured per-name weight (`set_weight`) overrides its class.
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

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use parking_lot::RwLock;

/// At most this many distinct tiers; a tier set fits in one byte.
pub const MAX_TIERS: usize = 8;

/// The names vLLM itself defines (`MEDIUM_GPU`, and in 0.33 `CPU`, `STORAGE`).
pub const PREDEFINED: [&str; 3] = ["GPU", "CPU", "STORAGE"];

/// Longest tier name learned from a publisher.
pub const MAX_TIER_NAME: usize = 32;

/// llm-d's tier classes, which decide a tier's default weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierClass {
    Gpu,
    Cpu,
    SharedStorage,
    ObjectStore,
    /// No known class: weight [`TierWeights::unknown`] (0 by default), counted.
    Unknown,
}

impl TierClass {
    /// The class of an engine's tier name (case-insensitive): `GPU`; `CPU`, `CPU_PINNED`
    /// (SGLang's host memory); `STORAGE` (vLLM's offload), `SHARED_STORAGE`, `DISK` (SGLang's
    /// local SSD), `EXTERNAL` (SGLang's shared pool, e.g. Mooncake); `OBJECT_STORE`.
    pub fn of(name: &str) -> TierClass {
        const CLASSES: [(&str, TierClass); 8] = [
            ("GPU", TierClass::Gpu),
            ("CPU", TierClass::Cpu),
            ("CPU_PINNED", TierClass::Cpu),
            ("STORAGE", TierClass::SharedStorage),
            ("SHARED_STORAGE", TierClass::SharedStorage),
            ("DISK", TierClass::SharedStorage),
            ("EXTERNAL", TierClass::SharedStorage),
            ("OBJECT_STORE", TierClass::ObjectStore),
        ];
        CLASSES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map_or(TierClass::Unknown, |(_, c)| *c)
    }
}

/// The weight of each tier class; [`Default`] is llm-d's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierWeights {
    pub gpu: f64,
    pub cpu: f64,
    pub shared_storage: f64,
    pub object_store: f64,
    pub unknown: f64,
}

impl Default for TierWeights {
    fn default() -> Self {
        TierWeights { gpu: 1.0, cpu: 0.8, shared_storage: 0.4, object_store: 0.2, unknown: 0.0 }
    }
}

impl TierWeights {
    pub fn of(&self, class: TierClass) -> f64 {
        match class {
            TierClass::Gpu => self.gpu,
            TierClass::Cpu => self.cpu,
            TierClass::SharedStorage => self.shared_storage,
            TierClass::ObjectStore => self.object_store,
            TierClass::Unknown => self.unknown,
        }
    }
}

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
    /// Each tier's weight (`f64` bits), read by every score without a lock: a score never
    /// waits for a writer learning a tier, nor writes a cache line writers use.
    weights: [AtomicU64; MAX_TIERS],
    /// Bit per tier whose weight no class or configuration gave (scored 0, counted).
    unweighted: AtomicU8,
    classes: TierWeights,
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
    /// GPU, CPU and STORAGE are predefined; every tier weighs what llm-d's class of its name
    /// does (see [`TierClass::of`]) unless configured.
    pub fn new() -> Self {
        Self::with_limits(TierLimits::default())
    }

    pub fn with_limits(limits: TierLimits) -> Self {
        Self::with_weights(limits, TierWeights::default())
    }

    /// Tiers whose classes weigh `classes`.
    pub fn with_weights(limits: TierLimits, classes: TierWeights) -> Self {
        let mut weights = [classes.unknown; MAX_TIERS];
        for (i, name) in PREDEFINED.iter().enumerate() {
            weights[i] = classes.of(TierClass::of(name));
        }
        Tiers {
            names: RwLock::new(PREDEFINED.iter().map(|n| n.to_string()).collect()),
            weights: weights.map(|w| AtomicU64::new(w.to_bits())),
            unweighted: AtomicU8::new(0),
            classes,
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
        let id = TierId((names.len() - 1) as u8);
        let class = TierClass::of(medium);
        self.weights[id.0 as usize].store(self.classes.of(class).to_bits(), Ordering::Release);
        if class == TierClass::Unknown {
            self.unweighted.fetch_or(id.bit(), Ordering::AcqRel);
        }
        self.learned.fetch_add(1, Ordering::AcqRel);
        self.len.store(names.len() as u8, Ordering::Release);
        Some(id)
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
        self.weights[id.0 as usize].store(weight.to_bits(), Ordering::Release);
        self.unweighted.fetch_and(!id.bit(), Ordering::AcqRel);
        Some(id)
    }

    /// Whether `id`'s weight came from neither a class nor the configuration (scored at
    /// [`TierWeights::unknown`]; its blocks are counted).
    pub fn is_unweighted(&self, id: TierId) -> bool {
        self.unweighted.load(Ordering::Acquire) & id.bit() != 0
    }

    pub fn weights(&self) -> [f64; MAX_TIERS] {
        std::array::from_fn(|i| f64::from_bits(self.weights[i].load(Ordering::Acquire)))
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
    fn llm_d_class_weights_and_unknown_tiers_at_zero() {
        let t = Tiers::new();
        let w = |name: &str| {
            let id = t.learn(name).unwrap();
            t.weights()[id.0 as usize]
        };
        assert_eq!((w("GPU"), w("CPU"), w("STORAGE")), (1.0, 0.8, 0.4));
        assert_eq!((w("CPU_PINNED"), w("disk"), w("EXTERNAL"), w("object_store")), (0.8, 0.4, 0.4, 0.2));
        let odd = t.learn("lmcache.weird").unwrap();
        assert_eq!(t.weights()[odd.0 as usize], 0.0);
        assert!(t.is_unweighted(odd) && !t.is_unweighted(TierId::CPU));
        t.set_weight("lmcache.weird", 0.3);
        assert!(!t.is_unweighted(odd), "a configured weight is known");
        let custom = Tiers::with_weights(TierLimits::default(), TierWeights { cpu: 0.5, ..TierWeights::default() });
        assert_eq!(custom.weights()[TierId::CPU.0 as usize], 0.5);
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
