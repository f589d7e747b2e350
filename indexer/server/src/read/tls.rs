//! TLS and mTLS for the gRPC and HTTP listeners (`tls_cert`, `tls_key`, `tls_client_ca`).
//!
//! One rustls configuration serves every TCP listener of the API: connections are handshaken
//! off the accept loop (a client that stalls its handshake holds one task until
//! [`HANDSHAKE_TIMEOUT`], never the listener), and only finished TLS streams reach tonic or
//! hyper. gRPC's are accepted here ([`accept`], at most 256 handshakes at once); the HTTP
//! listeners accept their own, within their connection caps, and call [`handshake`]
//! (`crate::read::http::serve`). With `tls_client_ca` a client must present a certificate that CA signed, or
//! its handshake fails. Every failed handshake is counted
//! (`kvindex_tls_handshake_failures_total{listener}`), and logged at debug level only: a port
//! scanner must not fill the logs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;

use crate::telemetry as m;

/// Time a client has from connect to a finished TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once per listener; more connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// Accepts TCP connections on `listener` and handshakes TLS on each in its own task; the
/// finished streams arrive on the returned channel. Stops when the receiver is dropped.
pub fn accept(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    name: &'static str,
) -> mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                _ = tx.closed() => return,
                permit = handshakes.clone().acquire_owned() => permit,
            };
            let Ok(permit) = permit else { return };
            let (tcp, peer) = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors, usually: back off instead of spinning.
                        tracing::warn!(listener = name, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let _permit = permit;
                if let Some(stream) = handshake(&acceptor, tcp, peer, name).await {
                    let _ = tx.send((stream, peer)).await;
                }
            });
        }
    });
    rx
}

/// Handshakes TLS on an accepted connection within [`HANDSHAKE_TIMEOUT`]; a failure is
/// counted for `name` and logged at debug level, and gives `None`.
pub async fn handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    name: &'static str,
) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            failed(name, "handshake", &peer, &e.to_string());
            None
        }
        Err(_) => {
            failed(name, "timeout", &peer, "no finished handshake in time");
            None
        }
    }
}

fn failed(listener: &'static str, reason: &'static str, peer: &SocketAddr, error: &str) {
    metrics::counter!(m::TLS_HANDSHAKE_FAILURES, "listener" => listener, "reason" => reason).increment(1);
    tracing::debug!(listener, %peer, error = %crate::write::transport::escape(error), "TLS handshake failed");
}
