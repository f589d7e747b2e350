//! Talking to a sibling replica (another `kvindex serve` of the same fleet) over its gRPC
//! `kvindex.v1.Replica` service, as the other clients talk to an indexer: plain or TLS (a CA
//! to trust, a client identity for mTLS, the name its certificate carries), with the admin
//! token the replicas share for what needs it. Used by the bootstrap (`persist::snapshot::bootstrap`),
//! the periodic digest check (`sibling_check`) and `kvindex compare`.

use std::time::Duration;

use kvindex_proto::kvindex::v1::replica_client::ReplicaClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::sibling::SiblingTls;

/// The largest message a sibling may send us: one export chunk with room to spare, or the
/// digests of many pods.
pub const MAX_REPLY_BYTES: usize = 16 << 20;

/// A client of the sibling at `addr` (`host:port`), connected within `connect_timeout`.
pub async fn connect(
    addr: &str,
    tls: Option<&SiblingTls>,
    connect_timeout: Duration,
) -> Result<ReplicaClient<Channel>, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(|e| format!("{addr}: {e}"))?;
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(client_config(tls)).map_err(|e| format!("{addr}: {e}"))?;
    }
    let channel = endpoint
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("{addr}: {}", error_chain(&e)))?;
    Ok(ReplicaClient::new(channel).max_decoding_message_size(MAX_REPLY_BYTES))
}

/// The TLS of a connection to a sibling.
fn client_config(tls: &SiblingTls) -> ClientTlsConfig {
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    if let Some(domain) = &tls.domain {
        config = config.domain_name(domain.clone());
    }
    config
}

/// A request presenting `bearer` (`Bearer <token>`), if any.
pub fn request<T>(message: T, bearer: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = bearer.and_then(|b| b.parse().ok()) {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// An error with its causes ("transport error: connection refused").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
