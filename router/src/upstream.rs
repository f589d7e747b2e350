//! HTTP to the pods, and nothing else: pooled HTTP/1.1 connections, one request sent to one pod
//! with the response handed back as soon as its head arrives, its body still streaming, or why
//! the pod gave none. It knows nothing of the router: the caller decides which pod to try,
//! commits the pick, and retries on the next pod after a [`Failure`].

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::metrics as m;

/// The header naming the prefill pod to the decode pod's sidecar (llm-d's P/D protocol): set
/// from the caller's prefill pod, never passed through from the client.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";

/// The header naming the data-parallel rank that is to serve a request, for an engine whose
/// ranks share one endpoint: SGLang 0.5.19+ (`X-Data-Parallel-Rank`, over the body's
/// `routed_dp_rank`, before any load-balance method) and vLLM (`X-data-parallel-rank`) read it.
/// Set from the pick, replacing any the client sent.
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";

/// The pooled client for pods (requests and scrapes).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client(connect_timeout: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(60)).build(connector)
}

/// Headers that belong to one connection, never forwarded (RFC 9110 §7.6.1), plus the ones the
/// client recomputes.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// The request as received, to forward.
pub struct Outgoing<'a> {
    pub path: &'static str,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
}

/// Why a pod gave no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The request could not be built for this pod (its URL or the prefill pod's id is not
    /// valid in a request): nothing was sent.
    Unsendable,
    /// No connection to the pod.
    Connect,
    /// Connected, but the pod closed or reset before any response byte.
    NoResponse,
}

impl Failure {
    /// The `kvindex_router_upstream_retries_total` reason.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Unsendable => "unsendable",
            Failure::Connect => "connect",
            Failure::NoResponse => "no_response",
        }
    }
}

/// Where one request goes: the pod's base URL, and the data-parallel rank to name there.
#[derive(Debug, Clone, Copy)]
pub struct Destination<'a> {
    pub base_url: &'a str,
    pub dp_rank: Option<u32>,
}

/// Sends `outgoing` to `to` (naming the prefill pod `prefill` to it, P/D) and returns the
/// response as soon as its head arrives, its body still streaming.
pub async fn send(
    client: &HttpClient,
    to: Destination<'_>,
    prefill: Option<&str>,
    outgoing: &Outgoing<'_>,
) -> Result<hyper::Response<Incoming>, Failure> {
    let request = build(to, outgoing, prefill).ok_or(Failure::Unsendable)?;
    let started = Instant::now();
    match client.request(request).await {
        Ok(response) => {
            metrics::histogram!(m::UPSTREAM_FIRST_BYTE).record(started.elapsed().as_secs_f64());
            Ok(response)
        }
        Err(error) if error.is_connect() => Err(Failure::Connect),
        Err(_) => Err(Failure::NoResponse),
    }
}

fn build(to: Destination<'_>, outgoing: &Outgoing<'_>, prefill: Option<&str>) -> Option<hyper::Request<Full<Bytes>>> {
    let uri: hyper::Uri = format!("{}{}", to.base_url, outgoing.path).parse().ok()?;
    let mut request = hyper::Request::post(uri).body(Full::new(outgoing.body.clone())).ok()?;
    let headers = request.headers_mut();
    for (name, value) in outgoing.headers {
        if !is_hop_by_hop(name) && name.as_str() != PREFILLER_HEADER {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(outgoing.body.len()));
    if let Some(prefill) = prefill {
        headers.insert(PREFILLER_HEADER, HeaderValue::from_str(prefill).ok()?);
    }
    if let Some(rank) = to.dp_rank {
        headers.insert(DP_RANK_HEADER, HeaderValue::from(rank));
    }
    Some(request)
}
