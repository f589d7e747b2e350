//! Prompt → the token ids the engine will cache, exactly as vLLM computes them: in process
//! through the tokenizer-svc library (`TokenizerRegistry`, CPU work kept off the async
//! workers' task queues), or through a `kvindex-tokenizer` / llm-d tokenizer sidecar over gRPC.
//!
//! Tokens only steer placement, so a tokenizer that is missing or broken on our side places
//! the request by load (counted) instead of failing it; a prompt the template rejects, or a
//! model nobody serves, is the client's error.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use kvindex_proto::tokenization as tok;
use kvindex_tokenizer::{
    Bounded, ChatRequest, ClientTemplates, RegistryConfig, Sandbox, SandboxLimits, TokenizerRegistry,
};
use serde_json::Value;
use tok::tokenization_service_client::TokenizationServiceClient;
use tonic::transport::Channel;

use crate::error::StartError;
use crate::metrics as m;
use crate::place::request::Prompt;

/// The flag that allows client chat templates, named by their start errors.
const CLIENT_TEMPLATES: &str = "--allow-client-chat-template";

/// A remote tokenizer slower than this is treated as unavailable.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why the router has no token ids for a prompt (the request is then placed by load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// No tokenizer is configured for the model.
    NoTokenizer,
    /// The tokenizer failed on our side (model files, remote service down or slow).
    TokenizerFailed,
}

impl Unavailable {
    pub fn label(self) -> &'static str {
        match self {
            Unavailable::NoTokenizer => "no_tokenizer",
            Unavailable::TokenizerFailed => "tokenizer_failed",
        }
    }
}

/// A prompt the client must fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizeError {
    #[error("the model `{}` does not exist", crate::place::request::echo(.0))]
    UnknownModel(String),
    /// Template or request error; the message is the tokenizer's (it may quote the request,
    /// which goes back to its own sender only, never to logs).
    #[error("{0}")]
    Invalid(String),
    /// More tokens than the limit: `counted` (over it) were counted when tokenization stopped.
    #[error("the prompt has more than {max} tokens ({counted} counted before tokenization stopped)")]
    OverLimit { counted: usize, max: usize },
}

/// Where tokens come from, per model.
pub struct Tokenizers {
    local: Option<Arc<TokenizerRegistry>>,
    local_models: HashSet<String>,
    remote: Option<TokenizationServiceClient<Channel>>,
    /// Renders client-supplied chat templates for the in-process tokenizers, when allowed.
    sandbox: Option<Arc<Sandbox>>,
}

impl Tokenizers {
    /// `local`: `(model, dir)` pairs; `remote`: a tokenizer service `host:port`. Chat
    /// templates sent with requests are refused.
    pub fn new(local: &[(String, std::path::PathBuf)], remote: Option<&str>) -> Result<Tokenizers, StartError> {
        Self::with_client_templates(local, remote, None)
    }

    /// [`Tokenizers::new`], rendering chat templates sent with requests in a bounded child
    /// process (this executable, see `kvindex_tokenizer::client_template`) when `client_templates`
    /// gives the budgets.
    pub fn with_client_templates(
        local: &[(String, std::path::PathBuf)],
        remote: Option<&str>,
        client_templates: Option<SandboxLimits>,
    ) -> Result<Tokenizers, StartError> {
        let sandbox = match client_templates {
            Some(limits) => {
                Some(Sandbox::for_current_exe(limits).map_err(|e| StartError::setting(CLIENT_TEMPLATES, e))?)
            }
            None => None,
        };
        let registry = if local.is_empty() {
            None
        } else {
            let mut config = RegistryConfig::default();
            if let Some(sandbox) = &sandbox {
                config.client_templates = ClientTemplates::Sandboxed(sandbox.clone());
            }
            config.max_loaded_models = config.max_loaded_models.max(local.len());
            for (model, dir) in local {
                config.add_model(model, dir).map_err(|e| StartError::setting(format!("--tokenizer {model}"), e))?;
            }
            Some(Arc::new(TokenizerRegistry::new(config)))
        };
        let remote = match remote {
            None => None,
            Some(addr) => {
                let channel = Channel::from_shared(format!("http://{addr}"))
                    .map_err(|e| StartError::setting(format!("--tokenizer-endpoint {addr}"), e))?
                    .connect_lazy();
                Some(TokenizationServiceClient::new(channel))
            }
        };
        Ok(Tokenizers {
            local: registry,
            local_models: local.iter().map(|(m, _)| m.clone()).collect(),
            remote,
            sandbox,
        })
    }

