//! Routing policies compared on the same request sequence. Every policy sees the prompt and
//! the pods' load (what a router scrapes from `/metrics`); they differ in what they know about
//! the pods' prefix caches:
//! * [`round_robin`] and [`least_loaded`]: nothing;
//! * [`approximate_prefix`]: where it sent each prefix before (GIE's `prefix` plugin);
//! * [`precise`]: a `kvindex::KvIndex` fed with the pods' published KV events;
//! * [`precise_grpc`]: the same through the real service (`kvindex serve`, ZeroMQ, gRPC);
//! * [`router_processes`]: `kvindex-router` processes (its own cost model) over that service;
//! * [`oracle`]: every pod's actual cache.
//!
//! Cache-aware policies combine their prefix signal with load the way llm-d's default
//! scorer weights do (prefix 3, KV-cache utilisation 2, queue 2), so "cache affinity yields
//! to load" identically for all of them and only the prefix signal differs.

pub mod approximate_prefix;
pub mod least_loaded;
pub mod oracle;
pub mod precise;
pub mod precise_grpc;
pub mod replicated;
pub mod round_robin;
pub mod router_processes;
pub mod service_feed;

use crate::engine::{Engine, EngineStats, KvEvent};

/// What a policy may look at for every pod when choosing.
pub struct FleetView<'a> {
    pub pods: &'a [&'a Engine],
}

impl FleetView<'_> {
    pub fn stats(&self, pod: usize) -> EngineStats {
        self.pods[pod].stats()
    }
}

pub trait Policy {
    fn name(&self) -> &str;
    /// The pod for this prompt.
    fn choose(&mut self, prompt: &[u32], fleet: &FleetView<'_>) -> usize;
    /// Whether [`Policy::observe`] should be called (decoding events costs time).
    fn wants_events(&self) -> bool {
        false
    }
    /// A batch a pod published, as a subscriber receives it.
    fn observe(&mut self, _pod: usize, _batch: &kvindex::wire::EventBatch<'_>) {}
    /// Whether [`Policy::publish_step`] should get each step's events before any encoding
    /// (a policy that sends them over a real transport itself).
    fn wants_step_events(&self) -> bool {
        false
    }
    /// A pod's step events, as its engine produced them, at the step's end.
    fn publish_step(&mut self, _pod: usize, _events: &[KvEvent]) {}
    /// Why the policy's results cannot be trusted (e.g. the service it routes through
    /// failed); the driver stops and reports it instead of a hit rate.
    fn failure(&self) -> Option<String> {
        None
    }
}

/// llm-d's default weights for the prefix, KV-utilisation and queue scorers.
pub const PREFIX_WEIGHT: f64 = 3.0;
pub const KV_WEIGHT: f64 = 2.0;
pub const QUEUE_WEIGHT: f64 = 2.0;

/// The load part of a pod's score, in `[0, KV_WEIGHT + QUEUE_WEIGHT]`: free KV and a short queue.
pub fn load_score(stats: &EngineStats, max_waiting: usize) -> f64 {
    let queue = if max_waiting == 0 { 1.0 } else { 1.0 - stats.num_waiting as f64 / max_waiting as f64 };
    KV_WEIGHT * (1.0 - stats.kv_usage) + QUEUE_WEIGHT * queue
}

/// Picks the pod with the best `PREFIX_WEIGHT × prefix fraction + load`; ties go to the lowest
/// index after `rotate`, so idle fleets are not all sent to pod 0.
pub fn pick_weighted(fleet: &FleetView<'_>, prefix_fraction: &[f64], rotate: usize) -> usize {
    let count = fleet.pods.len();
    let max_waiting = (0..count).map(|p| fleet.stats(p).num_waiting).max().unwrap_or(0);
    let mut best = (f64::NEG_INFINITY, 0);
    for offset in 0..count {
        let pod = (rotate + offset) % count;
        let score = PREFIX_WEIGHT * prefix_fraction.get(pod).copied().unwrap_or(0.0)
            + load_score(&fleet.stats(pod), max_waiting);
        if score > best.0 + 1e-12 {
            best = (score, pod);
        }
    }
    best.1
}
