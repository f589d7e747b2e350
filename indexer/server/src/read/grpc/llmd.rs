//! gRPC: llm-d's prompt-based scoring contract, `indexer.v1.IndexerService/GetPodScores`.
//!
//! An EPP written against llm-d's example service sends text, not token ids, so this service
//! tokenizes first ([`PromptTokenizer`]), then scores exactly like `ScoreTokens` ([`Scorer`]).
//!
//! The score is llm-d's convention before the EPP normalizes it: the pod's tier-weighted
//! matched blocks (GPU 1.0, CPU 0.8 by default), not divided by the prompt's block count.
//!
//! A request goes through the same [`Admission`] as ScoreTokens: with an in-process tokenizer
//! before tokenizing (that is CPU here too), counting the prompt's bytes (at least its tokens);
//! with a remote one after, counting its tokens.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};

use kvindex_proto::indexer::v1 as llmd;
use kvindex_proto::kvindex::v1 as pb;
use llmd::indexer_service_server::{IndexerService as LlmdIndexer, IndexerServiceServer};

use super::admission::Admission;
use super::score::Scorer;
use super::tokenizer::PromptTokenizer;
use crate::telemetry as m;

/// Longest prompt accepted, in bytes (the token limit applies after tokenization too).
const MAX_PROMPT_BYTES: usize = 16 << 20;

pub struct LlmdScores {
    scorer: Arc<Scorer>,
    tokenizer: Option<PromptTokenizer>,
    admission: Arc<Admission>,
}

impl LlmdScores {
    pub fn new(scorer: Arc<Scorer>, tokenizer: Option<PromptTokenizer>, admission: Arc<Admission>) -> Self {
        LlmdScores { scorer, tokenizer, admission }
    }

    pub fn into_server(self) -> IndexerServiceServer<Self> {
        IndexerServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl LlmdIndexer for LlmdScores {
    async fn get_pod_scores(
        &self,
        request: Request<llmd::GetPodScoresRequest>,
    ) -> Result<Response<llmd::GetPodScoresResponse>, Status> {
        let start = Instant::now();
        let req = request.into_inner();
        let result = async {
            if req.model_name.is_empty() {
                return Err(Status::invalid_argument("model_name is required"));
            }
            if req.prompt.len() > MAX_PROMPT_BYTES {
                return Err(Status::invalid_argument(format!("prompt is longer than {MAX_PROMPT_BYTES} bytes")));
            }
            let tokenizer = self.tokenizer.as_ref().ok_or_else(|| {
                Status::failed_precondition(
                    "no tokenizer configured: start kvindex serve with --tokenizer-model, --tokenizer-models-dir or --tokenizer-endpoint",
                )
            })?;
            // In process, tokenizing is ours to bound too: a byte-level tokenizer makes at most
            // one token per byte, plus BOS.
            let early = if matches!(tokenizer, PromptTokenizer::Local(_)) {
                Some(self.admission.admit("GetPodScores", req.prompt.len() + 1).await?)
            } else {
                None
            };
            let token_ids = tokenizer.tokenize(&req.model_name, &req.prompt).await?;
            let score = pb::ScoreTokensRequest {
                model: req.model_name.clone(),
                token_ids,
                pods: req.pod_identifiers.clone(),
                lora_name: String::new(),
                cache_salt: String::new(),
            };
            self.scorer.check(&score)?;
            let admitted = match early {
                Some(admitted) => admitted,
                None => self.admission.admit("GetPodScores", score.token_ids.len()).await?,
            };
            let scorer = self.scorer.clone();
            let scored = admitted.run(move || scorer.score(&score)).await??;
            let scores =
                scored.scores.into_iter().map(|s| llmd::PodScore { pod: s.pod, score: s.weighted_score }).collect();
            Ok(llmd::GetPodScoresResponse { scores })
        }
        .await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::counter!(m::GET_POD_SCORES_REQUESTS, "outcome" => outcome).increment(1);
        metrics::histogram!(m::GET_POD_SCORES_SECONDS).record(start.elapsed().as_secs_f64());
        result.map(Response::new)
    }
}
