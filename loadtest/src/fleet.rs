//! Starts N simulated pods in this process: for each, the HTTP listener (its port names the
//! pod), the event publisher and replay ROUTER, the engine task and the HTTP server.
//!
//! Ports follow the CLI contract: pod i listens on `base + i`. A base of 0 is this crate's
//! extension for tests: every pod then gets an OS-assigned port, reported in [`RunningPod`].

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::engine::{Engine, EngineConfig};
use crate::pod::{Pod, PodInfo};
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
}

pub struct RunningPod {
    pub pod: Pod,
    pub http_addr: SocketAddr,
    /// The bound PUB endpoint, `None` when dialing.
    pub pub_endpoint: Option<String>,
    pub replay_endpoint: Option<String>,
}

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
        let endpoint = match &config.zmq {
            ZmqMode::Connect(endpoint) => PubEndpoint::Connect(endpoint.clone()),
            ZmqMode::BindBasePort(base) => PubEndpoint::Bind(format!("tcp://{}:{}", config.host, port(*base, index)?)),
        };
        let replay_endpoint = match config.replay_base_port {
            Some(base) => Some(format!("tcp://{}:{}", config.host, port(base, index)?)),
            None => None,
        };
        let publisher = Publisher::start(PublisherConfig {
            topic: topic.clone(),
            endpoint,
            replay_endpoint,
            buffer_steps: config.buffer_steps,
            wire: config.wire,
            data_parallel_rank: 0,
        })
        .await?;
        let engine = Engine::new(config.engine.clone()).map_err(|e| format!("hash configuration: {e}"))?;
        let info = PodInfo {
            model: config.model.clone(),
            pod_id,
            topic,
            block_size: config.engine.block_size,
            num_gpu_blocks: config.engine.num_gpu_blocks,
            max_model_len: config.engine.effective_max_model_len(),
        };
        let pub_endpoint = publisher.bound_endpoint.clone();
        let replay_endpoint = publisher.bound_replay_endpoint.clone();
        let pod = Pod::start(engine, info, publisher, config.time_scale);
        let app = crate::http::router(pod.clone());
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "HTTP server stopped");
            }
        });
        running.push(RunningPod { pod, http_addr, pub_endpoint, replay_endpoint });
    }
    Ok(running)
}
