//! Starts N simulated pods in this process: for each, the HTTP listener (its port names the
//! pod), the event publisher and replay ROUTER, the engine task and the HTTP server.
//!
//! Ports follow the CLI contract: pod i listens on `base + i`. With `d` data-parallel ranks,
//! rank r of pod i binds its PUB and replay ROUTER on `base + i·d + r` (vLLM offsets a rank's
//! endpoints by its rank; the spacing keeps pods apart), and a dialing rank dials the central
//! endpoint's port + r, as vLLM's `offset_endpoint_port` does. A base of 0 is this crate's
//! extension for tests: every socket then gets an OS-assigned port, reported in [`RunningPod`].

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::engine::{Engine, EngineConfig};
use crate::pod::{MetricsDialect, Pod, PodInfo, Rank};
use crate::wire::{PubEndpoint, Publisher, PublisherConfig, WireVersion};

/// How the pods' PUB sockets reach subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZmqMode {
    /// Every pod dials this endpoint (a central SUB, e.g. `kvindex serve`).
    Connect(String),
    /// Pod i binds `tcp://<host>:<base + i>`.
    BindBasePort(u16),
}

#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub pods: usize,
    pub model: String,
    pub host: String,
    pub engine: EngineConfig,
    pub http_base_port: u16,
    pub zmq: ZmqMode,
    pub replay_base_port: Option<u16>,
    pub wire: WireVersion,
    pub buffer_steps: usize,
    pub time_scale: f64,
    /// Engines per pod (vLLM's `--data-parallel-size`).
    pub data_parallel_size: usize,
    /// How the pods tokenize text and chats (shared; loaded once).
    pub tokenizer: crate::http::tokenizer::PromptTokenizer,
}

/// One rank's bound endpoints (`pub` is `None` when dialing).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RankEndpoints {
    pub rank: u32,
    #[serde(rename = "pub")]
    pub pub_endpoint: Option<String>,
    #[serde(rename = "replay")]
    pub replay_endpoint: Option<String>,
}

pub struct RunningPod {
    pub pod: Pod,
    pub http_addr: SocketAddr,
    pub ranks: Vec<RankEndpoints>,
}

/// vLLM 0.33's `offset_endpoint_port`: a TCP port + rank (port 0 unchanged), `inproc://x`
/// → `inproc://x_dp<rank>`, and an error for `ipc://` with rank > 0.
pub fn offset_endpoint_port(endpoint: &str, rank: u32) -> Result<String, String> {
    if rank == 0 {
        return Ok(endpoint.to_string());
    }
    if endpoint.starts_with("inproc://") {
        return Ok(format!("{endpoint}_dp{rank}"));
    }
    if !endpoint.starts_with("tcp://") {
        return Err(format!(
            "invalid endpoint {endpoint:?} for data-parallel rank {rank}: must contain 'inproc' or 'tcp'"
        ));
    }
    let Some((head, port)) = endpoint.rsplit_once(':') else {
        return Ok(endpoint.to_string());
    };
    match port.parse::<u32>() {
        Ok(0) => Ok(endpoint.to_string()),
        Ok(port) if port + rank <= u32::from(u16::MAX) => Ok(format!("{head}:{}", port + rank)),
        _ => Err(format!("cannot offset the port of {endpoint:?} by {rank}")),
    }
}

/// `base + index`, or 0 (OS-assigned) when `base` is 0.
fn port(base: u16, index: usize) -> Result<u16, String> {
    if base == 0 {
        return Ok(0);
    }
    u16::try_from(usize::from(base) + index).map_err(|_| format!("port {base} + {index} is out of range"))
}

/// The llm-d topic convention: `kv@<pod id>@<model>`.
pub fn topic(pod_id: &str, model: &str) -> String {
    format!("kv@{pod_id}@{model}")
}

pub async fn start_fleet(config: &FleetConfig) -> Result<Vec<RunningPod>, String> {
    let mut running = Vec::with_capacity(config.pods);
    for index in 0..config.pods {
        let http_port = port(config.http_base_port, index)?;
        let listener = TcpListener::bind((config.host.as_str(), http_port))
            .await
            .map_err(|e| format!("cannot bind HTTP {}:{http_port}: {e}", config.host))?;
        let http_addr = listener.local_addr().map_err(|e| e.to_string())?;
        let pod_id = format!("{}:{}", config.host, http_addr.port());
        let topic = topic(&pod_id, &config.model);
        let ranks_per_pod = config.data_parallel_size.max(1);
        let info = PodInfo {
            model: config.model.clone(),
            pod_id: pod_id.clone(),
            topic: topic.clone(),
            block_size: config.engine.block_size,
            num_gpu_blocks: config.engine.num_gpu_blocks,
            max_model_len: config.engine.effective_max_model_len(),
            metrics_dialect: MetricsDialect::of(config.wire),
            tokenizer: config.tokenizer.clone(),
        };
        let mut ranks = Vec::with_capacity(ranks_per_pod);
        let mut endpoints = Vec::with_capacity(ranks_per_pod);
        for rank in 0..ranks_per_pod as u32 {
            let slot = index * ranks_per_pod + rank as usize;
            let endpoint = match &config.zmq {
                ZmqMode::Connect(endpoint) => PubEndpoint::Connect(offset_endpoint_port(endpoint, rank)?),
                ZmqMode::BindBasePort(base) => {
                    PubEndpoint::Bind(format!("tcp://{}:{}", config.host, port(*base, slot)?))
                }
            };
            let replay_endpoint = match config.replay_base_port {
                Some(base) => Some(format!("tcp://{}:{}", config.host, port(base, slot)?)),
                None => None,
            };
            let publisher = Publisher::start(PublisherConfig {
                topic: topic.clone(),
                endpoint,
                replay_endpoint,
                buffer_steps: config.buffer_steps,
                wire: config.wire,
                data_parallel_rank: rank,
            })
            .await?;
            endpoints.push(RankEndpoints {
                rank,
                pub_endpoint: publisher.bound_endpoint.clone(),
                replay_endpoint: publisher.bound_replay_endpoint.clone(),
            });
            let engine = Engine::new(config.engine.clone()).map_err(|e| format!("hash configuration: {e}"))?;
            ranks.push(Rank::start(engine, rank, format!("{pod_id}/dp{rank}"), publisher, config.time_scale));
        }
        let pod = Pod::new(info, ranks);
        let app = crate::http::router(pod.clone());
        tokio::spawn(async move {
            if let Err(error) = axum::serve(crate::http::no_delay(listener), app).await {
                tracing::error!(%error, "HTTP server stopped");
            }
        });
        running.push(RunningPod { pod, http_addr, ranks: endpoints });
    }
    Ok(running)
}
