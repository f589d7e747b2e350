//! The Gateway API Inference Extension door: `kvindex-router` as the endpoint picker (EPP) a
//! gateway asks over Envoy's ext_proc where to send each request, or as a prefix pre-filter
//! ahead of an existing EPP, narrowing its candidates through the subset hint. Both run the
//! same per-request pipeline as the OpenAI proxy ([`crate::place::Router`]); only the
//! protocol differs. Protocol facts: `docs/reference/gie-epp.md` (the GIE endpoint picker
//! protocol and llm-d's handlers win where they disagree).
//!
//! ```text
//! Envoy ──Process stream──▶ stream (headers, body chunks buffered) ─▶ pipeline ─▶ answer:
//!   endpoint-picker: x-gateway-destination-endpoint header + envoy.lb metadata (primary,fallbacks)
//!   prefilter:       envoy.lb.subset_hint metadata (pods with the longest prefix in the load band)
//! then the body re-emitted in ≤62,000-byte chunks; the response echoed as it comes.
//! ```

pub mod envoy;
pub mod health;
pub mod prefilter;
pub mod service;
pub mod stream;

use std::future::Future;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::net::TcpListener;

use crate::config::ext_proc::Mode;
use crate::error::StartError;

use crate::doors::budget::Budget;
use crate::place::Router;
use service::Picker;
use stream::Shared;

/// Room for a message's framing beyond the body bytes it carries.
const MESSAGE_OVERHEAD: usize = 64 << 10;

/// Everything the endpoint picker needs besides its listeners.
pub struct Settings {
    pub mode: Mode,
    pub max_body_bytes: usize,
    pub max_buffered_bytes: usize,
    pub fallbacks: usize,
    pub load_band: f64,
    /// From a stream's start to the end of its request.
    pub request_timeout: std::time::Duration,
}

/// The ext_proc service (with `grpc.health.v1` beside it) until `shutdown` completes; the
/// health service alone on `health` when given.
pub async fn serve(
    router: Arc<Router>,
    settings: Settings,
    listener: TcpListener,
    health: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let health_service = health::service(router.fleet().clone()).await;
    let shared = Arc::new(Shared {
        router,
        mode: settings.mode,
        max_body_bytes: settings.max_body_bytes,
        fallbacks: settings.fallbacks,
        load_band: settings.load_band,
        request_timeout: settings.request_timeout,
        budget: Budget::new(settings.max_buffered_bytes),
    });
    let picker = ExternalProcessorServer::new(Picker { shared })
        .max_decoding_message_size(settings.max_body_bytes + MESSAGE_OVERHEAD);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let health_task = health.map(|listener| {
        let service = health_service.clone();
        let stopped = until(stopped.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(no_delay(listener), stopped)
                .await
        })
    });
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    tracing::info!(mode = settings.mode.label(), "ext_proc endpoint picker serving");
    let served = tonic::transport::Server::builder()
        .add_service(picker)
        .add_service(health_service)
        .serve_with_incoming_shutdown(no_delay(listener), until(stopped))
        .await
        .map_err(StartError::from);
    if let Some(task) = health_task {
        let _ = task.await;
    }
    served
}

/// The listener's connections with Nagle off: Envoy's ext_proc messages are small and each
/// waits for its answer, so a delayed ACK would hold a pick back ~40 ms on a kept-alive stream.
fn no_delay(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}
