//! The listeners' TLS material (`tls_cert`, `tls_key`, `tls_client_ca`), read and checked when
//! the configuration is validated, so that a bad file is a config error naming its key; the
//! listeners build their rustls configuration from it.

use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

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
