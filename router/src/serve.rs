//! Assembles a running router from a validated configuration and bound listeners: pods (static,
//! file, Kubernetes discovery, registration), the load scrapers, the pipeline, the HTTP servers and the ext_proc
//! endpoint picker, until `shutdown`.
//! The binary and tests bind the listeners themselves, so a test can use port 0.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::doors::ext_proc;
use crate::doors::http::{self, App};
use crate::error::StartError;
use crate::place::Router;
use crate::pods::fleet::{Fleet, Source};
use crate::pods::{discovery, file as pods_file, scrape};
use crate::{metrics as m, upstream};

pub struct Listeners {
    pub http: TcpListener,
    pub admin: Option<TcpListener>,
    /// The metrics-only listener (`--metrics-addr`): `/metrics` and `/debug/pods` only there.
    pub metrics: Option<TcpListener>,
    /// The kubelet's probes' own listener (`--probe-addr`): `/healthz` and `/readyz` only.
    pub probe: Option<TcpListener>,
    /// The Gateway API endpoint picker (`--ext-proc-addr`) and its optional health address.
    pub ext_proc: Option<TcpListener>,
    pub ext_proc_health: Option<TcpListener>,
}

/// Serves until `shutdown` completes, then lets requests in flight finish.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let prometheus = m::install();
    let fleet = Arc::new(Fleet::new(config.load_stale_after));
    for pod in &config.pods {
        fleet.upsert(pod, Source::Static)?;
    }
    let pods_file_text = match &config.pods_file {
        Some(path) => Some(pods_file::load(&fleet, path)?),
        None => None,
    };
    let router = Arc::new(Router::from_config(&config, fleet.clone())?);
    router.tokenizers().preload().await?;
    router.indexer().warm_up();
    let client = upstream::client(config.upstream_connect_timeout);
    tokio::spawn(scrape::run(fleet.clone(), client.clone(), config.scrape_interval, config.scrape_timeout));
    if let (Some(path), Some(text)) = (config.pods_file.clone(), pods_file_text) {
        tokio::spawn(pods_file::watch(fleet.clone(), path, config.pods_file_interval, text));
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    if let Some(watch) = config.discovery.clone() {
        let client = kvindex_discovery::watcher::client(&watch.api_server)
            .await
            .map_err(|e| StartError::setting("--discovery", e))?;
        tokio::spawn(discovery::run(fleet.clone(), client, watch, stopped.clone()));
    }
    let ext_proc_settings = config.ext_proc.as_ref().map(|e| ext_proc::Settings {
        mode: e.mode,
        max_body_bytes: config.max_body_bytes,
        max_buffered_bytes: e.max_buffered_bytes,
        fallbacks: config.upstream_retries,
        load_band: config.load_band,
        request_timeout: e.request_timeout,
    });
    let ext_proc_router = router.clone();
    let stopping = router.clone();
    let app = Arc::new(App {
        router,
        client,
        prometheus,
        max_body_bytes: config.max_body_bytes,
        body_budget: crate::doors::budget::Budget::new(config.max_inflight_body_bytes),
        body_timeout: config.http_body_timeout,
        upstream_retries: config.upstream_retries,
    });
    let limits = http::server::ConnLimits {
        header_timeout: config.http_header_timeout,
        write_timeout: config.http_write_timeout,
        max_connections: config.max_connections,
        max_connections_per_address: config.max_connections_per_address,
        max_connections_per_network: config.max_connections_per_network,
    };
    tokio::spawn(async move {
        shutdown.await;
        // Client template renders in flight are killed, so they never hold up the stop.
        stopping.tokenizers().shutdown();
        let _ = stop.send(true);
    });
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let with_metrics = listeners.metrics.is_none();
    let metrics = listeners.metrics.map(|listener| {
        let app = http::metrics_only(app.clone());
        let stopped = until(stopped.clone());
        tokio::spawn(http::server::serve("metrics", listener, app, limits, stopped))
    });
    let probe = listeners.probe.map(|listener| {
        let app = http::probes_only(app.clone());
        let stopped = until(stopped.clone());
        tokio::spawn(http::server::serve("probe", listener, app, limits.for_probes(), stopped))
    });
    let admin = listeners.admin.map(|listener| {
        let app = http::admin::admin(app.clone(), with_metrics);
        let stopped = until(stopped.clone());
        tokio::spawn(http::server::serve("admin", listener, app, limits, stopped))
    });
    let ext_proc = match (listeners.ext_proc, ext_proc_settings) {
        (Some(listener), Some(settings)) => {
            let stopped = until(stopped.clone());
            let health = listeners.ext_proc_health;
            Some(tokio::spawn(ext_proc::serve(ext_proc_router, settings, listener, health, stopped)))
        }
        _ => None,
    };
    tracing::info!(pods = fleet.snapshot().len(), indexers = config.indexers.len(), "kvindex-router serving");
    http::server::serve("http", listeners.http, http::public(app, with_metrics), limits, until(stopped)).await?;
    for server in admin.into_iter().chain(metrics).chain(probe) {
        let _ = server.await;
    }
    if let Some(ext_proc) = ext_proc {
        ext_proc.await??;
    }
    Ok(())
}
