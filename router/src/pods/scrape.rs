//! Keeps every pod's load current: one task per pod scrapes its `/metrics` on an interval,
//! and a supervisor starts and stops those tasks as the pod table changes. A pod whose
//! `/metrics` keeps failing is marked unreachable (picked only when nothing else answers).

use std::collections::HashMap;
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

/// Runs until the process ends: one scrape task per pod, following the pod table.
pub async fn run(fleet: Arc<Fleet>, client: HttpClient, interval: Duration, timeout: Duration) {
    let mut changes = fleet.subscribe();
    let mut tasks: HashMap<String, (Arc<Pod>, AbortHandle)> = HashMap::new();
    loop {
        let pods = fleet.snapshot();
        tasks.retain(|id, (pod, task)| {
            let current = pods.iter().any(|p| &p.id == id && Arc::ptr_eq(p, pod));
            if !current {
                task.abort();
            }
            current
        });
        for pod in pods {
            if tasks.contains_key(&pod.id) {
                continue;
            }
            let task = tokio::spawn(scrape_loop(pod.clone(), client.clone(), interval, timeout)).abort_handle();
            tasks.insert(pod.id.clone(), (pod, task));
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

async fn scrape_loop(pod: Arc<Pod>, client: HttpClient, interval: Duration, timeout: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match tokio::time::timeout(timeout, scrape_once(&client, &pod.url)).await {
            Ok(Ok(load)) => {
                pod.scraped(load, Instant::now());
                metrics::counter!(m::SCRAPES, "outcome" => "ok").increment(1);
                for (kind, value) in
                    [("waiting", load.waiting), ("running", load.running), ("kv_usage", load.kv_usage.unwrap_or(0.0))]
                {
                    metrics::gauge!(m::POD_LOAD, "pod" => pod.id.clone(), "kind" => kind).set(value);
                }
                if let Some(blocks) = load.kv_blocks {
                    metrics::gauge!(m::POD_LOAD, "pod" => pod.id.clone(), "kind" => "kv_blocks").set(blocks as f64);
                }
            }
            Ok(Err(reason)) => {
                pod.scrape_failed();
                metrics::counter!(m::SCRAPES, "outcome" => reason).increment(1);
            }
            Err(_) => {
                pod.scrape_failed();
                metrics::counter!(m::SCRAPES, "outcome" => "timeout").increment(1);
            }
        }
    }
}

/// One GET of `<url>/metrics`; the error is a metric label.
pub async fn scrape_once(client: &HttpClient, base_url: &str) -> Result<EngineLoad, &'static str> {
    let uri: hyper::Uri = format!("{base_url}/metrics").parse().map_err(|_| "bad_url")?;
    let request = hyper::Request::get(uri).body(Full::new(Bytes::new())).map_err(|_| "bad_url")?;
    let response = client.request(request).await.map_err(|_| "connect_error")?;
    if !response.status().is_success() {
        return Err("http_status");
    }
    let body =
        Limited::new(response.into_body(), MAX_METRICS_BYTES).collect().await.map_err(|_| "body_error")?.to_bytes();
    let text = std::str::from_utf8(&body).map_err(|_| "not_utf8")?;
    engine_metrics::parse(text).map_err(|_| "unknown_engine")
}
