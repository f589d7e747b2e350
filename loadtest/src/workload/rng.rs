//! A tiny seeded generator (splitmix64) so workloads are reproducible without a dependency.

use crate::engine::request::splitmix64;

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }

    /// Uniform in `low..=high` (returns `low` when the range is empty).
    pub fn range(&mut self, low: usize, high: usize) -> usize {
        if high <= low {
            return low;
        }
        low + (self.next_u64() % (high - low + 1) as u64) as usize
    }

    /// Uniform in `[low, high)`.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        low + (high - low) * unit
    }

    /// `count` token ids in `[first_id, first_id + vocab)`.
    pub fn tokens(&mut self, count: usize, first_id: u32, vocab: u32) -> Vec<u32> {
        (0..count).map(|_| first_id + (self.next_u64() % u64::from(vocab.max(1))) as u32).collect()
    }
}
