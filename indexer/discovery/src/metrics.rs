//! The metric names discovery exports (the same in `kvindex serve` and `kvindex-router`;
//! docs/METRICS.md lists them).

/// Gauge: pods discovered and in use.
pub const PODS: &str = "kvindex_discovery_pods";
/// Counter: pods added and removed, by `op` (`add`, `remove`).
pub const CHANGES: &str = "kvindex_discovery_changes_total";
/// Counter: watch or list failures, by `reason`; the watcher retries with backoff.
pub const WATCH_ERRORS: &str = "kvindex_discovery_watch_errors_total";
/// Counter: (re-)lists started: 1 at start, then one per watch restart (expired
/// resourceVersion, lost connection).
pub const RELISTS: &str = "kvindex_discovery_relists_total";
/// Counter: pod objects whose data could not be used, by `reason`.
pub const REJECTED: &str = "kvindex_discovery_rejected_total";

/// Registers the descriptions with the process's metrics recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(PODS, "Kubernetes pods discovered and in use (Running, Ready, with an IP)");
    describe_counter!(CHANGES, "Discovered pods added and removed, by op");
    describe_counter!(WATCH_ERRORS, "Kubernetes list/watch failures, by reason (retried with backoff)");
    describe_counter!(RELISTS, "Kubernetes pod (re-)lists started: one at start, one per watch restart");
    describe_counter!(REJECTED, "Pod objects whose data could not be used (missing IP, bad annotation), by reason");
}
