//! Serves the tokenization service, gRPC health and reflection on TCP and, optionally, on a
//! Unix socket (llm-d's sidecar layout), until a shutdown signal.
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use kvindex_proto::tokenization::tokenization_service_server::TokenizationServiceServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::TcpIncoming;

use crate::grpc_service::TokenizationGrpc;
use crate::registry::TokenizerRegistry;

/// Listeners already bound, so callers (tests, the CLI) know the real addresses first.
#[derive(Debug)]
pub struct BoundListeners {
    pub tcp: TcpListener,
    pub uds: Option<(UnixListener, PathBuf)>,
}

impl BoundListeners {
    /// Binds `grpc_addr` (port 0 picks a free one) and, if given, the Unix socket `uds`
    /// (a stale socket file from a previous run is replaced).
    pub async fn bind(grpc_addr: SocketAddr, uds: Option<PathBuf>) -> std::io::Result<Self> {
        let tcp = TcpListener::bind(grpc_addr).await?;
        let uds = match uds {
            Some(path) => {
                if path.exists() {
                    std::fs::remove_file(&path)?;
                }
                Some((UnixListener::bind(&path)?, path))
            }
            None => None,
        };
        Ok(Self { tcp, uds })
    }

    pub fn tcp_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// Serves until `shutdown` resolves. Both listeners get the same service instance.
pub async fn serve(
    registry: Arc<TokenizerRegistry>,
    listeners: BoundListeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let service =
        TokenizationServiceServer::new(TokenizationGrpc::new(registry)).max_decoding_message_size(64 * 1024 * 1024);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<TokenizationServiceServer<TokenizationGrpc>>().await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kvindex_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kvindex_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let wait_stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stopped| *stopped).await;
    };

    let router = || {
        tonic::transport::Server::builder()
            .add_service(health_service.clone())
            .add_service(reflection_v1.clone())
            .add_service(reflection_v1alpha.clone())
            .add_service(service.clone())
    };
    // Without TCP_NODELAY small responses wait on delayed ACKs (~40 ms per call).
    let incoming = TcpIncoming::from(listeners.tcp).with_nodelay(Some(true));
    let tcp = router().serve_with_incoming_shutdown(incoming, wait_stop(stop_rx.clone()));
    match listeners.uds {
        Some((uds, path)) => {
            let unix = router().serve_with_incoming_shutdown(UnixListenerStream::new(uds), wait_stop(stop_rx));
            let result = tokio::try_join!(tcp, unix);
            let _ = std::fs::remove_file(&path);
            result?;
        }
        None => tcp.await?,
    }
    Ok(())
}
