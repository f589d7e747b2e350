//! `kvindex.v1.Replica`: what sibling replicas ask each other.
//!
//! `ExportIndex` streams the whole index to a replica that bootstraps from this one
//! (`persist::snapshot::bootstrap`). It hands out what the index believes about every pod, so it takes
//! the control plane's token (as RegisterPod and RecordRoute: PERMISSION_DENIED without
//! `admin_token_file`, UNAUTHENTICATED without the token), and it is bounded: one export at a
//! time per caller (peer address) and `sibling_export_max_concurrent` in all
//! (RESOURCE_EXHAUSTED past them), the encoded export within `sibling_export_max_bytes` (and
//! the caller's own bound), the whole call within `sibling_export_timeout_ms`
//! (DEADLINE_EXCEEDED). The capture does not stall ingest (`write::worker::capture`), and waits for
//! a snapshot being taken rather than running beside it.
//!
//! `PodDigests` answers, per pod, the digest of what this replica holds, at its stream's
//! cursor, as the apply workers last published it (`/debug/sources` shows the same): a read,
//! like `/debug/sources`, so not gated.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use metrics::{counter, gauge, histogram};
use parking_lot::Mutex;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use kvindex_proto::kvindex::v1 as pb;
use kvindex_proto::kvindex::v1::replica_server::Replica;

use super::indexer::authorize;
use super::record_route::caller_of;
use crate::config::sibling::ExportLimits;
use crate::index_handle::IndexHandle;
use crate::persist::snapshot::chunks::chunks;
use crate::persist::snapshot::sibling_export::{self, ExportError};
use crate::pods::auth::ControlPlane;
use crate::queue::Queues;
use crate::telemetry as m;

pub struct ReplicaService {
    pub index: IndexHandle,
    pub queues: Arc<Queues>,
    pub control: ControlPlane,
    pub limits: ExportLimits,
    pub block_size: usize,
    /// This process, so that a replica reaching itself through a Service can tell.
    pub instance: u64,
    /// The callers with an export running.
    running: Arc<Mutex<HashSet<String>>>,
}

impl ReplicaService {
    pub fn new(
        index: IndexHandle,
        queues: Arc<Queues>,
        control: ControlPlane,
        limits: ExportLimits,
        block_size: usize,
        instance: u64,
    ) -> Self {
        ReplicaService { index, queues, control, limits, block_size, instance, running: Arc::default() }
    }
}

/// Takes `caller`'s export slot among the `running` ones (at most `max`), or says why not.
fn claim(running: &Arc<Mutex<HashSet<String>>>, max: usize, caller: &str) -> Result<Slot, Status> {
    let mut held = running.lock();
    if held.contains(caller) {
        return Err(Status::resource_exhausted(format!("an export to {caller} is already running")));
    }
    if held.len() >= max {
        return Err(Status::resource_exhausted(format!(
            "{} exports are running (sibling_export_max_concurrent)",
            held.len()
        )));
    }
    held.insert(caller.to_string());
    gauge!(m::SIBLING_EXPORTS_RUNNING).set(held.len() as f64);
    Ok(Slot { running: running.clone(), caller: caller.to_string() })
}

/// A caller's export slot, given back when dropped.
struct Slot {
    running: Arc<Mutex<HashSet<String>>>,
    caller: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut running = self.running.lock();
        running.remove(&self.caller);
        gauge!(m::SIBLING_EXPORTS_RUNNING).set(running.len() as f64);
    }
}

fn outcome(outcome: &'static str) {
    counter!(m::SIBLING_EXPORTS, "outcome" => outcome).increment(1);
}

/// A random number for this process.
pub fn instance_id() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()))
}

#[tonic::async_trait]
impl Replica for ReplicaService {
    type ExportIndexStream = ReceiverStream<Result<pb::ExportIndexChunk, Status>>;

    async fn export_index(
        &self,
        request: Request<pb::ExportIndexRequest>,
    ) -> Result<Response<Self::ExportIndexStream>, Status> {
        authorize(&self.control, &request).inspect_err(|_| outcome("denied"))?;
        let caller = caller_of(request.remote_addr());
        let slot = claim(&self.running, self.limits.max_concurrent, &caller).inspect_err(|_| outcome("busy"))?;
        let asked = request.into_inner().max_bytes;
        let budget = if asked > 0 { asked.min(self.limits.max_bytes) } else { self.limits.max_bytes };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let (queues, block_size, timeout) = (self.queues.clone(), self.block_size as u64, self.limits.timeout);
        tokio::spawn(async move {
            let _slot = slot;
            let started = Instant::now();
            let send = async {
                let export = sibling_export::export(&queues, block_size, budget).await?;
                let (bytes, streams) = (export.bytes, export.records.len());
                for value in std::iter::once(export.header).chain(export.records) {
                    for chunk in chunks(&value) {
                        if tx.send(Ok(chunk)).await.is_err() {
                            return Ok(None);
                        }
                    }
                }
                Ok::<_, ExportError>(Some((bytes, streams)))
            };
            let status = match tokio::time::timeout(timeout, send).await {
                Ok(Ok(Some((bytes, streams)))) => {
                    outcome("ok");
                    histogram!(m::SIBLING_EXPORT_SECONDS).record(started.elapsed().as_secs_f64());
                    tracing::info!(
                        caller,
                        streams,
                        bytes,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "index exported to a sibling"
                    );
                    return;
                }
                Ok(Ok(None)) => {
                    outcome("cancelled");
                    tracing::warn!(caller, "sibling export cancelled by the caller");
                    return;
                }
                Ok(Err(e @ ExportError::TooLarge { .. })) => {
                    outcome("too_large");
                    Status::resource_exhausted(format!("{e} (sibling_export_max_bytes, or the caller's max_bytes)"))
                }
                Ok(Err(e)) => {
                    outcome("error");
                    Status::internal(e.to_string())
                }
                Err(_) => {
                    outcome("deadline");
                    Status::deadline_exceeded(format!(
                        "the export took longer than {timeout:?} (sibling_export_timeout_ms)"
                    ))
                }
            };
            tracing::warn!(caller, error = %status.message(), "sibling export failed");
            let _ = tx.send(Err(status)).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn pod_digests(
        &self,
        _request: Request<pb::PodDigestsRequest>,
    ) -> Result<Response<pb::PodDigestsResponse>, Status> {
        let pods = crate::persist::sibling_check::own_digests(&self.index);
        Ok(Response::new(pb::PodDigestsResponse { instance: self.instance, pods, block_size: self.block_size as u32 }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_export_per_caller_and_a_bound_on_all() {
        let running = Arc::default();
        let a = claim(&running, 2, "10.0.0.1").unwrap();
        let again = claim(&running, 2, "10.0.0.1").err().unwrap();
        assert_eq!(again.code(), tonic::Code::ResourceExhausted);
        assert!(again.message().contains("already running"), "{}", again.message());
        let _b = claim(&running, 2, "10.0.0.2").unwrap();
        let full = claim(&running, 2, "10.0.0.3").err().unwrap();
        assert!(full.message().contains("sibling_export_max_concurrent"), "{}", full.message());
        drop(a);
        let _a = claim(&running, 2, "10.0.0.1").expect("given back when its export ends");
        assert_eq!(running.lock().len(), 2);
    }
}
