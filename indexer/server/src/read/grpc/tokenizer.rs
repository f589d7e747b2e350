//! Where GetPodScores prompts are tokenized: in process through the `kvindex-tokenizer` library
//! (models from local directories), or by a running `kvindex-tokenizer` (or llm-d's sidecar)
//! over `tokenization.TokenizationService`. Either way as vLLM does for a completion prompt
//! (BOS per the model's tokenizer config).

use std::sync::Arc;

use tonic::transport::Channel;
use tonic::Status;

use kvindex_proto::tokenization as tok;
use kvindex_tokenizer::{RegistryConfig, TokenizerRegistry};
use tok::tokenization_service_client::TokenizationServiceClient;

use crate::config::Config;
use crate::error::ServerError;

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
    pub fn from_config(config: &Config) -> Result<Option<Self>, ServerError> {
        if !config.tokenizer_models.is_empty() || config.tokenizer_models_dir.is_some() {
            return Self::local(&config.tokenizer_models, config.tokenizer_models_dir.as_deref()).map(Some);
        }
        config.tokenizer_endpoint.as_deref().map(Self::remote).transpose()
    }

    /// In-process tokenizers for `name=dir` specs and every model directory under `models_dir`.
    pub fn local(models: &[String], models_dir: Option<&str>) -> Result<Self, ServerError> {
        let error = |key, e: &dyn std::fmt::Display| ServerError::Tokenizer { key, message: e.to_string() };
        let mut config = RegistryConfig::default();
        for spec in models {
            config.add_model_spec(spec).map_err(|e| error("tokenizer_models", &e))?;
        }
        if let Some(dir) = models_dir {
            config.add_models_dir(dir).map_err(|e| error("tokenizer_models_dir", &e))?;
        }
        Ok(PromptTokenizer::Local(Arc::new(TokenizerRegistry::new(config))))
    }

    /// A remote tokenizer at `endpoint` (`http://host:port`); connects lazily.
    pub fn remote(endpoint: &str) -> Result<Self, ServerError> {
        let channel = Channel::from_shared(endpoint.to_string())
            .map_err(|e| ServerError::Tokenizer { key: "tokenizer_endpoint", message: e.to_string() })?
            .connect_lazy();
        Ok(PromptTokenizer::Remote(TokenizationServiceClient::new(channel)))
    }

    pub async fn tokenize(&self, model: &str, prompt: &str) -> Result<Vec<u32>, Status> {
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
