//! Least-loaded: the load scorers alone (queue length and KV usage), no cache signal.

use super::{pick_weighted, FleetView, Policy};

#[derive(Debug, Default)]
pub struct LeastLoaded {
    rotate: usize,
}

impl Policy for LeastLoaded {
    fn name(&self) -> &str {
        "least-loaded"
    }

    fn choose(&mut self, _prompt: &[u32], fleet: &FleetView<'_>) -> usize {
        self.rotate = self.rotate.wrapping_add(1);
        pick_weighted(fleet, &vec![0.0; fleet.pods.len()], self.rotate)
    }
}
