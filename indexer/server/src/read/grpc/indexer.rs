//! `kvindex.v1.Indexer`: ScoreTokens (the read plane, with the routers' reserved in-flight load),
//! RecordRoute and ReleaseRoute (which steer placement, so they take the control plane's token)
//! and pod registration (RegisterPod, UnregisterPod), which
//! only answers a bearer token ([`crate::pods::auth`]). ScoreTokens and RecordRoute go through the
//! [`Admission`] of large requests.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};

use kvindex_proto::kvindex::v1 as pb;
use pb::indexer_server::Indexer;

use super::admission::Admission;
use super::in_flight::InFlightLoad;
use super::score::Scorer;
use super::{record_route, release_route};
use crate::config::pod::PodConfig;
use crate::index_handle::IndexHandle;
use crate::pods::auth::{ControlPlane, Denied};
use crate::pods::lifecycle::Pods;
use crate::telemetry as m;

/// The handler of `kvindex.v1.Indexer`: the handles it uses, no more.
pub struct IndexerService {
    pub index: IndexHandle,
    pub pods: Pods,
    pub control: ControlPlane,
    pub scorer: Arc<Scorer>,
    pub admission: Arc<Admission>,
    /// RecordRoute's reservations: the routers' shared in-flight load.
    pub in_flight: Arc<InFlightLoad>,
}

fn authorization<T>(request: &Request<T>) -> Option<&str> {
    request.metadata().get("authorization").and_then(|v| v.to_str().ok())
}

/// The control plane's gate: PERMISSION_DENIED while registration is disabled,
/// UNAUTHENTICATED without the right bearer token (`authorization` metadata).
pub(super) fn authorize<T>(control: &ControlPlane, request: &Request<T>) -> Result<(), Status> {
    control.authorize("grpc", authorization(request)).map_err(|denied| match denied {
        Denied::Disabled => Status::permission_denied(denied.to_string()),
        _ => Status::unauthenticated(denied.to_string()),
    })
}

