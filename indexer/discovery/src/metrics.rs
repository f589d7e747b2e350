//! The metric names discovery exports (the same in `kvindex serve` and `kvindex-router`;
//! docs/METRICS.md lists them), and the table that declares each one's kind, labels and help.

use kvindex_metric_defs::{Kind, Metric};

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

/// Counter: engine probes of new pods (`GET /server_info`), by `outcome` (`sglang`,
/// `not_sglang`, `timeout`, `unreachable`, `too_large`, `bad_status`, `bad_body`).
pub const ENGINE_PROBES: &str = "kvindex_discovery_engine_probes_total";

/// Every metric discovery exports: kind, labels and help (docs/METRICS.md is held to it).
pub const METRICS: &[Metric] = &[
    Metric {
        name: PODS,
        kind: Kind::Gauge,
        labels: &[],
        unit: None,
        help: "Kubernetes pods discovered and in use (Running, Ready, with an IP)",
    },
    Metric {
        name: CHANGES,
        kind: Kind::Counter,
        labels: &["op"],
        unit: None,
        help: "Discovered pods added and removed, by op",
    },
    Metric {
        name: WATCH_ERRORS,
        kind: Kind::Counter,
        labels: &["reason"],
        unit: None,
        help: "Kubernetes list/watch failures, by reason (retried with backoff)",
    },
    Metric {
        name: RELISTS,
        kind: Kind::Counter,
        labels: &[],
        unit: None,
        help: "Kubernetes pod (re-)lists started: one at start, one per watch restart",
    },
    Metric {
        name: REJECTED,
        kind: Kind::Counter,
        labels: &["reason"],
        unit: None,
        help: "Pod objects whose data could not be used (missing IP, bad annotation), by reason",
    },
    Metric {
        name: ENGINE_PROBES,
        kind: Kind::Counter,
        labels: &["outcome"],
        unit: None,
        help: "Engine probes of new pods (SGLang's /server_info), by outcome",
    },
];

/// Registers the descriptions with the process's metrics recorder.
pub fn describe() {
    kvindex_metric_defs::describe(METRICS);
}