    /// Kills the client template renders in flight and refuses new ones (at shutdown).
    pub fn shutdown(&self) {
        if let Some(sandbox) = &self.sandbox {
            sandbox.shutdown();
        }
    }

    /// The in-process registry, for preloading and its statistics.
    pub fn registry(&self) -> Option<&Arc<TokenizerRegistry>> {
        self.local.as_ref()
    }

    /// Copies the in-process tokenizer's prefix-cache statistics (incremental tokenization) into
    /// gauges, when `/metrics` is scraped: reading them is a few atomic loads.
    pub fn record_cache_metrics(&self) {
        let Some(registry) = self.registry() else { return };
        let stats = registry.prefix_cache_stats();
        for (result, n) in [("hit", stats.hits), ("miss", stats.misses), ("bypass", stats.bypassed)] {
            metrics::gauge!(m::TOKENIZER_CACHE_REQUESTS, "result" => result).set(n as f64);
        }
        metrics::gauge!(m::TOKENIZER_CACHE_BYTES, "kind" => "used").set(stats.bytes as f64);
        metrics::gauge!(m::TOKENIZER_CACHE_BYTES, "kind" => "capacity").set(stats.capacity_bytes as f64);
    }

    /// Loads every in-process tokenizer now rather than on the first request, and checks that
    /// client templates can be rendered when they are allowed.
    pub async fn preload(&self) -> Result<(), StartError> {
        if let Some(sandbox) = self.sandbox.clone() {
            tokio::task::spawn_blocking(move || sandbox.check())
                .await
                .map_err(|e| StartError::setting(CLIENT_TEMPLATES, e))?
                .map_err(|e| StartError::setting(CLIENT_TEMPLATES, e))?;
        }
        let Some(registry) = self.local.clone() else { return Ok(()) };
        let models: Vec<String> = self.local_models.iter().cloned().collect();
        tokio::task::spawn_blocking(move || {
            for model in models {
                registry.initialize(&model).map_err(|e| StartError::setting(format!("--tokenizer {model}"), e))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| StartError::setting("tokenizer preload", e))?
    }

    /// Token ids of `prompt` for `model`, or why there are none. More than `max_tokens` is
    /// [`TokenizeError::OverLimit`]; the in-process tokenizer stops counting soon past the limit
    /// (at the first cut point past it, see `kvindex_tokenizer::LoadedModel::ids_within`)
    /// instead of tokenizing the whole prompt first, and so does a `kvindex-tokenizer`, which is
    /// sent the limit (llm-d's sidecar ignores it and tokenizes the whole prompt; it is then
    /// refused here).
    pub async fn tokenize(
        &self,
        model: &str,
        prompt: &Prompt,
        max_tokens: usize,
    ) -> Result<Result<Vec<u32>, Unavailable>, TokenizeError> {
        let (place, result) = if let Prompt::Tokens(ids) = prompt {
            ("ids", Ok(Ok(ids.clone())))
        } else if let Some(registry) = self.local.as_ref().filter(|_| self.local_models.contains(model)) {
            ("local", local(registry, model, prompt, max_tokens).await)
        } else if let Some(client) = &self.remote {
            ("remote", remote(client.clone(), model, prompt, max_tokens).await)
        } else {
            ("none", Ok(Err(Unavailable::NoTokenizer)))
        };
        let result = match result {
            Ok(Ok(ids)) if ids.len() > max_tokens => {
                Err(TokenizeError::OverLimit { counted: ids.len(), max: max_tokens })
            }
            other => other,
        };
        let (outcome, counted) = match &result {
            Ok(Ok(ids)) => ("ok", ids.len()),
            Ok(Err(u)) => (u.label(), 0),
            Err(TokenizeError::UnknownModel(_)) => ("unknown_model", 0),
            Err(TokenizeError::Invalid(_)) => ("invalid", 0),
            Err(TokenizeError::OverLimit { counted, .. }) => ("over_limit", *counted),
        };
        metrics::counter!(m::TOKENIZE, "where" => place, "outcome" => outcome).increment(1);
        if place != "ids" {
            metrics::counter!(m::TOKENS_TOKENIZED, "where" => place).increment(counted as u64);
        }
        result
    }
}

/// What the in-process tokenizer makes of `prompt` (CPU work: render, then tokenize).
fn render(
    registry: &TokenizerRegistry,
    model: &str,
    prompt: &Prompt,
    max_tokens: usize,
) -> kvindex_tokenizer::Result<Bounded> {
    match prompt {
        Prompt::Text(text) => registry.render_completion_within(model, text, max_tokens),
        Prompt::Chat(chat) => registry.render_chat_within(model, chat, max_tokens),
        Prompt::Tokens(ids) => Ok(Bounded::Ids(ids.clone())),
    }
}

/// Runs [`render`] off the async workers' task queues. On a multi-thread runtime, in place
/// (`block_in_place`: this thread hands its other tasks to another and goes on with the
/// request), so the request waits neither for a blocking-pool thread to wake nor, after, for a
/// worker to wake and poll it again, and the prompt is not copied to move it there; on a
/// current-thread runtime (tests), on the blocking pool. A panic is a failed tokenizer either way.
async fn render_off_workers(
    registry: &Arc<TokenizerRegistry>,
    model: &str,
    prompt: &Prompt,
    max_tokens: usize,
) -> Option<kvindex_tokenizer::Result<Bounded>> {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|handle| handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        let in_place = || std::panic::catch_unwind(AssertUnwindSafe(|| render(registry, model, prompt, max_tokens)));
        tokio::task::block_in_place(in_place).ok()
    } else {
        let (registry, model, prompt) = (registry.clone(), model.to_string(), prompt.clone());
        tokio::task::spawn_blocking(move || render(&registry, &model, &prompt, max_tokens)).await.ok()
    }
}

async fn local(
    registry: &Arc<TokenizerRegistry>,
    model: &str,
    prompt: &Prompt,
    max_tokens: usize,
) -> Result<Result<Vec<u32>, Unavailable>, TokenizeError> {
    match render_off_workers(registry, model, prompt, max_tokens).await {
        None => Ok(Err(Unavailable::TokenizerFailed)),
        Some(Ok(Bounded::Ids(ids))) => Ok(Ok(ids)),
        Some(Ok(Bounded::OverLimit { counted })) => Err(TokenizeError::OverLimit { counted, max: max_tokens }),
        Some(Err(e)) if e.is_client_error() => Err(TokenizeError::Invalid(e.to_string())),
        Some(Err(e)) => {
            tracing::warn!(error = %e.log_summary(), "in-process tokenizer failed; placing by load");
            Ok(Err(Unavailable::TokenizerFailed))
        }
    }
}

/// A request to the tokenizer service, with its deadline and our token limit
/// (`kvindex_tokenizer::grpc_service::MAX_TOKENS_METADATA`).
fn remote_request<T>(message: T, max_tokens: usize) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(REMOTE_TIMEOUT);
    if let Ok(limit) = max_tokens.to_string().parse() {
        request.metadata_mut().insert(kvindex_tokenizer::grpc_service::MAX_TOKENS_METADATA, limit);
    }
    request
}

