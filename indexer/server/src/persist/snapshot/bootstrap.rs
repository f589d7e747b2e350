//! Bootstrap from a sibling (`kvindex serve --bootstrap-from <host:port>`): a new replica
//! streams a running sibling's index (`kvindex.v1.Replica/ExportIndex`: the snapshot's header
//! and stream records, framed and checksummed as the store keeps them) and takes it as it
//! takes its own snapshot: the records wait in `Restored`, and each pod is imported only once
//! its engine's stream continues from the record's cursor (a replay from `cursor + 1`), or the
//! record is dropped. Nothing is guessed, and nothing is half done: the records go in only
//! once the whole stream has arrived and every record has passed its checks (the header's
//! recipe and block size, every record listed once with its checksum, every column checked);
//! a sibling that cannot be reached, refuses, is slow past `bootstrap_timeout_ms`, sends more
//! than `bootstrap_max_bytes` or anything damaged leaves the replica as it would have started
//! without `--bootstrap-from` (its own snapshot, or cold), with one ERROR log line and a count
//! in `kvindex_bootstrap_total{outcome}`.
//!
//! `/readyz` waits for the bootstrap: the fetch, then every record until its stream has
//! imported it (and run what waited behind it) or dropped it, for at most
//! `bootstrap_timeout_ms` after the fetch; records no stream has claimed by then are dropped
//! (`kvindex_snapshot_restored_pods_total{outcome="unclaimed"}`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use rayon::prelude::*;
use tonic::Code;

use kvindex_proto::kvindex::v1::ExportIndexRequest;

use super::chunks::Reassembly;
use super::format::{self, Header, StreamRecord};
use crate::config::sibling::Sibling;
use crate::persist::sibling;
use crate::readiness::{Readiness, SharedHold};
use crate::telemetry as m;
use crate::write::context::ServiceState;

/// Time to open the connection to the sibling.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a bootstrap did not load the sibling's index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapError {
    #[error("the sibling cannot be reached: {0}")]
    Unreachable(String),
    #[error("the sibling refused our token: {0}")]
    Denied(String),
    #[error("the sibling is busy: {0}")]
    Busy(String),
    #[error("no whole export within {0:?}")]
    Timeout(Duration),
    #[error("the export is larger than bootstrap_max_bytes ({limit} bytes)")]
    TooLarge { limit: u64 },
    #[error("damaged export: {0}")]
    Damaged(String),
    #[error("export made under another key recipe or block size: {0}")]
    Refused(String),
    #[error("the export stopped before its end: {0}")]
    Interrupted(String),
}

impl BootstrapError {
    /// Stable label for `kvindex_bootstrap_total{outcome}`.
    pub fn label(&self) -> &'static str {
        match self {
            BootstrapError::Unreachable(_) => "unreachable",
            BootstrapError::Denied(_) => "denied",
            BootstrapError::Busy(_) => "busy",
            BootstrapError::Timeout(_) => "timeout",
            BootstrapError::TooLarge { .. } => "too_large",
            BootstrapError::Damaged(_) => "damaged",
            BootstrapError::Refused(_) => "refused",
            BootstrapError::Interrupted(_) => "interrupted",
        }
    }
}

/// What a bootstrap needs to know: where the sibling is, and the bounds.
#[derive(Debug, Clone)]
pub struct BootstrapLimits {
    pub timeout: Duration,
    pub max_bytes: u64,
    /// The most stream records accepted (`max_sources`).
    pub max_streams: usize,
    pub block_size: u64,
}

/// A verified export: its records and the bytes it took.
#[derive(Debug)]
pub struct Fetched {
    pub records: Vec<StreamRecord>,
    pub bytes: u64,
    pub residencies: u64,
}

/// Fetches the sibling's index and verifies all of it (see the module doc), within the limits.
pub async fn fetch(
    sibling: &Sibling,
    bearer: Option<&str>,
    limits: &BootstrapLimits,
) -> Result<Fetched, BootstrapError> {
    match tokio::time::timeout(limits.timeout, fetch_unbounded(sibling, bearer, limits)).await {
        Ok(fetched) => fetched,
        Err(_) => Err(BootstrapError::Timeout(limits.timeout)),
    }
}

