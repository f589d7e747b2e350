//! Kubernetes pod discovery in `kvindex serve`: the `kvindex-discovery` watcher's changes
//! become registrations with origin `discovery` (operator pods: the registration API cannot
//! replace or remove them). Per-pod mode dials each rank's `tcp://<podIP>:<pub_port + r>`
//! with replay at `<replay_port + r>`; central mode (`zmq_bind`, engines dial us) registers
//! the pod without an endpoint, which gives its topic's streams their replay endpoint. A pod
//! deleted, NotReady or moved to a new IP is unregistered, which clears everything it held:
//! an old IP's blocks are never kept. `/readyz` waits for the first complete list. A pod id
//! the config file or pods file already names is left to them; one registered through the
//! API is taken over (the [`super::precedence`] rule). A discovered pod's engine and page size
//! (its annotations, else SGLang's `/server_info`, else `default_engine`) become its entry's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvindex_discovery::{Change, DiscoveredPod, Outcome, WatchConfig};

use crate::config::pod::PodConfig;
use crate::shutdown::Shutdown;
use crate::telemetry as m;

use super::lifecycle::Pods;
use super::precedence;

/// The registry origin of discovered pods.
pub const ORIGIN: &str = "discovery";

/// Model recorded for a central-mode pod with no model annotation or setting: its topic
/// carries the real one.
const TOPIC_MODEL: &str = "(topic)";

/// Runs discovery until `shutdown`; `central`: engines dial us (`zmq_bind`), so discovered
/// pods are not dialled.
pub async fn run(
    pods: Pods,
    client: kvindex_discovery::Client,
    config: WatchConfig,
    central: bool,
    shutdown: Shutdown,
) {
    pods.readiness().sync_started();
    let synced = Arc::new(AtomicBool::new(false));
    let consume = {
        let (pods, synced) = (pods.clone(), synced.clone());
        move |outcome: Outcome| {
            let (pods, synced) = (pods.clone(), synced.clone());
            async move {
                let startup = !synced.load(Ordering::Acquire);
                apply(&pods, outcome.changes, startup, central).await;
                if outcome.synced && !synced.swap(true, Ordering::AcqRel) {
                    pods.readiness().sync_finished();
                }
            }
        }
    };
    kvindex_discovery::watcher::run(client, config, consume, shutdown.into_watch()).await;
    if !synced.load(Ordering::Acquire) {
        pods.readiness().sync_finished();
    }
}

async fn apply(pods: &Pods, changes: Vec<Change>, startup: bool, central: bool) {
    for change in changes {
        match change {
            Change::Remove(pod) => {
                let id = pod.pod_id();
                if pods.registry().origin_of(&id) == Some(ORIGIN) {
                    pods.unregister(&id, ORIGIN).await;
                }
            }
            Change::Add(pod) => {
                let id = pod.pod_id();
                // The operator's own configuration wins; an API registration is replaced.
                let existing = pods.registry().origin_of(&id);
                if let Some(origin) = existing.filter(|_| !precedence::may_replace(ORIGIN, existing)) {
                    metrics::counter!(m::CONTROL_DENIED, "api" => ORIGIN, "reason" => "operator_pod").increment(1);
                    tracing::warn!(pod = %id, k8s_pod = %pod.name, origin, "discovered pod is configured by the operator elsewhere; left as configured");
                    continue;
                }
                let cfg = pod_config(&pod, central);
                if let Err(e) = pods.register(cfg, ORIGIN, startup).await {
                    tracing::error!(error = %e, k8s_pod = %pod.name, "discovered pod rejected");
                }
            }
        }
    }
}

/// The registration of a discovered pod: dialled in per-pod mode, topic-named in central mode.
fn pod_config(pod: &DiscoveredPod, central: bool) -> PodConfig {
    let sglang = pod.engine == Some(kvindex::wire::Engine::Sglang);
    PodConfig {
        id: pod.pod_id(),
        model: pod.model.clone().unwrap_or_else(|| TOPIC_MODEL.to_string()),
        endpoint: (!central).then(|| pod.pub_endpoint(0)),
        replay_endpoint: pod.replay_endpoint(0),
        topic_id: None,
        dp_size: pod.dp_size,
        engine: pod.engine,
        page_size: pod.page_size,
        // What discovery learned of an SGLang pod's release and event format drives its
        // page-hash cross-check (anything unreadable: the server's defaults).
        sglang_release: sglang.then(|| pod.engine_version.as_deref()?.parse().ok()).flatten(),
        sglang_event_format: sglang.then(|| pod.kv_events_format.as_deref()?.parse().ok()).flatten(),
        eagle: pod.rules.eagle,
        context_parallel: pod.rules.context_parallel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_pod_mode_dials_the_pod_and_central_mode_only_knows_its_replay() {
        let pod = DiscoveredPod {
            name: "llm/vllm-0".into(),
            ip: "10.0.0.7".parse().unwrap(),
            model: Some("m".into()),
            dp_size: 2,
            pub_port: 5557,
            replay_port: Some(5558),
            http_port: 8000,
            engine: Some(kvindex::wire::Engine::Sglang),
            page_size: Some(16),
            engine_version: Some("0.5.23".into()),
            kv_events_format: None,
            rules: kvindex::PodRules { eagle: true, context_parallel: 2 },
            annotated: kvindex_discovery::Annotated::default(),
        };
        let per_pod = pod_config(&pod, false);
        assert_eq!(per_pod.id, "10.0.0.7:8000");
        assert_eq!(per_pod.endpoint.as_deref(), Some("tcp://10.0.0.7:5557"));
        assert_eq!(per_pod.replay_endpoint.as_deref(), Some("tcp://10.0.0.7:5558"));
        assert_eq!(per_pod.dp_size, 2);
        assert_eq!((per_pod.engine, per_pod.page_size), (Some(kvindex::wire::Engine::Sglang), Some(16)));
        assert_eq!(per_pod.sglang_release, Some(kvindex::sglang::SglangRelease::new(0, 5, 23)), "the check's release");
        assert_eq!(per_pod.sglang_event_format, None, "not probed: the server's");
        assert_eq!(per_pod.rules(), kvindex::PodRules { eagle: true, context_parallel: 2 }, "the annotations' rules");
        let central = pod_config(&DiscoveredPod { model: None, ..pod }, true);
        assert_eq!((central.endpoint.as_deref(), central.model.as_str()), (None, TOPIC_MODEL));
        assert!(central.validate("pod", &crate::config::error::ValueOrigin::Request(ORIGIN)).is_ok());
    }
}