async fn remote(
    mut client: TokenizationServiceClient<Channel>,
    model: &str,
    prompt: &Prompt,
    max_tokens: usize,
) -> Result<Result<Vec<u32>, Unavailable>, TokenizeError> {
    let reply = match prompt {
        Prompt::Tokens(ids) => return Ok(Ok(ids.clone())),
        Prompt::Text(text) => {
            let message = tok::RenderCompletionRequest { model_name: model.to_string(), prompt: text.clone() };
            tokio::time::timeout(REMOTE_TIMEOUT, client.render_completion(remote_request(message, max_tokens)))
                .await
                .map(|r| r.map(|r| r.into_inner()).map(|r| (r.success, r.error_message, r.token_ids)))
        }
        Prompt::Chat(chat) => {
            let message = chat_request(model, chat);
            tokio::time::timeout(REMOTE_TIMEOUT, client.render_chat_completion(remote_request(message, max_tokens)))
                .await
                .map(|r| r.map(|r| r.into_inner()).map(|r| (r.success, r.error_message, r.token_ids)))
        }
    };
    match reply {
        // Over our limit: the service stopped tokenizing soon past it.
        Ok(Err(status)) if status.code() == tonic::Code::OutOfRange => {
            let counted = status
                .metadata()
                .get(kvindex_tokenizer::grpc_service::COUNTED_METADATA)
                .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
                .filter(|&counted| counted > max_tokens)
                .unwrap_or(max_tokens + 1);
            Err(TokenizeError::OverLimit { counted, max: max_tokens })
        }
        // The service refuses the request itself (e.g. it does not accept client templates).
        Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
            Err(TokenizeError::Invalid(status.message().to_string()))
        }
        Err(_) | Ok(Err(_)) => {
            tracing::warn!("remote tokenizer unavailable or slow; placing by load");
            Ok(Err(Unavailable::TokenizerFailed))
        }
        Ok(Ok((true, _, ids))) => Ok(Ok(ids)),
        Ok(Ok((false, message, _))) if message.starts_with("unknown model") => {
            Err(TokenizeError::UnknownModel(model.to_string()))
        }
        Ok(Ok((false, message, _))) => Err(TokenizeError::Invalid(message)),
    }
}

