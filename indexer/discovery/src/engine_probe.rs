//! The shell of the engine probe: one `GET /server_info` (on 404, the older
//! `/get_server_info`) to a new pod's HTTP port, read by the pure [`crate::server_info`]. A pod
//! is a peer like any other, so the probe is bounded: one wall clock over connecting, both
//! paths and the whole body, a body cap, and a cap on probes in flight at once (so a namespace
//! of hostile pods holds at most [`MAX_PROBES_IN_FLIGHT`] × [`MAX_BODY_BYTES`]). Every failure
//! is an outcome, never an error: the pod then goes on as its annotations and the flags say.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;

use crate::server_info::EngineDescriptor;

/// Largest `/server_info` body read (SGLang's is tens of kilobytes: every server argument plus
/// per-rank state).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Probes running at once; the others wait their turn (their wall clock starts with it).
pub const MAX_PROBES_IN_FLIGHT: usize = 32;

/// What probing a pod found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// SGLang, described.
    Sglang(EngineDescriptor),
    /// Both paths answered 404: not SGLang (vLLM serves neither).
    NotSglang,
    /// No usable answer: the metric label (`timeout`, `unreachable`, `too_large`, `bad_status`,
    /// `bad_body`) and what happened.
    Failed(&'static str, String),
}

impl ProbeOutcome {
    /// The `outcome` label of `kvindex_discovery_engine_probes_total`.
    pub fn label(&self) -> &'static str {
        match self {
            ProbeOutcome::Sglang(_) => "sglang",
            ProbeOutcome::NotSglang => "not_sglang",
            ProbeOutcome::Failed(label, _) => label,
        }
    }

    /// The descriptor, when the pod described itself.
    pub fn descriptor(&self) -> Option<&EngineDescriptor> {
        match self {
            ProbeOutcome::Sglang(d) => Some(d),
            _ => None,
        }
    }
}

/// Probes `ip:port` within `timeout`.
pub async fn probe(ip: IpAddr, port: u16, timeout: Duration) -> ProbeOutcome {
    let addr = SocketAddr::new(ip, port);
    match tokio::time::timeout(timeout, probe_paths(addr)).await {
        Ok(outcome) => outcome,
        Err(_) => ProbeOutcome::Failed("timeout", format!("no complete answer from {addr} within {timeout:?}")),
    }
}

async fn probe_paths(addr: SocketAddr) -> ProbeOutcome {
    for path in ["/server_info", "/get_server_info"] {
        match get(addr, path).await {
            Ok(Answer::NotFound) => continue,
            Ok(Answer::Body(body)) => {
                return match EngineDescriptor::parse(&body) {
                    Ok(d) => ProbeOutcome::Sglang(d),
                    Err(e) => ProbeOutcome::Failed("bad_body", format!("{path}: {e}")),
                }
            }
            Ok(Answer::Status(status)) => {
                return ProbeOutcome::Failed("bad_status", format!("{path} answered {status}"))
            }
            Err(failed) => return failed,
        }
    }
    ProbeOutcome::NotSglang
}

enum Answer {
    NotFound,
    Status(u16),
    Body(Bytes),
}

/// Aborts the connection's task when the probe ends or is dropped (its timeout): nothing of a
/// probe outlives it.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn get(addr: SocketAddr, path: &str) -> Result<Answer, ProbeOutcome> {
    let unreachable = |e: &dyn std::fmt::Display| ProbeOutcome::Failed("unreachable", format!("{addr}{path}: {e}"));
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| unreachable(&e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&e))?;
    let _connection = AbortOnDrop(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::new())
        .map_err(|e| unreachable(&e))?;
    let response = sender.send_request(request).await.map_err(|e| unreachable(&e))?;
    let status = response.status().as_u16();
    if status == 404 {
        return Ok(Answer::NotFound);
    }
    if !(200..300).contains(&status) {
        return Ok(Answer::Status(status));
    }
    let too_large = || ProbeOutcome::Failed("too_large", format!("{path}: body over {MAX_BODY_BYTES} bytes"));
    let declared =
        response.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    match Limited::new(response.into_body(), MAX_BODY_BYTES).collect().await {
        Ok(body) => Ok(Answer::Body(body.to_bytes())),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(unreachable(&e)),
    }
}
