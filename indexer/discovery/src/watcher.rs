//! The shell: kube-runtime's watcher (list, then watch from the list's resourceVersion;
//! re-list when the watch expires or fails, with backoff) over the pods of one namespace that
//! match a label selector, each event turned into a [`PodObservation`] for the pure
//! [`DesiredSet`], its [`Outcome`] passed through the [`ProbeGate`] (new pods held while their
//! engine is probed, [`crate::engine_probe`], when probing is on) and handed to the consumer.
//! Metrics and logs are kept here.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::{watch, Semaphore};
use tokio::task::{AbortHandle, JoinSet};

use crate::desired::{Change, DesiredSet, Outcome, WatchEvent};
use crate::engine_probe::{self, ProbeOutcome, MAX_PROBES_IN_FLIGHT};
use crate::metrics as m;
use crate::observe::PodObservation;
use crate::probe_gate::{ProbeGate, ProbeRequest};
use crate::settings::Settings;
use crate::target::DiscoveredPod;

/// The namespace file of the pod's service account (in-cluster default namespace).
pub const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// How to reach the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiServer {
    /// In-cluster service account, else `$KUBECONFIG` / `~/.kube/config` (kube's inference).
    Infer,
    /// A plain URL with no credentials: `kubectl proxy` (`http://127.0.0.1:8001`), or a test's
    /// fake API server.
    Url(String),
}

impl ApiServer {
    /// `--discovery-api-server`: unset or empty = [`ApiServer::Infer`], else an http(s) URL.
    pub fn parse(url: Option<&str>) -> Result<ApiServer, String> {
        match url {
            None | Some("") => Ok(ApiServer::Infer),
            Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
                Ok(ApiServer::Url(url.to_string()))
            }
            Some(url) => Err(format!("must be http(s)://host:port, got {url:?}")),
        }
    }
}

/// `--discovery-namespace`: unset or empty = [`default_namespace`], else a DNS-1123 label.
pub fn namespace(configured: Option<&str>) -> Result<String, String> {
    let ns = match configured {
        Some(ns) if !ns.is_empty() => ns.to_string(),
        _ => default_namespace(),
    };
    let label = ns.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ns.len() > 63 || !label || ns.starts_with('-') || ns.ends_with('-') {
        return Err(format!("not a Kubernetes namespace name: {ns:?}"));
    }
    Ok(ns)
}

/// `--discovery-label-selector`: passed to the API server as is; only control characters
/// (which could forge log lines) are refused here.
pub fn label_selector(configured: Option<&str>) -> Result<String, String> {
    let selector = configured.unwrap_or(crate::settings::DEFAULT_LABEL_SELECTOR);
    if selector.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(selector.to_string())
}

/// What to watch.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    pub namespace: String,
    pub label_selector: String,
    pub api_server: ApiServer,
    pub settings: Settings,
}

/// The namespace to watch when none is configured: the service account's, else `default`.
pub fn default_namespace() -> String {
    namespace_from(Path::new(SERVICE_ACCOUNT_NAMESPACE))
}

fn namespace_from(path: &Path) -> String {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// A Kubernetes client for `api_server`. Fails when no cluster configuration can be found.
pub async fn client(api_server: &ApiServer) -> Result<Client, String> {
    // rustls picks its provider from its crate features only when exactly one is on; another
    // crate in the binary enabling aws-lc-rs would leave it without one (a panic at the first
    // TLS config). An already installed provider is kept.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match api_server {
        ApiServer::Infer => kube::Config::infer().await.map_err(|e| format!("no Kubernetes configuration: {e}"))?,
        ApiServer::Url(url) => kube::Config::new(url.parse().map_err(|e| format!("API server URL {url:?}: {e}"))?),
    };
    Client::try_from(config).map_err(|e| format!("Kubernetes client: {e}"))
}

