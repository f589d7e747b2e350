//! Proof that replicas agree: each pod's digest here (`kvindex::index::digest`, at its
//! stream's cursor) against a sibling's (`kvindex.v1.Replica/PodDigests`). [`compare`] is the
//! verdict per pod, shared by `kvindex compare` and [`run`], the opt-in periodic check
//! (`sibling_check_interval_ms`) that asks every address the sibling's name resolves to (at
//! most [`MAX_SIBLINGS`]; itself skipped by its instance id) and sets
//! `kvindex_sibling_pods{sibling, verdict}`.

use std::collections::BTreeMap;
use std::time::Duration;

use kvindex_proto::kvindex::v1 as pb;

use crate::config::sibling::{Sibling, SiblingTls};
use crate::index_handle::IndexHandle;
use crate::persist::sibling;
use crate::shutdown::Shutdown;
use crate::telemetry as m;

/// The most sibling addresses one check asks.
pub const MAX_SIBLINGS: usize = 16;

/// Time one sibling has to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// How one pod compares between two replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// The same digest (or neither holds anything).
    Agree,
    /// Different digests at the same cursor: the replicas applied the same events and hold
    /// different residencies.
    Differ,
    /// Different digests at different cursors: one is behind the other (a moment of lag, or
    /// a stream that stopped on one of them).
    Behind,
    /// One of them holds blocks for the pod, the other has no stream for it.
    Missing,
    /// One of them waits to prove or import a record: not comparable yet.
    Unsettled,
}

impl Verdict {
    pub const ALL: [Verdict; 5] =
        [Verdict::Agree, Verdict::Differ, Verdict::Behind, Verdict::Missing, Verdict::Unsettled];

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Agree => "agree",
            Verdict::Differ => "differ",
            Verdict::Behind => "behind",
            Verdict::Missing => "missing",
            Verdict::Unsettled => "unsettled",
        }
    }
}

/// One pod seen from two replicas.
#[derive(Debug, Clone, PartialEq)]
pub struct PodComparison {
    pub pod: String,
    pub verdict: Verdict,
    pub a: Option<pb::PodDigest>,
    pub b: Option<pb::PodDigest>,
}

/// The verdict for one pod as `a` and `b` report it.
pub fn verdict(a: Option<&pb::PodDigest>, b: Option<&pb::PodDigest>) -> Verdict {
    match (a, b) {
        (Some(a), Some(b)) if !a.settled || !b.settled => Verdict::Unsettled,
        (Some(a), Some(b)) if a.digest == b.digest => Verdict::Agree,
        (Some(a), Some(b)) if a.has_cursor && b.has_cursor && a.cursor == b.cursor && a.model == b.model => {
            Verdict::Differ
        }
        (Some(_), Some(_)) => Verdict::Behind,
        (Some(x), None) | (None, Some(x)) if x.blocks > 0 || !x.settled => Verdict::Missing,
        _ => Verdict::Agree,
    }
}

/// Every pod either replica reports, by name, with its verdict.
pub fn compare(a: &[pb::PodDigest], b: &[pb::PodDigest]) -> Vec<PodComparison> {
    let mut pods: BTreeMap<&str, (Option<&pb::PodDigest>, Option<&pb::PodDigest>)> = BTreeMap::new();
    for d in a {
        pods.entry(d.pod.as_str()).or_default().0 = Some(d);
    }
    for d in b {
        pods.entry(d.pod.as_str()).or_default().1 = Some(d);
    }
    pods.into_iter()
        .map(|(pod, (a, b))| PodComparison {
            pod: pod.to_string(),
            verdict: verdict(a, b),
            a: a.cloned(),
            b: b.cloned(),
        })
        .collect()
}

/// This replica's digests, as it answers `PodDigests`.
pub fn own_digests(index: &IndexHandle) -> Vec<pb::PodDigest> {
    index
        .status()
        .streams()
        .into_iter()
        .map(|d| pb::PodDigest {
            pod: d.pod,
            model: d.model,
            cursor: d.last_seq.unwrap_or(0),
            has_cursor: d.last_seq.is_some(),
            digest: d.digest.unwrap_or(0),
            blocks: d.digest_blocks,
            settled: d.digest.is_some(),
            state: d.state.to_string(),
        })
        .collect()
}

