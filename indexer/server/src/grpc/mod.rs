//! gRPC: `kvindex.v1.Indexer` (ScoreTokens, RegisterPod, UnregisterPod), llm-d's
//! `indexer.v1.IndexerService` (see `llmd`), `grpc.health.v1` and server reflection (so
//! `grpcurl` works without the proto file).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};

use kvindex::sequencer::SourceState;
use kvindex::index::tiers::TierId;
use kvindex::ScoreQuery;
use kvindex_proto::kvindex::v1 as pb;
use pb::indexer_server::{Indexer, IndexerServer};

use super::config::PodConfig;
use super::metrics as m;
use super::{registry, Shared};

/// Longest pod id or name accepted in a request.
const MAX_NAME: usize = 1024;
/// Most pods in a ScoreTokens filter.
const MAX_FILTER: usize = 65_536;

pub struct IndexerService {
    shared: Arc<Shared>,
}

/// The wire enum for a source state: REPLAYING and CONNECTING may lag the engine, so they are
/// flagged like STALE.
pub fn wire_state(state: Option<SourceState>) -> pb::SourceState {
    match state {
        Some(SourceState::Exact) => pb::SourceState::Exact,
        Some(SourceState::Degraded) => pb::SourceState::Degraded,
        Some(SourceState::Stale | SourceState::Replaying | SourceState::Connecting) => pb::SourceState::Stale,
        None => pb::SourceState::Unspecified,
    }
}

fn invalid(msg: String) -> Status {
    metrics::counter!(m::SCORE_REQUESTS, "outcome" => "invalid").increment(1);
    Status::invalid_argument(msg)
}

fn check_name(field: &str, v: &str) -> Result<(), Status> {
    if v.len() > MAX_NAME {
        return Err(Status::invalid_argument(format!("{field} is longer than {MAX_NAME} bytes")));
    }
    Ok(())
}

impl IndexerService {
    pub fn new(shared: Arc<Shared>) -> Self {
        IndexerService { shared }
    }

    pub fn score(&self, req: &pb::ScoreTokensRequest) -> Result<pb::ScoreTokensResponse, Status> {
        let max_tokens = self.shared.config.max_tokens;
        if req.token_ids.len() > max_tokens {
            return Err(invalid(format!("token_ids has {} tokens, more than max_tokens = {max_tokens}", req.token_ids.len())));
        }
        if req.pods.len() > MAX_FILTER {
            return Err(invalid(format!("pods has {} entries, more than {MAX_FILTER}", req.pods.len())));
        }
        for (field, v) in [("model", &req.model), ("lora_name", &req.lora_name), ("cache_salt", &req.cache_salt)] {
            check_name(field, v).map_err(|s| invalid(s.message().to_string()))?;
        }
        if req.pods.iter().any(|p| p.is_empty() || p.len() > MAX_NAME) {
            return Err(invalid("pods entries must be non-empty pod ids".to_string()));
        }
        let index = &self.shared.index;
        let filter: Option<Vec<&str>> = (!req.pods.is_empty()).then(|| req.pods.iter().map(String::as_str).collect());
        let result = index.score(&ScoreQuery {
            model: &req.model,
            lora_name: (!req.lora_name.is_empty()).then_some(req.lora_name.as_str()),
            cache_salt: (!req.cache_salt.is_empty()).then_some(req.cache_salt.as_str()),
            token_ids: &req.token_ids,
            pods: filter.as_deref(),
        });
        let states = self.shared.pod_states.read();
        let tiers = index.tiers();
        let mut by_name: HashMap<String, pb::PodScore> = HashMap::new();
        for mt in &result.matches {
            let Some(name) = index.pods().name(mt.pod) else { continue };
            let matched_by_tier = mt
                .by_tier
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (tiers.name(TierId(i as u8)), *n))
                .collect();
            by_name.insert(
                name.to_string(),
                pb::PodScore {
                    pod: name.to_string(),
                    matched_blocks: mt.matched_blocks,
                    weighted_score: mt.weighted_score,
                    matched_by_tier,
                    state: wire_state(states.get(&*name).copied()) as i32,
                },
            );
        }
        let scores = if req.pods.is_empty() {
            let mut v: Vec<pb::PodScore> = by_name.into_values().filter(|s| s.matched_blocks > 0).collect();
            v.sort_by(|a, b| b.matched_blocks.cmp(&a.matched_blocks).then_with(|| a.pod.cmp(&b.pod)));
            v
        } else {
            let mut seen = std::collections::HashSet::new();
            req.pods
                .iter()
                .filter(|p| seen.insert(p.as_str()))
                .map(|p| {
                    by_name.remove(p).unwrap_or_else(|| pb::PodScore {
                        pod: p.clone(),
                        matched_blocks: 0,
                        weighted_score: 0.0,
                        matched_by_tier: HashMap::new(),
                        state: wire_state(states.get(p.as_str()).copied()) as i32,
                    })
                })
                .collect()
        };
        Ok(pb::ScoreTokensResponse { scores, total_blocks: result.total_blocks, block_size: index.block_size() as u32 })
    }
}

