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
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

use crate::telemetry as m;

/// Time a client has from connect to a finished TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once per listener; more connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// The PEM material of the listeners' TLS, read and checked when the config is validated.
#[derive(Clone)]
pub struct TlsFiles {
    certs: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    client_ca: Option<Vec<CertificateDer<'static>>>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsFiles")
            .field("certs", &self.certs.len())
            .field("client_ca", &self.client_ca.as_ref().map(Vec::len))
            .finish()
    }
}

/// A TLS setting that cannot be used: the key it belongs to and why.
#[derive(Debug)]
pub struct TlsError {
    pub key: &'static str,
    pub message: String,
}

fn error(key: &'static str, message: impl Into<String>) -> TlsError {
    TlsError { key, message: message.into() }
}

fn read_certs(key: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(key, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(error(key, "holds no PEM certificate"));
    }
    Ok(certs)
}

impl TlsFiles {
    /// Parses the certificate chain, its private key and, for mTLS, the CA that signs client
    /// certificates; then checks that rustls accepts them together.
    pub fn parse(cert: &[u8], key: &[u8], client_ca: Option<&[u8]>) -> Result<TlsFiles, TlsError> {
        let certs = read_certs("tls_cert", cert)?;
        let key =
            PrivateKeyDer::from_pem_slice(key).map_err(|e| error("tls_key", format!("no PEM private key: {e}")))?;
        let client_ca = client_ca.map(|pem| read_certs("tls_client_ca", pem)).transpose()?;
        let files = TlsFiles { certs, key: Arc::new(key), client_ca };
        files.server_config(&[])?;
        Ok(files)
    }

    /// Whether clients must present a certificate (mTLS).
    pub fn mutual(&self) -> bool {
        self.client_ca.is_some()
    }

    /// The rustls configuration of one listener, offering `alpn` (`h2` for gRPC,
    /// `http/1.1` for the HTTP admin).
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| error("tls_cert", e.to_string()))?;
        let builder = match &self.client_ca {
            Some(cas) => {
                let mut roots = rustls::RootCertStore::empty();
                for ca in cas {
                    roots.add(ca.clone()).map_err(|e| error("tls_client_ca", format!("not a usable CA: {e}")))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| error("tls_client_ca", e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| error("tls_key", format!("does not match tls_cert or is unusable: {e}")))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

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
