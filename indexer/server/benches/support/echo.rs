//! The trivial ScoreTokens echo the benches serve beside `kvindex serve` (the floor of the
//! round trip): it decodes the request and answers a fixed reply of the real one's shape,
//! looking nothing up.

use kvindex_proto::kvindex::v1::indexer_server::Indexer;
use kvindex_proto::kvindex::v1::{
    InFlight, PodScore, RecordRouteRequest, RecordRouteResponse, RegisterPodRequest, RegisterPodResponse,
    ReleaseRouteRequest, ReleaseRouteResponse, ScoreTokensRequest, ScoreTokensResponse, SourceState,
    UnregisterPodRequest, UnregisterPodResponse,
};

/// The real reply's shape for a prompt of `blocks` blocks of `block_size` tokens: 4 pods, every
/// block matched, and no request reserved (reservations are on by default, so the real reply
/// carries an empty `in_flight`).
pub fn reply(blocks: u32, block_size: u32) -> ScoreTokensResponse {
    let scores = (0..4)
        .map(|p| PodScore {
            pod: format!("holder-{p}:8000"),
            matched_blocks: blocks,
            weighted_score: blocks as f64,
            state: SourceState::Exact as i32,
            ..Default::default()
        })
        .collect();
    ScoreTokensResponse { scores, total_blocks: blocks, block_size, in_flight: Some(InFlight::default()) }
}

/// Answers every ScoreTokens with `reply`; every other call is UNIMPLEMENTED.
pub struct Echo {
    pub reply: ScoreTokensResponse,
}

#[tonic::async_trait]
impl Indexer for Echo {
    async fn score_tokens(
        &self,
        request: tonic::Request<ScoreTokensRequest>,
    ) -> Result<tonic::Response<ScoreTokensResponse>, tonic::Status> {
        std::hint::black_box(request.get_ref().token_ids.len());
        Ok(tonic::Response::new(self.reply.clone()))
    }

    async fn register_pod(
        &self,
        _: tonic::Request<RegisterPodRequest>,
    ) -> Result<tonic::Response<RegisterPodResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("echo"))
    }

    async fn unregister_pod(
        &self,
        _: tonic::Request<UnregisterPodRequest>,
    ) -> Result<tonic::Response<UnregisterPodResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("echo"))
    }

    async fn record_route(
        &self,
        _: tonic::Request<RecordRouteRequest>,
    ) -> Result<tonic::Response<RecordRouteResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("echo"))
    }

    async fn release_route(
        &self,
        _: tonic::Request<ReleaseRouteRequest>,
    ) -> Result<tonic::Response<ReleaseRouteResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("echo"))
    }
}
