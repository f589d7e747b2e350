//! Kubernetes pod discovery in the router: the `kvindex-discovery` watcher's changes become
//! the fleet's `Discovered` entries, one per DP rank (`<podIP>:<http_port + r>`, the indexer's
//! pod ids for the same ranks). A pod deleted, NotReady or moved to a new IP leaves the fleet.
//!
//! An SGLang pod (the `kvindex.io/engine` annotation) serves all its ranks behind its one HTTP
//! port: it is one pod with `dp_size` ranks there, the router naming the rank where the
//! release's OpenAI routes take it (`kvindex.io/engine-version` 0.5.19 or later), else the
//! engine picking (credited what every rank holds).

use std::sync::Arc;

use kvindex::sglang::SglangRelease;
use kvindex::wire::Engine;
use kvindex_discovery::{Change, DiscoveredPod, Outcome, WatchConfig};
use tokio::sync::watch;

use crate::metrics as m;
use crate::pods::fleet::{Fleet, Source};
use crate::pods::spec::{DpRouting, PodSpec, Role};

/// The fleet entries of one discovered pod: one per DP rank, each at its own port (vLLM and
/// llm-d's convention), or an SGLang pod with its ranks behind one port.
pub fn specs(pod: &DiscoveredPod) -> Vec<PodSpec> {
    if pod.engine == Some(Engine::Sglang) && pod.dp_size > 1 {
        let names_rank = pod
            .engine_version
            .as_deref()
            .and_then(|v| v.parse::<SglangRelease>().ok())
            .is_some_and(SglangRelease::routes_named_dp_rank);
        let dp_routing = if names_rank { DpRouting::Router } else { DpRouting::Engine };
        let spec = PodSpec::new(pod.pod_id(), pod.http_url(0), Role::Both);
        return vec![PodSpec { dp_size: pod.dp_size, dp_routing, ..spec }];
    }
    (0..pod.dp_size).map(|r| PodSpec::new(pod.rank_pod_id(r), pod.http_url(r), Role::Both)).collect()
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

    #[test]
    fn an_sglang_pod_serves_its_ranks_behind_one_port_and_the_release_says_who_picks_the_rank() {
        let sglang = |version: Option<&str>| DiscoveredPod {
            engine: Some(Engine::Sglang),
            engine_version: version.map(str::to_string),
            http_port: 30000,
            ..pod("10.0.0.3", 2)
        };
        for (version, routing) in [
            (Some("0.5.23"), DpRouting::Router),
            (Some("0.5.19"), DpRouting::Router),
            (Some("0.5.6"), DpRouting::Engine),
            (Some("not a version"), DpRouting::Engine),
            (None, DpRouting::Engine),
        ] {
            let specs = specs(&sglang(version));
            assert_eq!(specs.len(), 1, "{version:?}");
            let s = &specs[0];
            assert_eq!((s.id.as_str(), s.url.as_str()), ("10.0.0.3:30000", "http://10.0.0.3:30000"));
            assert_eq!((s.dp_size, s.dp_routing), (2, routing), "{version:?}");
        }
        let one_rank = specs(&DiscoveredPod { dp_size: 1, ..sglang(Some("0.5.23")) });
        assert_eq!(one_rank, [PodSpec::new("10.0.0.3:30000", "http://10.0.0.3:30000", Role::Both)]);
    }
}
