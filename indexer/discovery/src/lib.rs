//! Kubernetes pod discovery for kvindex: which engines to subscribe to (the indexer) or route
//! to (the router), from the pods the API server lists and watches, and what engine each is.
//!
//! Two layers, as in the rest of kvindex: a pure core ([`settings`], [`observe`], [`target`],
//! [`desired`], [`server_info`], [`probe_gate`]) that turns watch events and engine
//! descriptions into add/remove [`Change`]s with no I/O, clock or async, unit- and
//! property-tested without a cluster (and [`precedence`]: which source of a pod entry wins,
//! one rule for both services); and a thin shell ([`watcher`], [`engine_probe`]) that runs
//! kube-runtime's list+watch state machine against the API server, asks new pods what engine
//! they are, and feeds the core.
//!
//! Only pods that are Running, Ready (condition `Ready=True`), not terminating and have an IP
//! count. A pod that stops being one of those, is deleted, changes IP or disappears from a
//! re-list is removed, and its consumer clears everything it held: an old IP's blocks are
//! never kept.

pub mod args;
pub mod desired;
pub mod engine_probe;
#[cfg(feature = "fake-api")]
pub mod fake_api;
pub mod metrics;
pub mod observe;
pub mod precedence;
pub mod probe_gate;
pub mod server_info;
pub mod settings;
pub mod target;
pub mod watcher;

/// The Kubernetes client type the watcher runs on (so consumers need not depend on kube).
pub use kube::Client;

pub use args::DiscoveryArgs;
pub use desired::{Change, DesiredSet, Outcome, WatchEvent};
pub use observe::{PodObservation, Rejection};
pub use precedence::PodOrigin;
pub use settings::Settings;
pub use target::{Annotated, DiscoveredPod};
pub use watcher::{ApiServer, WatchConfig};
