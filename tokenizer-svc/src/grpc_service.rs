//! llm-d's `tokenization.TokenizationService` over the registry. Thin: convert, run the CPU
//! work off the async runtime, count the outcome, and report failures the way llm-d's contract
//! does (`success = false` + `error_message`), never with prompt text in logs. One exception:
//! a `chat_template` sent while client templates are off is `INVALID_ARGUMENT`, a request for
//! something this server does not do rather than a render that failed.
//!
//! One extension outside llm-d's messages: a `RenderCompletion` or `RenderChatCompletion` call
//! may carry a token limit in the metadata [`MAX_TOKENS_METADATA`] (the router sends its
//! `--max-prompt-tokens`). Tokenizing then stops at the first cut point past the limit, as the
//! router's in-process tokenizer does, and a prompt over it is answered `OUT_OF_RANGE` with the
//! tokens counted in [`COUNTED_METADATA`], so a huge prompt is never tokenized whole for a
//! caller that will refuse it anyway. Callers that send no limit (llm-d) see no change.
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
use crate::tokenized::{Bounded, TokenizedText};

/// Request metadata: most tokens the caller accepts for the prompt (decimal).
pub const MAX_TOKENS_METADATA: &str = "x-kvindex-max-tokens";

/// Metadata of an `OUT_OF_RANGE` answer: tokens counted before tokenizing stopped (decimal,
/// more than the limit).
pub const COUNTED_METADATA: &str = "x-kvindex-tokens-counted";

/// The caller's token limit, when it sent one that parses.
fn max_tokens(metadata: &tonic::metadata::MetadataMap) -> Option<usize> {
    metadata.get(MAX_TOKENS_METADATA)?.to_str().ok()?.trim().parse().ok()
}

/// Ids within the caller's limit, or `OUT_OF_RANGE` with what was counted.
fn within_limit(bounded: Bounded, limit: Option<usize>) -> Result<Vec<u32>, Status> {
    match bounded {
        Bounded::Ids(ids) => Ok(ids),
        Bounded::OverLimit { counted } => {
            let max = limit.unwrap_or_default();
            let mut status = Status::out_of_range(format!(
                "the prompt has more than {max} tokens ({counted} counted before tokenization stopped)"
            ));
            if let Ok(value) = counted.to_string().parse() {
                status.metadata_mut().insert(COUNTED_METADATA, value);
            }
            Err(status)
        }
    }
}

/// The `outcome` label of a successful call.
trait Outcome {
    fn outcome(&self) -> &'static str {
        "ok"
    }
}

impl Outcome for TokenizedText {}
impl Outcome for String {}
impl Outcome for () {}

impl Outcome for Bounded {
    fn outcome(&self) -> &'static str {
        match self {
            Bounded::Ids(_) => "ok",
            Bounded::OverLimit { .. } => "over_limit",
        }
    }
}

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
        T: Outcome + Send + 'static,
        F: FnOnce(&TokenizerRegistry) -> Result<T, TokenizerError> + Send + 'static,
    {
        let started = Instant::now();
        let registry = self.registry.clone();
        let result = tokio::task::spawn_blocking(move || work(&registry))
            .await
            .map_err(|_| Status::internal("tokenizer worker failed"))?;
        let outcome = match &result {
            Ok(done) => done.outcome(),
            Err(e) => e.kind(),
        };
        metrics::counter!(crate::telemetry::REQUESTS, "method" => method, "outcome" => outcome).increment(1);
        metrics::histogram!(crate::telemetry::REQUEST_SECONDS, "method" => method)
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
        let limit = max_tokens(request.metadata());
        let req = request.into_inner();
        let model = req.model_name.clone();
        let result = self
            .run("RenderChatCompletion", &model, move |r| {
                let chat = chat_completion_request(&req)?;
                match limit {
                    Some(limit) => r.render_chat_within(&req.model_name, &chat, limit),
                    None => r.render_chat(&req.model_name, &chat).map(Bounded::Ids),
                }
            })
            .await?;
        let result = match result {
            Ok(bounded) => Ok(within_limit(bounded, limit)?),
            Err(e) => Err(e),
        };
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
        let limit = max_tokens(request.metadata());
        let req = request.into_inner();
        let model = req.model_name.clone();
        let result = self
            .run("RenderCompletion", &model, move |r| match limit {
                Some(limit) => r.render_completion_within(&req.model_name, &req.prompt, limit),
                None => r.render_completion(&req.model_name, &req.prompt).map(Bounded::Ids),
            })
            .await?;
        let result = match result {
            Ok(bounded) => Ok(within_limit(bounded, limit)?),
            Err(e) => Err(e),
        };
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
