//! Kubernetes pod discovery in the router: the `kvindex-discovery` watcher's changes become
//! the fleet's `Discovered` entries, one per DP rank (`<podIP>:<http_port + r>`, the indexer's
//! pod ids for the same ranks). A pod deleted, NotReady or moved to a new IP leaves the fleet.

use std::sync::Arc;

use kvindex_discovery::{Change, DiscoveredPod, Outcome, WatchConfig};
use tokio::sync::watch;

use crate::metrics as m;
use crate::pods::fleet::{Fleet, Source};
use crate::pods::spec::{PodSpec, Role};

/// The fleet entries of one discovered pod: one per DP rank.
pub fn specs(pod: &DiscoveredPod) -> Vec<PodSpec> {
    (0..pod.dp_size).map(|r| PodSpec { id: pod.rank_pod_id(r), url: pod.http_url(r), role: Role::Both }).collect()
}

/// Applies one outcome of the watcher to the fleet.
pub fn apply(fleet: &Fleet, outcome: &Outcome) {
    for change in &outcome.changes {
        match change {
            Change::Remove(pod) => {
                for spec in specs(pod) {
                    if let Err(e) = fleet.remove(&spec.id, Source::Discovered) {
                        tracing::warn!(pod = %spec.id, error = %e, "discovered pod not removed");
                    }
                }
                metrics::counter!(m::POD_CHANGES, "source" => "discovery", "op" => "remove").increment(1);
            }
            Change::Add(pod) => {
                for spec in specs(pod) {
                    if let Err(e) = fleet.upsert(&spec, Source::Discovered) {
                        tracing::warn!(pod = %spec.id, error = %e, "discovered pod refused");
                    }
                }
                metrics::counter!(m::POD_CHANGES, "source" => "discovery", "op" => "add").increment(1);
            }
        }
    }
}

/// Watches until `stop` is set.
pub async fn run(
    fleet: Arc<Fleet>,
    client: kvindex_discovery::Client,
    config: WatchConfig,
    stop: watch::Receiver<bool>,
) {
    let consume = move |outcome: Outcome| {
        apply(&fleet, &outcome);
        async {}
    };
    kvindex_discovery::watcher::run(client, config, consume, stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pod(ip: &str, dp_size: u32) -> DiscoveredPod {
        DiscoveredPod {
            name: "llm/vllm-0".into(),
            ip: ip.parse().unwrap(),
            model: None,
            dp_size,
            pub_port: 5557,
            replay_port: None,
            http_port: 8000,
            engine: None,
            page_size: None,
            engine_version: None,
            kv_events_format: None,
            rules: kvindex::PodRules::default(),
            annotated: kvindex_discovery::Annotated::default(),
        }
    }

    #[test]
    fn each_rank_is_a_pod_and_leaves_with_its_pod() {
        let fleet = Fleet::new(Duration::from_secs(2));
        fleet.upsert(&specs(&pod("10.0.0.1", 1))[0], Source::Static).unwrap();
        let add = Outcome {
            changes: vec![Change::Add(pod("10.0.0.2", 2)), Change::Add(pod("10.0.0.1", 1))],
            ..Default::default()
        };
        apply(&fleet, &add);
        let ids: Vec<String> = fleet.snapshot().iter().map(|p| p.id.clone()).collect();
        assert_eq!(ids, ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.2:8001"]);
        assert_eq!(fleet.get("10.0.0.2:8001").unwrap().url, "http://10.0.0.2:8001");
        assert_eq!(fleet.get("10.0.0.1:8000").unwrap().source, Source::Static, "the command line wins");
        assert!(fleet.upsert(&specs(&pod("10.0.0.2", 1))[0], Source::Registered).is_err());
        apply(&fleet, &Outcome { changes: vec![Change::Remove(pod("10.0.0.2", 2))], ..Default::default() });
        let ids: Vec<String> = fleet.snapshot().iter().map(|p| p.id.clone()).collect();
        assert_eq!(ids, ["10.0.0.1:8000"]);
    }
}
