//! The server, as mini-redis's `server::run`: [`bind`] the listeners of a [`Config`], then
//! [`run`] the service on them until a shutdown future resolves. `run` wires the index, the
//! apply workers, the live sources, replays, gRPC and the HTTP admin together, and
//! shuts them down in order: stop listening and let requests in flight finish, stop the
//! sources, then let the apply workers drain what they were given and return.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use kvindex::speculative::SpeculativeCredits;
use kvindex::{HashCheck, KvIndex, KvIndexConfig};

use crate::clock::Clock;
use crate::config::pod::offset_endpoint;
use crate::config::Config;
use crate::error::ServerError;
use crate::index_handle::IndexHandle;
use crate::persist::dump::recorder::Recorder;
use crate::persist::snapshot;
use crate::pods::auth::ControlPlane;
use crate::pods::lifecycle::Pods;
use crate::pods::PodsConfig;
use crate::protocols::Work;
use crate::queue::Queues;
use crate::read::grpc::tokenizer::PromptTokenizer;
use crate::read::{grpc, http};
use crate::readiness::{Readiness, SharedHold};
use crate::shutdown::ShutdownSignal;
use crate::telemetry;
use crate::write::context::{ServiceState, Shared};
use crate::write::sources;
use crate::write::sources::connections::CentralConnections;
use crate::write::transport::{Admission, Peer, SubListener};
use crate::write::worker::context::WorkerContext;
use crate::write::worker::Worker;

/// How long requests in flight may take to finish once shutdown starts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The bound sockets of a server: gRPC, HTTP admin and, in central mode, the SUB that engines
/// dial. Ports are resolved, so a config asking for port 0 can report what it got.
pub struct Listeners {
    grpc: TcpListener,
    http: TcpListener,
    /// The metrics-only listener, when `metrics_addr` is set.
    metrics: Option<TcpListener>,
    /// The probes' listener, when `probe_addr` is set.
    probe: Option<TcpListener>,
    zmq: Option<SubListener>,
    /// Loaded before the server announces it listens, so a bad tokenizer dir fails `bind`.
    tokenizer: Option<PromptTokenizer>,
    /// Kubernetes client of pod discovery, built in `bind` so a missing cluster config fails it.
    discovery: Option<kvindex_discovery::Client>,
    /// The snapshot directory, claimed in `bind`: one another kvindex holds, or that holds
    /// foreign files, fails the start before the server announces it listens.
    snapshot_dir: Option<snapshot::store::SnapshotDir>,
}

impl Listeners {
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr().expect("a bound listener has an address")
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr().expect("a bound listener has an address")
    }

    /// The metrics-only listener's address, when `metrics_addr` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|l| l.local_addr().expect("a bound listener has an address"))
    }

    /// The probe listener's address, when `probe_addr` is set.
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probe.as_ref().map(|l| l.local_addr().expect("a bound listener has an address"))
    }

    /// The central SUB's endpoint (`tcp://host:port`), in central mode.
    pub fn zmq_endpoint(&self) -> Option<&str> {
        self.zmq.as_ref().map(SubListener::endpoint)
    }
}

