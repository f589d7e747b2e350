//! Placement by real `kvindex-router` processes: k replicas, taking turns, in front of one
//! `kvindex serve` fed with the simulated pods' events ([`super::service_feed`]). Each router
//! scrapes a small `/metrics` server per simulated pod that reports the engine's waiting and
//! running requests and KV usage as vLLM names them, and is asked where a prompt goes through
//! `POST /route/v1/completions` (the decision only, nothing forwarded).
//!
//! Before each question the policy waits until the service applied every published event and
//! the asked router has scraped the load of this instant, so the router decides on exactly
//! what a live router would know at that moment, with wall-clock effects (scrape intervals,
//! slow ZeroMQ joins) taken out. Unlike the other cache-aware policies it uses the router's
//! own cost model, not llm-d's scorer weights: this measures the product. The pods also report
//! their KV capacity (`vllm:cache_config_info`, as vLLM does), which the router's cost uses.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use std::sync::Mutex;

use super::service_feed::ServiceFeed;
use super::{FleetView, Policy};
use crate::engine::KvEvent;
use crate::kvindex_service::http;
use crate::process::RouterProcess;

/// How long a router may take to scrape the current load.
const SCRAPE_DEADLINE: Duration = Duration::from_secs(30);

/// Load as one simulated pod's `/metrics` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct PodLoad {
    waiting: f64,
    running: f64,
    kv_usage: f64,
    /// `num_gpu_blocks`.
    kv_blocks: usize,
    /// Tokens per block (the router reads the capacity as blocks × block size).
    block_size: usize,
}

struct Running {
    // Drop order: routers, then the metrics servers (runtime tasks), then the service.
    routers: Vec<RouterProcess>,
    loads: Vec<Arc<Mutex<PodLoad>>>,
    feed: ServiceFeed,
}

pub struct RouterProcesses {
    name: String,
    kvindex: PathBuf,
    router: PathBuf,
    replicas: usize,
    pods: usize,
    block_size: usize,
    model: String,
    router_args: Vec<String>,
    running: Option<Running>,
    next: usize,
    failure: Option<String>,
}

impl RouterProcesses {
    /// `replicas` routers (`router` binary, with `router_args` added) over a `kvindex serve`
    /// (`kvindex` binary); processes start at the first request.
    pub fn new(
        kvindex: &Path,
        router: &Path,
        replicas: usize,
        pods: usize,
        block_size: usize,
        model: &str,
        router_args: &[String],
    ) -> RouterProcesses {
        let name = if replicas == 1 { "kvindex-router".to_string() } else { format!("kvindex-router ×{replicas}") };
        RouterProcesses {
            name,
            kvindex: kvindex.to_path_buf(),
            router: router.to_path_buf(),
            replicas: replicas.max(1),
            pods,
            block_size,
            model: model.to_string(),
            router_args: router_args.to_vec(),
            running: None,
            next: 0,
            failure: None,
        }
    }

    fn start(&self) -> Result<Running, String> {
        let feed = ServiceFeed::start(&self.kvindex, self.pods, self.block_size, &self.model)?;
        let loads: Vec<Arc<Mutex<PodLoad>>> = (0..self.pods).map(|_| Arc::default()).collect();
        let mut args = vec!["--indexer".to_string(), feed.service().grpc_addr.clone()];
        // RecordRoute (predict on route) needs the service's admin token.
        let token_file = feed.service().admin_token_file().to_string_lossy().into_owned();
        args.extend(["--indexer-admin-token-file".to_string(), token_file]);
        args.extend(["--block-size".into(), self.block_size.to_string(), "--model".into(), self.model.clone()]);
        args.extend(["--scrape-interval-ms".into(), "5".into(), "--score-deadline-ms".into(), "1000".into()]);
        for (index, load) in loads.iter().enumerate() {
            let addr = feed.runtime().block_on(serve_metrics(load.clone()))?;
            let id = feed.pod_id(index).ok_or("pod id")?;
            args.extend(["--pod".to_string(), format!("{id}=http://{addr}")]);
        }
        args.extend(self.router_args.iter().cloned());
        let routers =
            (0..self.replicas).map(|_| RouterProcess::start(&self.router, &args)).collect::<Result<Vec<_>, _>>()?;
        Ok(Running { routers, loads, feed })
    }