/// The fields discovery uses of a Pod object.
pub fn observe(pod: &Pod) -> PodObservation {
    let md = &pod.metadata;
    let status = pod.status.as_ref();
    PodObservation {
        name: format!("{}/{}", md.namespace.as_deref().unwrap_or_default(), md.name.as_deref().unwrap_or_default()),
        phase: status.and_then(|s| s.phase.clone()),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        terminating: md.deletion_timestamp.is_some(),
        ip: status.and_then(|s| s.pod_ip.clone()),
        annotations: md.annotations.clone().unwrap_or_default(),
    }
}

/// Watches until `stop` is set, handing every event's [`Outcome`] (changes, rejections,
/// sync) to `consume`, in order. Errors are counted and retried with kube's default backoff;
/// the pods already discovered stay in place meanwhile (a re-list then removes the missing).
pub async fn run<F, Fut>(client: Client, config: WatchConfig, mut consume: F, mut stop: watch::Receiver<bool>)
where
    F: FnMut(Outcome) -> Fut,
    Fut: Future<Output = ()>,
{
    m::describe();
    let api: Api<Pod> = Api::namespaced(client, &config.namespace);
    let watch_config = watcher::Config::default().labels(&config.label_selector);
    let mut events = watcher::watcher(api, watch_config).default_backoff().boxed();
    let mut set = DesiredSet::new(config.settings.clone());
    let probe_timeout = config.settings.engine_probe;
    let mut gate = ProbeGate::new(probe_timeout.is_some());
    let mut probes: JoinSet<(u64, DiscoveredPod, ProbeOutcome)> = JoinSet::new();
    let mut probe_tasks: HashMap<u64, AbortHandle> = HashMap::new();
    let in_flight = Arc::new(Semaphore::new(MAX_PROBES_IN_FLIGHT));
    tracing::info!(namespace = %config.namespace, selector = %config.label_selector, engine_probe = ?probe_timeout, "Kubernetes pod discovery watching");
    loop {
        let next = tokio::select! {
            event = events.next() => Next::Watch(event),
            Some(done) = probes.join_next(), if !probes.is_empty() => Next::Probe(Box::new(done)),
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let event = match next {
            Next::Probe(done) => {
                let Ok((token, pod, outcome)) = *done else { continue }; // cancelled
                probe_tasks.remove(&token);
                record_probe(&pod, &outcome);
                if let Some(told) = gate.finish(token, outcome.descriptor()) {
                    record(&told, set.pods().len());
                    consume(told).await;
                }
                continue;
            }
            Next::Watch(event) => event,
        };
        let event = match event {
            None => return,
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                let reason = error_reason(&error);
                metrics::counter!(m::WATCH_ERRORS, "reason" => reason).increment(1);
                tracing::warn!(reason, %error, "Kubernetes pod watch failed; retrying with backoff");
                continue;
            }
        };
        let event = match event {
            Event::Init => {
                metrics::counter!(m::RELISTS).increment(1);
                WatchEvent::Init
            }
            Event::InitApply(pod) => WatchEvent::InitApply(observe(&pod)),
            Event::InitDone => WatchEvent::InitDone,
            Event::Apply(pod) => WatchEvent::Apply(observe(&pod)),
            Event::Delete(pod) => WatchEvent::Delete(observe(&pod)),
        };
        let admitted = gate.admit(set.apply(event));
        for token in admitted.cancel {
            if let Some(task) = probe_tasks.remove(&token) {
                task.abort();
            }
        }
        if let Some(timeout) = probe_timeout {
            for ProbeRequest { token, pod } in admitted.probe {
                let in_flight = in_flight.clone();
                let task = probes.spawn(async move {
                    let _turn = in_flight.acquire_owned().await;
                    let outcome = engine_probe::probe(pod.ip, pod.http_port, timeout).await;
                    (token, pod, outcome)
                });
                probe_tasks.insert(token, task);
            }
        }
        let outcome = admitted.forward;
        record(&outcome, set.pods().len());
        if !outcome.changes.is_empty() || !outcome.rejections.is_empty() || outcome.synced {
            consume(outcome).await;
        }
    }
}

/// What the watch loop woke for.
enum Next<W> {
    Watch(Option<W>),
    Probe(Box<Result<(u64, DiscoveredPod, ProbeOutcome), tokio::task::JoinError>>),
}

