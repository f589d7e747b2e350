//! gRPC: llm-d's prompt-based scoring contract, `indexer.v1.IndexerService/GetPodScores`.
//!
//! An EPP written against llm-d's example service sends text, not token ids, so this service
//! tokenizes first, the way vLLM does for a completion prompt (BOS per the model's tokenizer
//! config), then scores exactly like `ScoreTokens`. Tokenization runs in process through the
//! `kvindex-tokenizer` library (models from local directories), or through a running
//! `kvindex-tokenizer` (or llm-d's sidecar) over `tokenization.TokenizationService`.
//!
//! The score is llm-d's convention before the EPP normalizes it: the pod's tier-weighted
//! matched blocks (GPU 1.0, CPU 0.8 by default), not divided by the prompt's block count.

use std::sync::Arc;
use std::time::Instant;

use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use kvindex_proto::indexer::v1 as llmd;
use kvindex_proto::kvindex::v1 as pb;
use kvindex_proto::tokenization as tok;
use kvindex_tokenizer::{RegistryConfig, TokenizerRegistry};
use llmd::indexer_service_server::{IndexerService as LlmdIndexer, IndexerServiceServer};
use tok::tokenization_service_client::TokenizationServiceClient;

use super::grpc::IndexerService;
use super::metrics as m;

/// Longest prompt accepted, in bytes (the token limit applies after tokenization too).
const MAX_PROMPT_BYTES: usize = 16 << 20;

/// Where prompts are tokenized.
#[derive(Clone)]
pub enum PromptTokenizer {
    /// In process, from local model directories.
    Local(Arc<TokenizerRegistry>),
    /// A tokenizer service (ours or llm-d's sidecar) over gRPC.
    Remote(TokenizationServiceClient<Channel>),
}

impl PromptTokenizer {
    /// In process when tokenizer models are configured, else remote when an endpoint is,
    /// else none (GetPodScores then answers FAILED_PRECONDITION).
    pub fn from_config(config: &super::config::Config) -> Result<Option<Self>, String> {
        if !config.tokenizer_models.is_empty() || config.tokenizer_models_dir.is_some() {
            return Self::local(&config.tokenizer_models, config.tokenizer_models_dir.as_deref()).map(Some);
        }
        config.tokenizer_endpoint.as_deref().map(Self::remote).transpose()
    }

    /// In-process tokenizers for `name=dir` specs and every model directory under `models_dir`.
    pub fn local(models: &[String], models_dir: Option<&str>) -> Result<Self, String> {
        let mut config = RegistryConfig::default();
        for spec in models {
            config.add_model_spec(spec).map_err(|e| format!("tokenizer_models: {e}"))?;
        }
        if let Some(dir) = models_dir {
            config.add_models_dir(dir).map_err(|e| format!("tokenizer_models_dir: {e}"))?;
        }
        Ok(PromptTokenizer::Local(Arc::new(TokenizerRegistry::new(config))))
    }

    /// A remote tokenizer at `endpoint` (`http://host:port`); connects lazily.
    pub fn remote(endpoint: &str) -> Result<Self, String> {
        let channel =
            Channel::from_shared(endpoint.to_string()).map_err(|e| format!("tokenizer_endpoint: {e}"))?.connect_lazy();
        Ok(PromptTokenizer::Remote(TokenizationServiceClient::new(channel)))
    }

    async fn tokenize(&self, model: &str, prompt: &str) -> Result<Vec<u32>, Status> {
        match self {
            PromptTokenizer::Local(registry) => {
                let (registry, model, prompt) = (registry.clone(), model.to_string(), prompt.to_string());
                tokio::task::spawn_blocking(move || registry.render_completion(&model, &prompt))
                    .await
                    .map_err(|_| Status::internal("tokenizer task failed"))?
                    .map_err(|e| Status::invalid_argument(format!("tokenizing the prompt: {e}")))
            }
            PromptTokenizer::Remote(client) => {
                let request =
                    tok::RenderCompletionRequest { model_name: model.to_string(), prompt: prompt.to_string() };
                let reply = client.clone().render_completion(request).await?.into_inner();
                if !reply.success {
                    return Err(Status::invalid_argument(format!("tokenizing the prompt: {}", reply.error_message)));
                }
                Ok(reply.token_ids)
            }
        }
    }
}

pub struct LlmdScores {
    scorer: Arc<IndexerService>,
    tokenizer: Option<PromptTokenizer>,
}

impl LlmdScores {
    pub fn new(scorer: Arc<IndexerService>, tokenizer: Option<PromptTokenizer>) -> Self {
        LlmdScores { scorer, tokenizer }
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
            let token_ids = tokenizer.tokenize(&req.model_name, &req.prompt).await?;
            let scored = self.scorer.score(&pb::ScoreTokensRequest {
                model: req.model_name.clone(),
                token_ids,
                pods: req.pod_identifiers.clone(),
                lora_name: String::new(),
                cache_salt: String::new(),
            })?;
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