async fn fetch_unbounded(
    sibling: &Sibling,
    bearer: Option<&str>,
    limits: &BootstrapLimits,
) -> Result<Fetched, BootstrapError> {
    let mut client = sibling::connect(&sibling.addr, sibling.tls.as_ref(), CONNECT_TIMEOUT)
        .await
        .map_err(BootstrapError::Unreachable)?;
    let request = sibling::request(ExportIndexRequest { max_bytes: limits.max_bytes }, bearer);
    let limit = limits.max_bytes;
    let mut stream = client.export_index(request).await.map_err(|s| refused_call(&s, limit))?.into_inner();
    let mut reassembly = Reassembly::new(limits.max_bytes);
    let mut header: Option<Header> = None;
    let mut values = Vec::new();
    loop {
        let chunk = match stream.message().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            // Nothing came yet: the connection itself failed (under TLS 1.3 a sibling that
            // refuses our certificate says so only after the handshake looked done).
            Err(status) if reassembly.received() == 0 && header.is_none() => return Err(refused_call(&status, limit)),
            Err(status) => return Err(stopped(&status, limit)),
        };
        let Some(value) = reassembly.push(chunk).map_err(|t| BootstrapError::TooLarge { limit: t.limit })? else {
            continue;
        };
        match &header {
            None => header = Some(check_header(&value, limits)?),
            Some(h) if values.len() >= h.streams.len() => {
                return Err(BootstrapError::Damaged(format!(
                    "more records than the {} its header lists",
                    h.streams.len()
                )))
            }
            Some(_) => values.push(value),
        }
    }
    if reassembly.partial() {
        return Err(BootstrapError::Interrupted("it ended inside a value".into()));
    }
    let header = header.ok_or_else(|| BootstrapError::Damaged("no header".into()))?;
    if values.len() != header.streams.len() {
        return Err(BootstrapError::Interrupted(format!(
            "{} of the {} records its header lists",
            values.len(),
            header.streams.len()
        )));
    }
    let bytes = reassembly.received();
    let residencies = header.residencies;
    let records = tokio::task::spawn_blocking(move || decode_all(&header, &values))
        .await
        .map_err(|e| BootstrapError::Damaged(format!("decoding stopped: {e}")))??;
    Ok(Fetched { records, bytes, residencies })
}

/// The header, if it was made under our key recipe and block size and lists what we accept.
fn check_header(value: &[u8], limits: &BootstrapLimits) -> Result<Header, BootstrapError> {
    let header: Header = format::decode(value).map_err(|e| BootstrapError::Damaged(format!("header: {e}")))?;
    let recipe = kvindex::keys::RECIPE_VERSION;
    if header.recipe_version != recipe {
        return Err(BootstrapError::Refused(format!("key recipe {}, this build uses {recipe}", header.recipe_version)));
    }
    if header.block_size != limits.block_size {
        return Err(BootstrapError::Refused(format!(
            "block size {}, ours is {}",
            header.block_size, limits.block_size
        )));
    }
    if header.streams.len() > limits.max_streams {
        return Err(BootstrapError::Damaged(format!(
            "{} streams, more than max_sources ({})",
            header.streams.len(),
            limits.max_streams
        )));
    }
    Ok(header)
}

/// Every record verified (listed once by the header, with its checksum) and decoded (every
/// column checked), on every core.
fn decode_all(header: &Header, values: &[Vec<u8>]) -> Result<Vec<StreamRecord>, BootstrapError> {
    let listed: HashMap<&str, u64> = header.streams.iter().map(|(k, sum)| (k.as_str(), *sum)).collect();
    if listed.len() != header.streams.len() {
        return Err(BootstrapError::Damaged("a stream listed twice".into()));
    }
    let records: Vec<StreamRecord> = values
        .par_iter()
        .map(|value| {
            let record = format::decode_record(value).map_err(|e| BootstrapError::Damaged(format!("record: {e}")))?;
            let key = record.key();
            if listed.get(key.as_str()) != format::checksum_of(value).as_ref() {
                return Err(BootstrapError::Damaged(format!("record {key} is not the one its header lists")));
            }
            Ok(record)
        })
        .collect::<Result<_, _>>()?;
    let mut seen = std::collections::HashSet::with_capacity(records.len());
    if !records.iter().all(|r| seen.insert(r.key())) {
        return Err(BootstrapError::Damaged("a record sent twice".into()));
    }
    Ok(records)
}

