//! Storage tiers (vLLM's `medium`: GPU, CPU, STORAGE, …) and their scoring weights.
//!
//! A residency records a bit per tier, so a pod holding a block on both GPU and CPU is one
//! entry. Names are case-insensitive; a missing `medium` (vLLM before 0.10.2) means GPU.

use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::RwLock;

/// At most this many distinct tiers; a tier set fits in one byte.
pub const MAX_TIERS: usize = 8;

/// A tier's bit position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TierId(pub u8);

impl TierId {
    pub const GPU: TierId = TierId(0);
    pub const CPU: TierId = TierId(1);

    pub fn bit(self) -> u8 {
        1 << self.0
    }
}

/// Interned tier names and weights. Shared by ingest and scoring.
#[derive(Debug)]
pub struct Tiers {
    names: RwLock<Vec<String>>,
    weights: RwLock<[f64; MAX_TIERS]>,
    len: AtomicU8,
}

impl Default for Tiers {
    fn default() -> Self {
        Self::new()
    }
}

impl Tiers {
    /// GPU (weight 1.0) and CPU (0.8) are predefined, as in llm-d; other tiers weigh 1.0
    /// unless configured.
    pub fn new() -> Self {
        let mut weights = [1.0; MAX_TIERS];
        weights[TierId::CPU.0 as usize] = 0.8;
        Tiers {
            names: RwLock::new(vec!["GPU".into(), "CPU".into()]),
            weights: RwLock::new(weights),
            len: AtomicU8::new(2),
        }
    }

    /// The id of `medium`, registering it on first sight. `None` when all slots are taken.
    pub fn intern(&self, medium: Option<&str>) -> Option<TierId> {
        let Some(medium) = medium else { return Some(TierId::GPU) };
        if let Some(id) = self.lookup(medium) {
            return Some(id);
        }
        let mut names = self.names.write();
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(medium)) {
            return Some(TierId(i as u8));
        }
        if names.len() >= MAX_TIERS {
            return None;
        }
        names.push(medium.to_ascii_uppercase());
        self.len.store(names.len() as u8, Ordering::Release);
        Some(TierId((names.len() - 1) as u8))
    }

    pub fn lookup(&self, medium: &str) -> Option<TierId> {
        let names = self.names.read();
        names.iter().position(|n| n.eq_ignore_ascii_case(medium)).map(|i| TierId(i as u8))
    }

    /// Sets a tier's weight, registering the tier if needed.
    pub fn set_weight(&self, medium: &str, weight: f64) -> Option<TierId> {
        let id = self.intern(Some(medium))?;
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
        for i in 0..(MAX_TIERS - 2) {
            assert!(t.intern(Some(&format!("t{i}"))).is_some());
        }
        assert_eq!(t.intern(Some("one-too-many")), None);
    }
}