/// Counts and logs one probe (once per probed pod: a pod is probed when it is added).
fn record_probe(pod: &DiscoveredPod, outcome: &ProbeOutcome) {
    let label = outcome.label();
    metrics::counter!(m::ENGINE_PROBES, "outcome" => label).increment(1);
    let id = pod.pod_id();
    match outcome {
        ProbeOutcome::Sglang(d) => {
            let publisher = d.publisher.as_ref().map(|p| (p.pub_port, p.replay_port));
            tracing::info!(pod = %id, k8s_pod = %pod.name, version = ?d.version, page_size = ?d.page_size, dp_size = ?d.dp_size, ?publisher, "engine probe: SGLang");
        }
        ProbeOutcome::NotSglang => {
            tracing::info!(pod = %id, k8s_pod = %pod.name, "engine probe: no /server_info (not SGLang); the annotation or default engine applies");
        }
        ProbeOutcome::Failed(reason, detail) => {
            tracing::warn!(pod = %id, k8s_pod = %pod.name, reason, %detail, "engine probe failed; the annotation or default engine applies");
        }
    }
}

fn record(outcome: &Outcome, pods: usize) {
    for rejection in &outcome.rejections {
        metrics::counter!(m::REJECTED, "reason" => rejection.reason).increment(1);
        tracing::warn!(pod = %rejection.pod, reason = rejection.reason, detail = %rejection.detail, "discovered pod not usable");
    }
    for change in &outcome.changes {
        let (op, pod) = match change {
            Change::Add(pod) => ("add", pod),
            Change::Remove(pod) => ("remove", pod),
        };
        metrics::counter!(m::CHANGES, "op" => op).increment(1);
        let engine = pod.engine.map(|e| e.as_str());
        tracing::info!(op, pod = %pod.pod_id(), k8s_pod = %pod.name, dp_size = pod.dp_size, model = ?pod.model, engine, page_size = ?pod.page_size, "discovered pod");
    }
    if outcome.synced {
        tracing::info!(pods, "Kubernetes pod list synced");
    }
    metrics::gauge!(m::PODS).set(pods as f64);
}

fn error_reason(error: &watcher::Error) -> &'static str {
    match error {
        watcher::Error::InitialListFailed(_) => "list_failed",
        watcher::Error::WatchStartFailed(_) => "watch_start_failed",
        watcher::Error::WatchError(_) => "watch_error",
        watcher::Error::WatchFailed(_) => "watch_failed",
        watcher::Error::NoResourceVersion => "no_resource_version",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_checked() {
        assert_eq!(ApiServer::parse(None), Ok(ApiServer::Infer));
        assert_eq!(ApiServer::parse(Some("http://127.0.0.1:8001")), Ok(ApiServer::Url("http://127.0.0.1:8001".into())));
        assert!(ApiServer::parse(Some("10.0.0.1:6443")).is_err());
        assert_eq!(namespace(Some("llm-d")).unwrap(), "llm-d");
        for bad in ["a b", "Upper", "-x", &"a".repeat(64)] {
            assert!(namespace(Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(label_selector(None).unwrap(), "llm-d.ai/inference-serving=true");
        assert!(label_selector(Some("app in (vllm,sglang)")).is_ok());
        assert!(label_selector(Some("a=b\nforged log line")).is_err());
    }

    #[tokio::test]
    async fn an_https_client_builds_its_tls_config() {
        assert!(client(&ApiServer::Url("https://127.0.0.1:6443".into())).await.is_ok());
        let Err(e) = client(&ApiServer::Url("http://bad url".into())).await else { panic!("a bad URL") };
        assert!(e.contains("API server URL"), "{e}");
    }

    #[test]
    fn namespace_defaults_to_the_service_accounts_then_default() {
        let dir = std::env::temp_dir().join(format!("kvindex-discovery-ns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("namespace");
        assert_eq!(namespace_from(&file), "default");
        std::fs::write(&file, "inference\n").unwrap();
        assert_eq!(namespace_from(&file), "inference");
        std::fs::write(&file, "  ").unwrap();
        assert_eq!(namespace_from(&file), "default");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
