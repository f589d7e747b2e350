//! Round-robin: the cache-blind baseline. A conversation's turn hits only when it happens to
//! land where an earlier turn ran.

use super::{FleetView, Policy};

#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &str {
        "round-robin"
    }

    fn choose(&mut self, _prompt: &[u32], fleet: &FleetView<'_>) -> usize {
        let pod = self.next % fleet.pods.len().max(1);
        self.next = self.next.wrapping_add(1);
        pod
    }
}
