//! The oracle: reads every pod's actual prefix cache at decision time (no event lag, nothing
//! missed). The upper bound for any cache-aware policy with the same load weights.

use super::{pick_weighted, FleetView, Policy};

#[derive(Debug, Default)]
pub struct Oracle {
    rotate: usize,
}

impl Policy for Oracle {
    fn name(&self) -> &str {
        "oracle"
    }

    fn choose(&mut self, prompt: &[u32], fleet: &FleetView<'_>) -> usize {
        let Some(first) = fleet.pods.first() else {
            return 0;
        };
        let block_size = first.config().block_size;
        let usable = prompt.len().saturating_sub(1) / block_size * block_size;
        // All pods hash alike: hash the prompt once.
        let hashes = first.hasher().hash_chain(None, &prompt[..usable], block_size, &[]);
        let fractions: Vec<f64> = fleet
            .pods
            .iter()
            .map(|pod| (pod.cached_prefix_blocks(&hashes) * block_size) as f64 / prompt.len().max(1) as f64)
            .collect();
        self.rotate = self.rotate.wrapping_add(1);
        pick_weighted(fleet, &fractions, self.rotate)
    }
}
