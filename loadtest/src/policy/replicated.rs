//! Active-active placement: k independent replicas of a policy, each request handled by one of
//! them in turn (as a load balancer in front of k router instances would). Replicas of the
//! approximate policy each remember only the requests they placed themselves; precise replicas
//! all read the same index, so they behave as one.

use super::{FleetView, Policy};

pub struct Replicated {
    name: String,
    replicas: Vec<Box<dyn Policy>>,
    next: usize,
}

impl Replicated {
    /// `name` labels the report (e.g. "approximate-prefix ×4").
    pub fn new(name: impl Into<String>, replicas: Vec<Box<dyn Policy>>) -> Self {
        Replicated { name: name.into(), replicas, next: 0 }
    }
}

impl Policy for Replicated {
    fn name(&self) -> &str {
        &self.name
    }

    fn choose(&mut self, prompt: &[u32], fleet: &FleetView<'_>) -> usize {
        if self.replicas.is_empty() {
            return 0;
        }
        let replica = self.next % self.replicas.len();
        self.next = self.next.wrapping_add(1);
        self.replicas[replica].choose(prompt, fleet)
    }

    fn wants_events(&self) -> bool {
        self.replicas.iter().any(|r| r.wants_events())
    }

    fn observe(&mut self, pod: usize, batch: &kvindex::wire::EventBatch<'_>) {
        for replica in &mut self.replicas {
            replica.observe(pod, batch);
        }
    }

    fn wants_step_events(&self) -> bool {
        self.replicas.iter().any(|r| r.wants_step_events())
    }

    fn publish_step(&mut self, pod: usize, events: &[crate::engine::KvEvent]) {
        for replica in self.replicas.iter_mut().filter(|r| r.wants_step_events()) {
            replica.publish_step(pod, events);
        }
    }

    fn failure(&self) -> Option<String> {
        self.replicas.iter().find_map(|r| r.failure())
    }
}
