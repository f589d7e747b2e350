//! Approximate prefix affinity, as GIE's `prefix` plugin: the router hashes the prompt in
//! fixed chunks, remembers which pods it sent each chunk to (an LRU of bounded size per pod),
//! and scores a pod by the leading chunks it was sent. It never sees evictions, so it
//! believes a pod still holds what it was sent long ago, and each router replica only knows
//! its own history.

use std::collections::{BTreeMap, HashMap};

use super::{pick_weighted, FleetView, Policy};
use crate::engine::request::splitmix64;

/// One pod's remembered chunks, least recently sent first.
#[derive(Debug, Default)]
struct PodMemory {
    last_used: HashMap<u64, u64>,
    by_age: BTreeMap<u64, u64>,
}

#[derive(Debug)]
pub struct ApproximatePrefix {
    chunk_tokens: usize,
    capacity_chunks: usize,
    memories: Vec<PodMemory>,
    tick: u64,
    rotate: usize,
}

impl ApproximatePrefix {
    /// `capacity_chunks` per pod; GIE sizes it from the pod's KV capacity.
    pub fn new(pods: usize, chunk_tokens: usize, capacity_chunks: usize) -> Self {
        ApproximatePrefix {
            chunk_tokens: chunk_tokens.max(1),
            capacity_chunks: capacity_chunks.max(1),
            memories: (0..pods).map(|_| PodMemory::default()).collect(),
            tick: 0,
            rotate: 0,
        }
    }

    fn chunk_hashes(&self, prompt: &[u32]) -> Vec<u64> {
        let mut parent = 0u64;
        prompt
            .chunks_exact(self.chunk_tokens)
            .map(|chunk| {
                parent = chunk.iter().fold(splitmix64(parent), |h, &t| splitmix64(h ^ u64::from(t)));
                parent
            })
            .collect()
    }

    fn remember(&mut self, pod: usize, hashes: &[u64]) {
        let capacity = self.capacity_chunks;
        let Some(memory) = self.memories.get_mut(pod) else {
            return;
        };
        for &hash in hashes {
            self.tick += 1;
            if let Some(old) = memory.last_used.insert(hash, self.tick) {
                memory.by_age.remove(&old);
            }
            memory.by_age.insert(self.tick, hash);
            while memory.last_used.len() > capacity {
                let Some((_, oldest)) = memory.by_age.pop_first() else {
                    break;
                };
                memory.last_used.remove(&oldest);
            }
        }
    }
}

impl Policy for ApproximatePrefix {
    fn name(&self) -> &str {
        "approximate-prefix"
    }

    fn choose(&mut self, prompt: &[u32], fleet: &FleetView<'_>) -> usize {
        let hashes = self.chunk_hashes(prompt);
        let fractions: Vec<f64> = self
            .memories
            .iter()
            .map(|memory| {
                let matched = hashes.iter().take_while(|h| memory.last_used.contains_key(h)).count();
                if hashes.is_empty() {
                    0.0
                } else {
                    matched as f64 / hashes.len() as f64
                }
            })
            .collect();
        self.rotate = self.rotate.wrapping_add(1);
        let pod = pick_weighted(fleet, &fractions, self.rotate);
        self.remember(pod, &hashes);
        pod
    }
}