/// An OpenAI chat as llm-d's `RenderChatCompletionRequest`. The contract carries role, text
/// or content parts, tools and kwargs; other message keys (e.g. `tool_calls`) and documents
/// have no field there, so such chats may render differently from the engine (fewer matched
/// blocks, never false ones).
pub fn chat_request(model: &str, chat: &ChatRequest) -> tok::RenderChatCompletionRequest {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let messages = chat
        .messages
        .iter()
        .map(|message| {
            let role = text(message.get("role")).unwrap_or_default();
            match message.get("content") {
                Some(Value::Array(parts)) => tok::ChatMessage {
                    role,
                    content: None,
                    content_parts: parts
                        .iter()
                        .map(|part| tok::ContentPart {
                            r#type: text(part.get("type")).unwrap_or_default(),
                            text: text(part.get("text")),
                            image_url: part
                                .get("image_url")
                                .and_then(|u| text(u.get("url")))
                                .map(|url| tok::ImageUrl { url }),
                        })
                        .collect(),
                },
                content => tok::ChatMessage { role, content: text(content), content_parts: Vec::new() },
            }
        })
        .collect();
    let tools = chat
        .tools
        .iter()
        .flatten()
        .map(|tool| {
            let function = tool.get("function");
            tok::ChatCompletionTool {
                r#type: text(tool.get("type")).unwrap_or_else(|| "function".into()),
                function: function.map(|f| tok::FunctionDefinition {
                    name: text(f.get("name")).unwrap_or_default(),
                    description: text(f.get("description")),
                    parameters_json: f.get("parameters").map(Value::to_string),
                    strict: f.get("strict").and_then(Value::as_bool),
                }),
            }
        })
        .collect();
    tok::RenderChatCompletionRequest {
        model_name: model.to_string(),
        messages,
        tools,
        chat_template: chat.chat_template.clone().unwrap_or_default(),
        add_generation_prompt: chat.add_generation_prompt,
        continue_final_message: chat.continue_final_message,
        chat_template_kwargs: (!chat.template_kwargs.is_empty())
            .then(|| Value::Object(chat.template_kwargs.clone()).to_string()),
    }
}