/// Every `sibling_check_interval` until `shutdown`: compares this replica's digests with each
/// sibling's and sets `kvindex_sibling_pods{sibling, verdict}` (see the module doc).
pub async fn run(
    index: IndexHandle,
    sibling: Sibling,
    every: Duration,
    instance: u64,
    bearer: Option<String>,
    mut shutdown: Shutdown,
) {
    let (host, port) = match sibling.addr.rsplit_once(':') {
        Some((h, p)) => (h.trim_start_matches('[').trim_end_matches(']').to_string(), p.to_string()),
        None => (sibling.addr.clone(), "50051".into()),
    };
    // Each address is dialled by IP: its certificate still carries the Service's name.
    let tls = sibling.tls.clone().map(|mut t| {
        t.domain.get_or_insert_with(|| host.clone());
        t
    });
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.recv() => return,
        }
        let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host(format!("{host}:{port}")).await {
            Ok(found) => found.take(MAX_SIBLINGS).collect(),
            Err(e) => {
                metrics::counter!(m::SIBLING_CHECKS, "outcome" => "unresolved").increment(1);
                tracing::warn!(sibling = %sibling.addr, error = %e, "sibling check: the name does not resolve");
                continue;
            }
        };
        for addr in addrs {
            let asked = ask(&addr.to_string(), tls.as_ref(), bearer.as_deref()).await;
            let theirs = match asked {
                Ok(r) if r.instance == instance => {
                    metrics::counter!(m::SIBLING_CHECKS, "outcome" => "self").increment(1);
                    continue;
                }
                Ok(r) => r,
                Err(e) => {
                    metrics::counter!(m::SIBLING_CHECKS, "outcome" => "unreachable").increment(1);
                    tracing::debug!(sibling = %addr, error = %e, "sibling check: no answer");
                    continue;
                }
            };
            metrics::counter!(m::SIBLING_CHECKS, "outcome" => "ok").increment(1);
            let compared = compare(&own_digests(&index), &theirs.pods);
            let label = addr.to_string();
            for v in Verdict::ALL {
                let n = compared.iter().filter(|c| c.verdict == v).count();
                metrics::gauge!(m::SIBLING_PODS, "sibling" => label.clone(), "verdict" => v.label()).set(n as f64);
            }
            let differ: Vec<&str> =
                compared.iter().filter(|c| c.verdict == Verdict::Differ).map(|c| c.pod.as_str()).collect();
            if !differ.is_empty() {
                tracing::warn!(sibling = %addr, pods = ?differ, "sibling check: pods hold other residencies at the same cursor");
            }
        }
    }
}

/// Why a sibling's digests were not had (counted `unreachable` by the check).
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// No connection (the address, TLS, or the connect itself).
    #[error("{0}")]
    Connect(String),
    /// The sibling answered with an error status.
    #[error("{addr}: {code:?}: {message}")]
    Refused { addr: String, code: tonic::Code, message: String },
    #[error("{addr}: no answer within {after:?}")]
    Timeout { addr: String, after: Duration },
}

/// One sibling's digests.
pub async fn ask(
    addr: &str,
    tls: Option<&SiblingTls>,
    bearer: Option<&str>,
) -> Result<pb::PodDigestsResponse, AskError> {
    let call = async {
        let mut client = sibling::connect(addr, tls, ASK_TIMEOUT).await.map_err(AskError::Connect)?;
        client
            .pod_digests(sibling::request(pb::PodDigestsRequest {}, bearer))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| AskError::Refused { addr: addr.to_string(), code: s.code(), message: s.message().to_string() })
    };
    tokio::time::timeout(ASK_TIMEOUT, call)
        .await
        .map_err(|_| AskError::Timeout { addr: addr.to_string(), after: ASK_TIMEOUT })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, cursor: u64, digest: u64, blocks: u64) -> pb::PodDigest {
        pb::PodDigest {
            pod: name.into(),
            model: "m".into(),
            cursor,
            has_cursor: true,
            digest,
            blocks,
            settled: true,
            state: "exact".into(),
        }
    }

    #[test]
    fn verdicts_tell_a_real_difference_from_lag() {
        let a = [
            pod("p1", 5, 1, 3),
            pod("p2", 5, 2, 3),
            pod("p3", 7, 3, 3),
            pod("p4", 1, 4, 2),
            pod("p5", 1, 0, 0),
            pod("p6", 1, 0, 0),
        ];
        let mut unsettled = pod("p5", 1, 0, 0);
        unsettled.settled = false;
        let b = [pod("p1", 9, 1, 3), pod("p2", 5, 9, 3), pod("p3", 8, 4, 4), unsettled.clone()];
        let v: Vec<(String, Verdict)> = compare(&a, &b).into_iter().map(|c| (c.pod, c.verdict)).collect();
        assert_eq!(
            v,
            vec![
                ("p1".into(), Verdict::Agree),
                ("p2".into(), Verdict::Differ),
                ("p3".into(), Verdict::Behind),
                ("p4".into(), Verdict::Missing),
                ("p5".into(), Verdict::Unsettled),
                ("p6".into(), Verdict::Agree),
            ]
        );
        assert_eq!(verdict(Some(&unsettled), None), Verdict::Missing);
    }
}
