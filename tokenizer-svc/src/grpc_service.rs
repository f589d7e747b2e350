//! llm-d's `tokenization.TokenizationService` over the registry. Thin: convert, run the CPU
//! work off the async runtime, count the outcome, and report failures the way llm-d's contract
//! does (`success = false` + `error_message`), never with prompt text in logs. One exception:
//! a `chat_template` sent while client templates are off is `INVALID_ARGUMENT`, a request for
//! something this server does not do rather than a render that failed.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvindex_proto::tokenization as pb;
use kvindex_proto::tokenization::tokenization_service_server::TokenizationService;
use tonic::{Request, Response, Status};

use crate::client_template::Rejection;
use crate::error::TokenizerError;
use crate::proto_convert::{chat_completion_request, chat_template_request};
use crate::registry::TokenizerRegistry;

/// The gRPC service; wrap it in `TokenizationServiceServer::new`.
#[derive(Debug, Clone)]
pub struct TokenizationGrpc {
    registry: Arc<TokenizerRegistry>,
    request_ids: Arc<AtomicU64>,
}

impl TokenizationGrpc {
    pub fn new(registry: Arc<TokenizerRegistry>) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self { registry, request_ids: Arc::new(AtomicU64::new(seed)) }
    }

    fn next_request_id(&self) -> String {
        format!("kvtok-{:016x}", self.request_ids.fetch_add(1, Ordering::Relaxed))
    }

    /// Runs `work` on the blocking pool and records `kvindex_tokenizer_requests_total` and
    /// `kvindex_tokenizer_request_duration_seconds` for `method`.
    async fn run<T, F>(&self, method: &'static str, model: &str, work: F) -> Result<Result<T, TokenizerError>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&TokenizerRegistry) -> Result<T, TokenizerError> + Send + 'static,
    {
        let started = Instant::now();
        let registry = self.registry.clone();
        let result = tokio::task::spawn_blocking(move || work(&registry))
            .await
            .map_err(|_| Status::internal("tokenizer worker failed"))?;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.kind(),
        };
        metrics::counter!("kvindex_tokenizer_requests_total", "method" => method, "outcome" => outcome).increment(1);
        metrics::histogram!("kvindex_tokenizer_request_duration_seconds", "method" => method)
            .record(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            // Only the log-safe summary: a template's own message may quote the prompt.
            tracing::warn!(method, model = %crate::echo(model), error = %e.log_summary(), "request failed");
        }
        if let Err(e @ TokenizerError::ClientTemplateRejected { reason: Rejection::Disabled, .. }) = &result {
            // A request for something this server does not do at all, not a failed render.
            return Err(Status::invalid_argument(e.to_string()));
        }
        Ok(result)
    }
}

#[tonic::async_trait]
impl TokenizationService for TokenizationGrpc {
    async fn tokenize(&self, request: Request<pb::TokenizeRequest>) -> Result<Response<pb::TokenizeResponse>, Status> {
        let req = request.into_inner();
        let model = req.model_name.clone();
        let result = self
            .run("Tokenize", &model, move |r| r.tokenize(&req.model_name, &req.input, req.add_special_tokens))
            .await?;
        Ok(Response::new(match result {
            Ok(t) => pb::TokenizeResponse {
                offset_pairs: t.offsets.iter().flat_map(|&(s, e)| [s, e]).collect(),
                input_ids: t.ids,
                success: true,
                error_message: String::new(),
            },
            Err(e) => pb::TokenizeResponse { success: false, error_message: e.to_string(), ..Default::default() },
        }))
    }

    async fn render_chat_template(
        &self,
        request: Request<pb::ChatTemplateRequest>,
    ) -> Result<Response<pb::ChatTemplateResponse>, Status> {
        let req = request.into_inner();
        let model = req.model_name.clone();
        let result = self
            .run("RenderChatTemplate", &model, move |r| {
                r.render_chat_text(&req.model_name, &chat_template_request(&req))
            })
            .await?;
        Ok(Response::new(match result {
            Ok(rendered_prompt) => {
                pb::ChatTemplateResponse { rendered_prompt, success: true, error_message: String::new() }
            }
            Err(e) => pb::ChatTemplateResponse { success: false, error_message: e.to_string(), ..Default::default() },
        }))
    }

    async fn initialize_tokenizer(
        &self,
        request: Request<pb::InitializeTokenizerRequest>,
    ) -> Result<Response<pb::InitializeTokenizerResponse>, Status> {
        let req = request.into_inner();
        let model = req.model_name.clone();
        let result = self.run("InitializeTokenizer", &model, move |r| r.initialize(&req.model_name)).await?;
        Ok(Response::new(match result {
            Ok(()) => pb::InitializeTokenizerResponse { success: true, error_message: String::new() },
            Err(e) => pb::InitializeTokenizerResponse { success: false, error_message: e.to_string() },
        }))
    }

    async fn render_chat_completion(
        &self,
        request: Request<pb::RenderChatCompletionRequest>,
    ) -> Result<Response<pb::RenderChatCompletionResponse>, Status> {
        let req = request.into_inner();
        let model = req.model_name.clone();
        let result = self
            .run("RenderChatCompletion", &model, move |r| {
                let chat = chat_completion_request(&req)?;
                r.render_chat(&req.model_name, &chat)
            })
            .await?;
        let request_id = self.next_request_id();
        Ok(Response::new(match result {
            Ok(token_ids) => pb::RenderChatCompletionResponse {
                request_id,
                token_ids,
                features: None,
                success: true,
                error_message: String::new(),
            },
            Err(e) => pb::RenderChatCompletionResponse {
                request_id,
                success: false,
                error_message: e.to_string(),
                ..Default::default()
            },
        }))
    }

    async fn render_completion(
        &self,
        request: Request<pb::RenderCompletionRequest>,
    ) -> Result<Response<pb::RenderCompletionResponse>, Status> {
        let req = request.into_inner();
        let model = req.model_name.clone();
        let result =
            self.run("RenderCompletion", &model, move |r| r.render_completion(&req.model_name, &req.prompt)).await?;
        let request_id = self.next_request_id();
        Ok(Response::new(match result {
            Ok(token_ids) => {
                pb::RenderCompletionResponse { request_id, token_ids, success: true, error_message: String::new() }
            }
            Err(e) => pb::RenderCompletionResponse {
                request_id,
                success: false,
                error_message: e.to_string(),
                ..Default::default()
            },
        }))
    }
}
