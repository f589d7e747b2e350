//! `kvindex serve`: the indexer service. Wires config, the index, apply workers, ZeroMQ
//! sources, gRPC and HTTP admin together; the pieces live in this crate.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;

use kvindex::{KvIndex, KvIndexConfig};

use crate::config::{Config, ServeArgs};
use crate::registry::{self, Registry};
use crate::worker::Worker;
use crate::{grpc, http, metrics as m, zmq, Shared};

pub fn run(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).try_init();
    let config = Config::load(&args)?;
    let prometheus = m::install()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("kvindex-rpc").build()?;
    // The `zeromq` crate's sockets (replay DEALERs) live on their own single-threaded runtime:
    // its fair queue loses wake-ups when polled from several threads.
    let zmq_runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let zmq_handle = zmq_runtime.handle().clone();
    std::thread::Builder::new()
        .name("kvindex-zmq".into())
        .spawn(move || zmq_runtime.block_on(std::future::pending::<()>()))?;
    runtime.block_on(serve(config, prometheus, zmq_handle))
}

async fn serve(
    config: Config,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
    zmq_runtime: tokio::runtime::Handle,
) -> Result<(), Box<dyn std::error::Error>> {
    let hash_check = match &config.hash_check {
        Some(c) => Some(kvindex::HashCheck { hasher: kvindex::vllm_hash::BlockHasher::new(&c.hasher)?, every: c.every }),
        None => None,
    };
    let index = KvIndex::new(KvIndexConfig {
        block_size: config.block_size,
        shards: config.shards,
        max_entries: config.max_entries,
        hash_check,
    });
    for (medium, w) in &config.tier_weights {
        if index.tiers().set_weight(medium, *w).is_none() {
            return Err(format!("config error: tier_weights.{medium}: too many tiers").into());
        }
    }
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..config.apply_workers {
        let (tx, rx) = std::sync::mpsc::sync_channel(config.queue_capacity);
        senders.push(tx);
        receivers.push(rx);
    }
    metrics::gauge!(m::QUEUE_CAPACITY).set((config.queue_capacity * config.apply_workers) as f64);
    let topic_map: Vec<(String, String)> = config.topic_map.iter().map(|t| (t.topic_id.clone(), t.pod.clone())).collect();
    let replay: Vec<(String, String)> = config.replay.iter().map(|r| (r.pod.clone(), r.endpoint.clone())).collect();
    let shared = Arc::new(Shared {
        registry: RwLock::new(Registry::new(&topic_map, &replay)),
        index,
        start: Instant::now(),
        pod_states: RwLock::default(),
        debug: RwLock::default(),
        queues: senders,
        queue_depth: AtomicI64::new(0),
        queue_dropped: AtomicU64::new(0),
        replay_permits: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent_replays)),
        zmq_runtime,
        initial_syncs: AtomicUsize::new(0),
        listening: AtomicBool::new(false),
        state_counts: Default::default(),
        config,
    });
    for (i, rx) in receivers.into_iter().enumerate() {
        let worker = Worker::new(shared.clone(), i);
        std::thread::Builder::new().name(format!("kvindex-apply-{i}")).spawn(move || worker.run(rx))?;
    }
    let grpc_listener = tokio::net::TcpListener::bind(shared.config.grpc_addr)
        .await
        .map_err(|e| format!("grpc_addr: cannot bind {}: {e}", shared.config.grpc_addr))?;
    let http_listener = tokio::net::TcpListener::bind(shared.config.http_addr)
        .await
        .map_err(|e| format!("http_addr: cannot bind {}: {e}", shared.config.http_addr))?;
    let grpc_addr = grpc_listener.local_addr()?;
    let http_addr = http_listener.local_addr()?;
    let zmq_bound = match shared.config.zmq_bind.clone() {
        Some(ep) => Some(zmq::start_central(shared.clone(), &ep).await?),
        None => None,
    };
    registry::register_static(&shared).await;
    if let Some(path) = shared.config.pods_file.clone() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(registry::watch_pods_file(shared.clone(), path, tx));
        let _ = rx.await;
    }
    let grpc_task = tokio::spawn(grpc::serve(shared.clone(), grpc_listener));
    let app = http::router(shared.clone(), prometheus);
    let http_task = tokio::spawn(async move { axum::serve(http_listener, app).await.map_err(|e| e.to_string()) });
    shared.listening.store(true, Ordering::Release);
    tracing::info!(%grpc_addr, %http_addr, zmq = ?zmq_bound, "kvindex serve listening");
    {
        // One machine-readable line for scripts and tests that start us on port 0.
        let mut out = std::io::stdout().lock();
        writeln!(out, "KVINDEX_LISTENING grpc={grpc_addr} http={http_addr} zmq={}", zmq_bound.as_deref().unwrap_or("-"))?;
        out.flush()?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = grpc_task => return Err(format!("gRPC server stopped: {:?}", r).into()),
        r = http_task => return Err(format!("HTTP server stopped: {:?}", r).into()),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted, exiting"),
        _ = term.recv() => tracing::info!("terminated, exiting"),
    }
    Ok(())
}