    fn ask(&mut self, prompt: &[u32], fleet: &FleetView<'_>) -> Result<usize, String> {
        if self.running.is_none() {
            self.running = Some(self.start()?);
        }
        let running = self.running.as_mut().ok_or("not started")?;
        let now: Vec<PodLoad> = (0..fleet.pods.len())
            .map(|pod| {
                let stats = fleet.stats(pod);
                PodLoad {
                    waiting: stats.num_waiting as f64,
                    running: stats.num_running as f64,
                    kv_usage: stats.kv_usage,
                    kv_blocks: stats.num_gpu_blocks,
                    block_size: stats.block_size,
                }
            })
            .collect();
        for (slot, load) in running.loads.iter().zip(&now) {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = *load;
        }
        let router = running.routers[self.next % running.routers.len()].http.clone();
        self.next = self.next.wrapping_add(1);
        let ids: Vec<String> = (0..now.len()).filter_map(|i| running.feed.pod_id(i).map(str::to_string)).collect();
        let body = json!({"model": self.model, "prompt": prompt}).to_string();
        let runtime = running.feed.runtime().handle().clone();
        let feed = &mut running.feed;
        let decision: Value = runtime.block_on(async {
            feed.caught_up().await?;
            scraped(&router, &ids, &now).await?;
            let (status, text) = http(&router, "POST", "/route/v1/completions", Some(&body)).await?;
            if status != 200 {
                return Err(format!("kvindex-router /route: {status} {text}"));
            }
            serde_json::from_str(&text).map_err(|e| format!("kvindex-router /route: {e}"))
        })?;
        let pod = decision["ranked"][0]["pod"].as_str().ok_or_else(|| format!("no pod in {decision}"))?;
        running.feed.pod_index(pod).ok_or_else(|| format!("unknown pod {pod}"))
    }
}

/// Waits until `router`'s `/debug/pods` shows `loads` (by pod, in `ids` order).
async fn scraped(router: &str, ids: &[String], loads: &[PodLoad]) -> Result<(), String> {
    let deadline = Instant::now() + SCRAPE_DEADLINE;
    loop {
        let (_, text) = http(router, "GET", "/debug/pods", None).await?;
        let view: Value = serde_json::from_str(&text).map_err(|e| format!("/debug/pods: {e}"))?;
        let pods = view["pods"].as_array().cloned().unwrap_or_default();
        let current = ids.iter().zip(loads).all(|(id, load)| {
            pods.iter().find(|p| p["id"] == id.as_str()).is_some_and(|p| {
                let l = &p["load"];
                l["waiting"].as_f64() == Some(load.waiting)
                    && l["running"].as_f64() == Some(load.running)
                    // serde_json's default float parsing may be off by an ulp.
                    && l["kv_usage"].as_f64().is_some_and(|u| (u - load.kv_usage.clamp(0.0, 1.0)).abs() < 1e-9)
            })
        });
        if current {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "kvindex-router at {router} did not scrape the current load {loads:?} within {SCRAPE_DEADLINE:?}: {view}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A `/metrics` server for one simulated pod; returns its address.
async fn serve_metrics(load: Arc<Mutex<PodLoad>>) -> Result<String, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?.to_string();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let l = *load.lock().unwrap_or_else(|e| e.into_inner());
            async move {
                format!(
                    "vllm:num_requests_waiting{{engine=\"0\"}} {}\nvllm:num_requests_running{{engine=\"0\"}} {}\nvllm:kv_cache_usage_perc{{engine=\"0\"}} {}\nvllm:cache_config_info{{block_size=\"{}\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0\n",
                    l.waiting, l.running, l.kv_usage, l.block_size, l.kv_blocks
                )
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(crate::http::no_delay(listener), app).await;
    });
    Ok(addr)
}

impl Policy for RouterProcesses {
    fn name(&self) -> &str {
        &self.name
    }

    fn wants_step_events(&self) -> bool {
        true
    }

    fn publish_step(&mut self, pod: usize, events: &[KvEvent]) {
        if events.is_empty() || self.failure.is_some() {
            return;
        }
        if let Some(running) = self.running.as_mut() {
            running.feed.publish(pod, events);
        }
    }

    fn choose(&mut self, prompt: &[u32], fleet: &FleetView<'_>) -> usize {
        if self.failure.is_some() {
            return 0;
        }
        match self.ask(prompt, fleet) {
            Ok(pod) => pod,
            Err(error) => {
                self.failure = Some(error);
                0
            }
        }
    }

    fn failure(&self) -> Option<String> {
        self.failure.clone()
    }
}