#[tonic::async_trait]
impl Indexer for IndexerService {
    async fn score_tokens(&self, request: Request<pb::ScoreTokensRequest>) -> Result<Response<pb::ScoreTokensResponse>, Status> {
        let start = Instant::now();
        let resp = self.score(request.get_ref())?;
        metrics::histogram!(m::SCORE_LATENCY).record(start.elapsed().as_secs_f64());
        metrics::counter!(m::SCORE_REQUESTS, "outcome" => "ok").increment(1);
        Ok(Response::new(resp))
    }

    async fn register_pod(&self, request: Request<pb::RegisterPodRequest>) -> Result<Response<pb::RegisterPodResponse>, Status> {
        let r = request.into_inner();
        let cfg = PodConfig {
            id: r.pod,
            model: r.model,
            endpoint: (!r.endpoint.is_empty()).then_some(r.endpoint),
            replay_endpoint: (!r.replay_endpoint.is_empty()).then_some(r.replay_endpoint),
            topic_id: (!r.topic_id.is_empty()).then_some(r.topic_id),
            dp_size: 1,
        };
        registry::register(&self.shared, cfg, "grpc", false).await.map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(pb::RegisterPodResponse {}))
    }

    async fn unregister_pod(&self, request: Request<pb::UnregisterPodRequest>) -> Result<Response<pb::UnregisterPodResponse>, Status> {
        let pod = request.into_inner().pod;
        if pod.is_empty() {
            metrics::counter!(m::CONFIG_ERRORS, "source" => "grpc").increment(1);
            return Err(Status::invalid_argument("pod must not be empty"));
        }
        let existed = registry::unregister(&self.shared, &pod, "grpc").await;
        Ok(Response::new(pb::UnregisterPodResponse { existed }))
    }
}

/// Serves gRPC on `listener` until the process ends.
pub async fn serve(shared: Arc<Shared>, listener: tokio::net::TcpListener) -> Result<(), String> {
    let (health, health_service) = tonic_health::server::health_reporter();
    let max = shared.config.max_message_bytes;
    let tokenizer = super::llmd::PromptTokenizer::from_config(&shared.config)?;
    let scorer = Arc::new(IndexerService::new(shared));
    let svc = IndexerServer::from_arc(scorer.clone()).max_decoding_message_size(max);
    let llmd = super::llmd::LlmdScores::new(scorer, tokenizer).into_server().max_decoding_message_size(max);
    health.set_serving::<IndexerServer<IndexerService>>().await;
    health.set_serving::<kvindex_proto::indexer::v1::indexer_service_server::IndexerServiceServer<super::llmd::LlmdScores>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kvindex_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| e.to_string())?;
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(svc)
        .add_service(llmd)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)))
        .await
        .map_err(|e| e.to_string())
}
