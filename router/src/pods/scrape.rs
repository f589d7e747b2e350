//! Keeps every pod's load current: one task per pod URL scrapes its `/metrics` on an interval,
//! and a supervisor starts and stops those tasks as the pod table changes. The entries of one
//! URL (the named data-parallel ranks of one engine) share one scrape, each reading its own
//! rank's series. A pod whose `/metrics` keeps failing is marked unreachable (picked only when
//! nothing else answers).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use tokio::task::AbortHandle;

use crate::metrics as m;
use crate::pods::engine_load::EngineLoad;
use crate::pods::engine_metrics;
use crate::pods::fleet::{Fleet, Pod};
use crate::upstream::HttpClient;

/// Largest `/metrics` body read (vLLM's and SGLang's are a few tens of kilobytes).
const MAX_METRICS_BYTES: usize = 4 << 20;

/// Runs until the process ends: one scrape task per pod URL, following the pod table.
pub async fn run(fleet: Arc<Fleet>, client: HttpClient, interval: Duration, timeout: Duration) {
    let mut changes = fleet.subscribe();
    let mut tasks: HashMap<String, (Vec<Arc<Pod>>, AbortHandle)> = HashMap::new();
    loop {
        let mut by_url: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for pod in fleet.snapshot() {
            by_url.entry(pod.url.clone()).or_default().push(pod);
        }
        tasks.retain(|url, (pods, task)| {
            let current = by_url.get(url).is_some_and(|now| {
                now.len() == pods.len() && now.iter().zip(pods.iter()).all(|(a, b)| Arc::ptr_eq(a, b))
            });
            if !current {
                task.abort();
            }
            current
        });
        for (url, pods) in by_url {
            if tasks.contains_key(&url) {
                continue;
            }
            let task =
                tokio::spawn(scrape_loop(url.clone(), pods.clone(), client.clone(), interval, timeout)).abort_handle();
            tasks.insert(url, (pods, task));
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

async fn scrape_loop(url: String, pods: Vec<Arc<Pod>>, client: HttpClient, interval: Duration, timeout: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let page = match tokio::time::timeout(timeout, fetch(&client, &url)).await {
            Ok(page) => page,
            Err(_) => Err("timeout"),
        };
        for pod in &pods {
            match page.as_deref().map_err(|e| *e).and_then(|text| engine_metrics::parse(text, pod.dp.named_rank())) {
                Ok(load) => scraped(pod, load),
                Err(reason) => {
                    pod.scrape_failed();
                    metrics::counter!(m::SCRAPES, "outcome" => reason).increment(1);
                }
            }
        }
    }
}

fn scraped(pod: &Pod, load: EngineLoad) {
    pod.scraped(load, Instant::now());
    metrics::counter!(m::SCRAPES, "outcome" => "ok").increment(1);
    for (kind, value) in
        [("waiting", load.waiting), ("running", load.running), ("kv_usage", load.kv_usage.unwrap_or(0.0))]
    {
        metrics::gauge!(m::POD_LOAD, "pod" => pod.id.clone(), "kind" => kind).set(value);
    }
    if let Some(tokens) = load.kv_tokens {
        metrics::gauge!(m::POD_LOAD, "pod" => pod.id.clone(), "kind" => "kv_tokens").set(tokens as f64);
    }
}

/// One GET of `<url>/metrics`, as text; the error is a metric label.
async fn fetch(client: &HttpClient, base_url: &str) -> Result<String, &'static str> {
    let uri: hyper::Uri = format!("{base_url}/metrics").parse().map_err(|_| "bad_url")?;
    let request = hyper::Request::get(uri).body(Full::new(Bytes::new())).map_err(|_| "bad_url")?;
    let response = client.request(request).await.map_err(|_| "connect_error")?;
    if !response.status().is_success() {
        return Err("http_status");
    }
    let body =
        Limited::new(response.into_body(), MAX_METRICS_BYTES).collect().await.map_err(|_| "body_error")?.to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| "not_utf8")
}