/// Loads the prompt tokenizers, binds `config`'s gRPC and HTTP addresses and, when
/// `zmq_bind` is set, the central SUB, and claims the snapshot directory: everything that can
/// fail on a bad config (or a directory another kvindex holds), so that a caller announcing
/// the listeners afterwards never announces a server that then exits.
pub async fn bind(config: &Config) -> Result<Listeners, ServerError> {
    let tcp = |key, addr: SocketAddr| async move {
        TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { key, addr: addr.to_string(), source })
    };
    let tokenizer = PromptTokenizer::from_config(config)?;
    let grpc = tcp("grpc_addr", config.grpc_addr).await?;
    let http = tcp("http_addr", config.http_addr).await?;
    let metrics = match config.metrics_addr {
        Some(addr) => Some(tcp("metrics_addr", addr).await?),
        None => None,
    };
    let probe = match config.probe_addr {
        Some(addr) => Some(tcp("probe_addr", addr).await?),
        None => None,
    };
    let zmq = match &config.zmq_bind {
        Some(endpoint) => {
            let filter = config.topic_filter.as_bytes();
            let admission: Option<Admission> = (!config.zmq_allow.is_empty()).then(|| {
                let allow = config.zmq_allow.clone();
                Arc::new(move |peer: &Peer| match peer {
                    Peer::Tcp(addr) => allow.iter().any(|cidr| cidr.contains(addr.ip())),
                    Peer::Ipc { .. } => true, // the socket file's permissions decide
                }) as Admission
            });
            // DP rank r of an engine dials the configured port + r.
            let ranks: Vec<String> = (0..config.zmq_bind_dp_size).map(|r| offset_endpoint(endpoint, r)).collect();
            let ranks: Vec<&str> = ranks.iter().map(String::as_str).collect();
            let sub = SubListener::bind_all_admitting(&ranks, &[filter], config.zmq_limits.clone(), admission).await;
            Some(sub.map_err(ServerError::ZmqBind)?)
        }
        None => None,
    };
    let discovery = match &config.discovery {
        Some(d) => Some(kvindex_discovery::watcher::client(&d.api_server).await.map_err(ServerError::Discovery)?),
        None => None,
    };
    let snapshot_dir = match &config.snapshot_dir {
        Some(dir) => Some(snapshot::store::SnapshotDir::claim(dir).map_err(ServerError::SnapshotDir)?),
        None => None,
    };
    Ok(Listeners { grpc, http, metrics, probe, zmq, tokenizer, discovery, snapshot_dir })
}