/// Why the call was refused before any chunk (`Unknown`, `Cancelled`: the connection failed,
/// e.g. a sibling refusing our certificate; not the sibling's answer).
fn refused_call(status: &tonic::Status, limit: u64) -> BootstrapError {
    match status.code() {
        Code::Unavailable | Code::Unimplemented | Code::Unknown | Code::Cancelled => {
            BootstrapError::Unreachable(format!("{:?}: {}", status.code(), status.message()))
        }
        _ => stopped(status, limit),
    }
}

/// Why the stream stopped (`limit`: our byte bound, which the sibling may have refused by).
fn stopped(status: &tonic::Status, limit: u64) -> BootstrapError {
    let what = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Unauthenticated | Code::PermissionDenied => BootstrapError::Denied(what),
        // The sibling's answer when its export does not fit our bound (or its own budget).
        Code::ResourceExhausted if status.message().contains("byte budget") => BootstrapError::TooLarge { limit },
        Code::ResourceExhausted => BootstrapError::Busy(what),
        _ => BootstrapError::Interrupted(what),
    }
}

/// Runs the bootstrap of a starting replica: `/readyz` waits for it (see the module doc). On
/// success the sibling's records replace any loaded from the local snapshot; on failure the
/// replica goes on as it would have without `--bootstrap-from`.
pub async fn run(state: &Arc<ServiceState>, readiness: &Arc<Readiness>, sibling: &Sibling) {
    let config = state.config();
    let hold = SharedHold::new(readiness.clone());
    let limits = BootstrapLimits {
        timeout: Duration::from_millis(config.bootstrap_timeout_ms),
        max_bytes: config.bootstrap_max_bytes,
        max_streams: config.max_sources,
        block_size: config.block_size as u64,
    };
    let started = Instant::now();
    let bearer = config.admin_token.as_ref().map(|t| t.bearer());
    tracing::info!(sibling = %sibling.addr, "bootstrap: streaming the sibling's index");
    match fetch(sibling, bearer.as_deref(), &limits).await {
        Ok(fetched) => {
            let streams = fetched.records.len();
            counter!(m::BOOTSTRAPS, "outcome" => "loaded").increment(1);
            histogram!(m::BOOTSTRAP_SECONDS).record(started.elapsed().as_secs_f64());
            gauge!(m::BOOTSTRAP_BYTES).set(fetched.bytes as f64);
            let parts = fetched.records.into_iter().map(|r| (r, hold.part())).collect();
            state.restored().replace(parts);
            tracing::info!(
                sibling = %sibling.addr,
                streams,
                residencies = fetched.residencies,
                bytes = fetched.bytes,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "bootstrap loaded: pods come back as their streams continue from the sibling's cursors"
            );
            hold.seal();
            let (state, hold) = (state.clone(), hold.clone());
            let wait = limits.timeout;
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                if hold.is_released() {
                    return;
                }
                let unclaimed = state.restored().drain();
                counter!(m::SNAPSHOT_RESTORES, "outcome" => "unclaimed").increment(unclaimed as u64);
                hold.release();
                tracing::warn!(
                    unclaimed,
                    "bootstrap: ready without waiting longer for every stream: records no stream claimed are dropped"
                );
            });
        }
        Err(e) => {
            counter!(m::BOOTSTRAPS, "outcome" => e.label()).increment(1);
            let fallback =
                if state.restored().is_empty() { "starting cold" } else { "starting from the local snapshot" };
            tracing::error!(sibling = %sibling.addr, error = %e, reason = e.label(), "bootstrap failed: {fallback}");
            hold.seal();
        }
    }
}