#[tonic::async_trait]
impl Indexer for IndexerService {
    async fn score_tokens(
        &self,
        request: Request<pb::ScoreTokensRequest>,
    ) -> Result<Response<pb::ScoreTokensResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        self.scorer.check(&req)?;
        let admitted = self.admission.admit("ScoreTokens", req.token_ids.len()).await?;
        let in_flight = self.in_flight.answer(&req.pods);
        let scorer = self.scorer.clone();
        let mut resp = admitted.run(move || scorer.score(&req)).await??;
        resp.in_flight = in_flight;
        metrics::histogram!(m::SCORE_LATENCY).record(start.elapsed().as_secs_f64());
        metrics::counter!(m::SCORE_REQUESTS, "outcome" => "ok").increment(1);
        Ok(Response::new(resp))
    }

    async fn record_route(
        &self,
        request: Request<pb::RecordRouteRequest>,
    ) -> Result<Response<pb::RecordRouteResponse>, Status> {
        let caller = record_route::caller_of(request.remote_addr());
        record_route::authorize(&self.control, authorization(&request), &caller)?;
        let req = request.into_inner();
        let max_tokens = self.scorer.max_tokens();
        record_route::check_request(&self.index, &self.in_flight, max_tokens, &req)?;
        // Reservations first: cheap, and before any wait for a slot, so that a release sent
        // right after this call rarely overtakes them.
        let (reserved, reservation_ttl_ms) = self.in_flight.reserve(&caller, &req.reservations);
        if !record_route::wants_credit(&req) {
            metrics::counter!(m::RECORD_ROUTE_REQUESTS, "outcome" => "ok").increment(1);
            return Ok(Response::new(pb::RecordRouteResponse { reserved, reservation_ttl_ms, ..Default::default() }));
        }
        let with_reservations = !req.reservations.is_empty();
        let credited = async {
            let admitted = self.admission.admit("RecordRoute", req.token_ids.len()).await?;
            let index = self.index.clone();
            admitted.run(move || record_route::record_route(&index, max_tokens, &req, &caller)).await?
        };
        match credited.await {
            Ok(answer) => Ok(Response::new(pb::RecordRouteResponse { reserved, reservation_ttl_ms, ..answer })),
            // The reservations were taken: the credit's refusal (counted) does not undo them.
            Err(_) if with_reservations => {
                Ok(Response::new(pb::RecordRouteResponse { reserved, reservation_ttl_ms, ..Default::default() }))
            }
            Err(status) => Err(status),
        }
    }

    async fn release_route(
        &self,
        request: Request<pb::ReleaseRouteRequest>,
    ) -> Result<Response<pb::ReleaseRouteResponse>, Status> {
        let caller = record_route::caller_of(request.remote_addr());
        release_route::authorize(&self.control, authorization(&request), &caller)?;
        release_route::release(&self.in_flight, &caller, &request.into_inner()).map(Response::new)
    }

    async fn register_pod(
        &self,
        request: Request<pb::RegisterPodRequest>,
    ) -> Result<Response<pb::RegisterPodResponse>, Status> {
        authorize(&self.control, &request)?;
        let r = request.into_inner();
        self.pods.may_change("grpc", &r.pod).map_err(|e| Status::failed_precondition(e.to_string()))?;
        let mut cfg = match pod_config(r) {
            Ok(cfg) => cfg,
            Err(invalid) => {
                metrics::counter!(m::CONFIG_ERRORS, "source" => "grpc").increment(1);
                return Err(Status::invalid_argument(invalid.to_string()));
            }
        };
        self.control.pin_endpoints("grpc", &mut cfg).await.map_err(|e| Status::permission_denied(e.to_string()))?;
        self.pods.register(cfg, "grpc", false).await.map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(pb::RegisterPodResponse {}))
    }

    async fn unregister_pod(
        &self,
        request: Request<pb::UnregisterPodRequest>,
    ) -> Result<Response<pb::UnregisterPodResponse>, Status> {
        authorize(&self.control, &request)?;
        let pod = request.into_inner().pod;
        self.pods.may_change("grpc", &pod).map_err(|e| Status::failed_precondition(e.to_string()))?;
        if pod.is_empty() {
            metrics::counter!(m::CONFIG_ERRORS, "source" => "grpc").increment(1);
            return Err(Status::invalid_argument("pod must not be empty"));
        }
        let existed = self.pods.unregister(&pod, "grpc").await;
        Ok(Response::new(pb::UnregisterPodResponse { existed }))
    }
}

/// A `RegisterPod` field that does not parse (INVALID_ARGUMENT, counted as a config error).
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidField {
    pub field: &'static str,
    pub message: String,
}

/// A `RegisterPod` request as a pod entry; a field that does not parse is named in the error
/// (the ranges are checked with every other origin's, by the registration).
fn pod_config(r: pb::RegisterPodRequest) -> Result<PodConfig, InvalidField> {
    fn field<T: std::str::FromStr<Err: std::fmt::Display>>(
        field: &'static str,
        v: &str,
    ) -> Result<Option<T>, InvalidField> {
        (!v.is_empty()).then(|| v.parse().map_err(|e| InvalidField { field, message: format!("{e}") })).transpose()
    }
    Ok(PodConfig {
        engine: field::<kvindex::wire::Engine>("engine", &r.engine)?,
        sglang_release: field("sglang_release", &r.sglang_release)?,
        sglang_event_format: field("sglang_event_format", &r.sglang_event_format)?,
        page_size: r.page_size,
        id: r.pod,
        model: r.model,
        endpoint: (!r.endpoint.is_empty()).then_some(r.endpoint),
        replay_endpoint: (!r.replay_endpoint.is_empty()).then_some(r.replay_endpoint),
        topic_id: (!r.topic_id.is_empty()).then_some(r.topic_id),
        dp_size: 1,
        eagle: r.eagle.unwrap_or(false),
        context_parallel: r.context_parallel.unwrap_or(1),
    })
}
