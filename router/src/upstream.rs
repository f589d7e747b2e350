//! Sends a placed request to its pod over pooled HTTP/1.1 connections and hands back the
//! response as soon as its head arrives, its body still streaming. A pod that fails before any
//! response byte (refused, reset, closed) is retried on the next pod of the ranking; once a
//! response has begun nothing is retried, because the client may already have part of it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::metrics as m;
use crate::place::decision::Decision;
use crate::place::pd::PREFILLER_HEADER;
use crate::place::Router;
use crate::pods::fleet::InFlight;

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

/// A response whose head arrived from `decision.ranked[attempt]`.
pub struct Forwarded {
    pub attempt: usize,
    pub response: hyper::Response<Incoming>,
    /// Keep until the response body ends: they count the request in flight.
    pub guards: Vec<InFlight>,
}

/// Tries the ranked pods in order, at most `1 + retries` of them.
pub async fn forward(
    client: &HttpClient,
    router: &Router,
    decision: &Decision,
    outgoing: Outgoing<'_>,
    retries: usize,
) -> Result<Forwarded, usize> {
    let attempts = decision.ranked.len().min(retries.saturating_add(1));
    for attempt in 0..attempts {
        let choice = &decision.ranked[attempt];
        let Some(pod) = choice.handle.as_ref() else { continue };
        let Some(guards) = router.commit(decision, attempt) else { continue };
        let Ok(request) = build(&pod.url, &outgoing, decision) else {
            continue;
        };
        let started = Instant::now();
        match client.request(request).await {
            Ok(response) => {
                metrics::histogram!(m::UPSTREAM_FIRST_BYTE).record(started.elapsed().as_secs_f64());
                return Ok(Forwarded { attempt, response, guards });
            }
            Err(error) => {
                let reason = if error.is_connect() { "connect" } else { "no_response" };
                metrics::counter!(m::UPSTREAM_RETRIES, "reason" => reason).increment(1);
                tracing::warn!(request_id = decision.id, pod = %choice.pod, reason, "pod failed before responding; trying the next");
            }
        }
    }
    Err(attempts)
}

fn build(base_url: &str, outgoing: &Outgoing<'_>, decision: &Decision) -> Result<hyper::Request<Full<Bytes>>, String> {
    let uri: hyper::Uri = format!("{base_url}{}", outgoing.path).parse().map_err(|e| format!("{e}"))?;
    let mut request = hyper::Request::post(uri).body(Full::new(outgoing.body.clone())).map_err(|e| e.to_string())?;
    let headers = request.headers_mut();
    for (name, value) in outgoing.headers {
        if !is_hop_by_hop(name) && name.as_str() != PREFILLER_HEADER {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(outgoing.body.len()));
    if let Some(prefill) = &decision.prefill {
        let value = HeaderValue::from_str(&prefill.pod).map_err(|e| e.to_string())?;
        headers.insert(PREFILLER_HEADER, value);
    }
    Ok(request)
}