/// Runs the service on `listeners` until `shutdown` resolves (or a server fails), then shuts
/// down gracefully. Metrics go to the process's Prometheus recorder (one per process).
///
/// Each part gets the handles it uses (mini-redis's `Handler { db, connection, shutdown }`):
/// the sources the queues, the pods the registry's lifecycle, the servers the index and the
/// pods, every task a `Shutdown` handle of one [`ShutdownSignal`].
pub async fn run(config: Config, listeners: Listeners, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    let prometheus = telemetry::recorder()?;
    let mut listeners = listeners;
    let tokenizer = listeners.tokenizer.take();
    let recorder = match &config.record {
        Some(r) => {
            let recorder = Recorder::new(&r.path, r.retention)
                .map_err(|source| ServerError::Io { what: "record --out", source })?;
            tracing::warn!(path = %r.path.display(), "recording every message (with token ids) to a dump");
            Some(Arc::new(recorder))
        }
        None => None,
    };
    let index =
        IndexHandle::new(build_index(&config)?, SpeculativeCredits::new(config.speculative.clone()), Clock::start());
    let (queues, receivers) = Queues::new(config.apply_workers, config.queue_capacity);
    let queues = Arc::new(queues);
    let readiness = Arc::new(Readiness::default());
    let central = Arc::new(CentralConnections::default());
    // The one walk of the configuration into the pods.
    let pods_config = PodsConfig::of(&config);
    let pods = Pods::new(&pods_config, queues.clone(), readiness.clone());
    let control = ControlPlane::new(config.admin_token.clone(), config.register_allow.clone());
    let http_handles = http::Handles {
        index: index.clone(),
        pods: pods.clone(),
        control: control.clone(),
        queues: queues.clone(),
        readiness: readiness.clone(),
        central_bind: config.zmq_bind.clone(),
        topic_filter: config.topic_filter.clone(),
    };
    let instance = grpc::replica::instance_id();
    let replica = grpc::replica::ReplicaService::new(
        index.clone(),
        queues.clone(),
        control.clone(),
        config.sibling_export,
        config.block_size,
        instance,
    );
    let grpc_handles = grpc::Handles { index: index.clone(), pods: pods.clone(), control, tokenizer, replica };
    let grpc_bounds = grpc::Bounds::of(&config);
    let topic_filter = config.topic_filter.clone();
    let (tls, body_limits, conn_limits) = (config.tls.clone(), config.http_body_limits, config.http_conn_limits);
    let index_for_check = index.clone();
    let shared = Shared {
        index,
        registry: pods.shared_registry(),
        queues: queues.clone(),
        readiness: readiness.clone(),
        central: central.clone(),
    };
    let state = Arc::new(ServiceState::with(config, shared, recorder.clone()));
    let snapshots = snapshot::open(&state, listeners.snapshot_dir.take()).map_err(ServerError::Snapshot)?;
    // The workers' narrow part of the state, once for all of them.
    let worker_context = Arc::new(WorkerContext::of(&state));
    let mut workers = Vec::new();
    for (i, rx) in receivers.into_iter().enumerate() {
        let worker = Worker::new(worker_context.clone(), i);
        let thread = std::thread::Builder::new().name(format!("kvindex-apply-{i}")).spawn(move || worker.run(rx));
        workers.push(thread.map_err(|source| ServerError::Io { what: "apply worker", source })?);
    }

    let (stop, _) = ShutdownSignal::new();
    let grpc_addr = listeners.grpc_addr();
    let http_addr = listeners.http_addr();
    let zmq_endpoint = listeners.zmq_endpoint().map(str::to_string);
    let metrics_addr = listeners.metrics_addr();
    let probe_addr = listeners.probe_addr();
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    // Not ready until the sources have started (after a bootstrap, if any).
    let starting = SharedHold::new(readiness.clone());
    let tls = match &tls {
        Some(files) => {
            let config = |alpn: &[&[u8]]| files.server_config(alpn).map_err(|e| ServerError::Tls(e.message));
            Some((config(&[b"h2"])?, config(&[b"http/1.1"])?))
        }
        None => None,
    };
    let (grpc_tls, http_tls) = (tls.as_ref().map(|t| t.0.clone()), tls.as_ref().map(|t| t.1.clone()));
    let mut grpc = tokio::spawn(grpc::serve(grpc_handles, grpc_bounds, listeners.grpc, grpc_tls, stop.subscribe()));
    let bodies = http::body::Bodies::new(body_limits);
    if let Some(listener) = listeners.probe.take() {
        let app = http::probe_router(http_handles.clone(), prometheus.clone(), bodies.clone());
        let (tls, limits, stopping) = (http_tls.clone(), conn_limits.for_probes(), stop.subscribe());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = http::serve::serve("probe", listener, app, tls, limits, stopping).await {
                tracing::error!(error = %e, "probe listener stopped");
            }
        }));
    }
    let (app, metrics_app) = match listeners.metrics {
        Some(metrics) => {
            let app = http::router(http_handles.clone(), prometheus.clone(), bodies.clone(), false);
            (app, Some((metrics, http::metrics_router(http_handles, prometheus, bodies))))
        }
        None => (http::router(http_handles, prometheus, bodies, true), None),
    };
    let serve_http = http::serve::serve("http", listeners.http, app, http_tls.clone(), conn_limits, stop.subscribe());
    let mut http = tokio::spawn(async move { serve_http.await.map_err(ServerError::Http) });
    if let Some((listener, app)) = metrics_app {
        let metrics_stopping = stop.subscribe();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = http::serve::serve("metrics", listener, app, http_tls, conn_limits, metrics_stopping).await
            {
                tracing::error!(error = %e, "metrics listener stopped");
            }
        }));
    }
    readiness.set_listening();
    tracing::info!(%grpc_addr, %http_addr, metrics = ?metrics_addr, probe = ?probe_addr, zmq = ?zmq_endpoint, "kvindex serve listening");

    let shutdown = std::pin::pin!(shutdown);
    let mut shutdown = shutdown;
    // A sibling's index first, before any stream starts and takes its record; the servers
    // answer meanwhile (health, and /readyz: not ready).
    let mut stopped_early = false;
    if let Some(sibling) = state.config().bootstrap_from.clone() {
        tokio::select! {
            _ = snapshot::bootstrap::run(&state, &readiness, &sibling) => {}
            _ = &mut shutdown => stopped_early = true,
        }
    }
    if !stopped_early {
        if let Some(sub) = listeners.zmq {
            tasks.push(tokio::spawn(sources::serve_central(
                queues.clone(),
                central,
                topic_filter,
                sub,
                stop.subscribe(),
            )));
        }
        if let Some(store) = &snapshots {
            tasks.push(tokio::spawn(snapshot::periodic(state.clone(), store.clone(), stop.subscribe())));
        }
        tasks.extend(pods.start(pods_config, listeners.discovery.take(), &stop).await);
        if let (Some(sibling), true) = (&state.config().bootstrap_from, state.config().sibling_check_interval_ms > 0) {
            let every = Duration::from_millis(state.config().sibling_check_interval_ms);
            let bearer = state.config().admin_token.as_ref().map(|t| t.bearer());
            let check = crate::persist::sibling_check::run(
                index_for_check,
                sibling.clone(),
                every,
                instance,
                bearer,
                stop.subscribe(),
            );
            tasks.push(tokio::spawn(check));
        }
    }
    starting.seal();

    let outcome = if stopped_early {
        Ok(())
    } else {
        tokio::select! {
        r = &mut grpc => Err(server_stopped("gRPC", r)),
        r = &mut http => Err(server_stopped("HTTP", r)),
        _ = &mut shutdown => Ok(()),
        }
    };
    tracing::info!("shutting down");
    stop.trigger();
    pods.stop_dialers();
    for mut server in [grpc, http] {
        if !server.is_finished() && tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await.is_err() {
            tracing::warn!("requests still in flight after {SHUTDOWN_GRACE:?}: closing their connections");
            server.abort();
        }
    }
    for task in tasks {
        let _ = task.await;
    }
    if let Some(store) = &snapshots {
        // The sources are stopped: this snapshot is where every stream ended.
        if let Err(e) = snapshot::take(&state, store, true).await {
            tracing::error!(error = %e, "final snapshot failed");
        }
    }
    for worker in 0..queues.workers() {
        queues.send(worker, Work::Stop).await;
    }
    let _ = tokio::task::spawn_blocking(move || workers.into_iter().for_each(|w| drop(w.join()))).await;
    if let Some(recorder) = recorder {
        if let Err(e) = recorder.finish() {
            tracing::error!(error = %e, "dump not finished cleanly");
        }
    }
    tracing::info!("stopped");
    outcome
}

/// The index of `config`: block size, shards, entry bound, tier weights, hash cross-check.
fn build_index(config: &Config) -> Result<KvIndex, ServerError> {
    let hash_check = match &config.hash_check {
        Some(c) => Some(HashCheck { hasher: kvindex::vllm_hash::BlockHasher::new(&c.hasher)?, every: c.every }),
        None => None,
    };
    let index = KvIndex::new(KvIndexConfig {
        block_size: config.block_size,
        shards: config.shards,
        max_entries: config.max_entries,
        hash_check,
        tier_limits: config.tier_limits,
        ..Default::default()
    });
    for (medium, weight) in &config.tier_weights {
        if index.tiers().set_weight(medium, *weight).is_none() {
            return Err(ServerError::TooManyTiers(medium.clone()));
        }
    }
    Ok(index)
}

fn server_stopped(what: &'static str, r: Result<Result<(), ServerError>, tokio::task::JoinError>) -> ServerError {
    match r {
        Ok(Err(e)) => e,
        Ok(Ok(())) => ServerError::Stopped { server: what, reason: "it returned".into() },
        Err(e) => ServerError::Stopped { server: what, reason: e.to_string() },
    }
}
