//! `/v1/completions` and `/v1/chat/completions`: turn a request into prompt token ids, run it
//! on the pod, answer in OpenAI's format (JSON or SSE), with
//! `usage.prompt_tokens_details.cached_tokens` as vLLM reports it.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::{parse_json, ApiError};
use super::tokenizer::PromptTokenizer;
use crate::engine::{NewRequest, RequestSummary};
use crate::pod::{Pod, RequestEvent, SubmitError};

/// vLLM's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: u64 = 16;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// How the reply is delivered: the fields both endpoints share.
#[derive(Debug, Deserialize)]
struct ReplyOptions {
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    /// vLLM's extension: return the prompt's and the completion's token ids.
    return_token_ids: Option<bool>,
}

impl ReplyOptions {
    fn job(self, kind: Kind, prompt: PromptSource, max_tokens: usize) -> Job {
        Job {
            kind,
            prompt,
            max_tokens,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            return_token_ids: self.return_token_ids.unwrap_or(false),
        }
    }
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    model: Option<String>,
    prompt: Option<Value>,
    max_tokens: Option<u64>,
    #[serde(flatten)]
    reply: ReplyOptions,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    model: Option<String>,
    messages: Vec<ChatMessage>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    #[serde(flatten)]
    reply: ReplyOptions,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

/// A prompt as the request gave it; tokenized in [`run`], off the async workers when the
/// tokenizer is a real vocabulary.
enum PromptSource {
    Ids(Vec<u32>),
    Text(String),
    Chat(Vec<(String, String)>),
}

struct Job {
    kind: Kind,
    prompt: PromptSource,
    max_tokens: usize,
    stream: bool,
    include_usage: bool,
    return_token_ids: bool,
}

fn check_model(pod: &Pod, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(name) if name != pod.info.model => Err(ApiError::not_found(format!("The model `{name}` does not exist."))),
        _ => Ok(()),
    }
}

fn max_tokens(value: Option<u64>) -> Result<usize, ApiError> {
    let value = value.unwrap_or(DEFAULT_MAX_TOKENS);
    if value == 0 {
        return Err(ApiError::bad_request("max_tokens must be at least 1"));
    }
    usize::try_from(value).map_err(|_| ApiError::bad_request("max_tokens is too large"))
}

/// A prompt as text, as token ids, or as a one-element batch of either.
fn prompt_source(prompt: &Value) -> Result<PromptSource, ApiError> {
    match prompt {
        Value::String(text) => Ok(PromptSource::Text(text.clone())),
        Value::Array(items) if items.iter().all(Value::is_number) => items
            .iter()
            .map(|item| item.as_u64().and_then(|id| u32::try_from(id).ok()))
            .collect::<Option<Vec<u32>>>()
            .map(PromptSource::Ids)
            .ok_or_else(|| ApiError::bad_request("prompt token ids must be integers in [0, 2^32)")),
        Value::Array(items) if items.len() == 1 => prompt_source(&items[0]),
        Value::Array(_) => Err(ApiError::bad_request("batched prompts are not supported; send one prompt per request")),
        _ => Err(ApiError::bad_request("prompt must be a string or an array of token ids")),
    }
}

fn message_text(content: &Option<Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(part_text)) => text.push_str(part_text),
                    _ => return Err(ApiError::bad_request("only text content parts are supported")),
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::bad_request("message content must be a string or an array of text parts")),
    }
}

pub async fn completions(State(pod): State<Pod>, body: Bytes) -> Response {
    let result = (|| {
        let body: CompletionBody = parse_json(&body)?;
        check_model(&pod, body.model.as_deref())?;
        let prompt = prompt_source(body.prompt.as_ref().ok_or_else(|| ApiError::bad_request("prompt is required"))?)?;
        Ok::<_, ApiError>(body.reply.job(Kind::Completion, prompt, max_tokens(body.max_tokens)?))
    })();
    match result {
        Ok(job) => run(pod, job).await,
        Err(error) => error.into_response(),
    }
}

pub async fn chat_completions(State(pod): State<Pod>, body: Bytes) -> Response {
    let result = (|| {
        let body: ChatBody = parse_json(&body)?;
        check_model(&pod, body.model.as_deref())?;
        if body.messages.is_empty() {
            return Err(ApiError::bad_request("messages must not be empty"));
        }
        let messages = body
            .messages
            .iter()
            .map(|m| Ok((m.role.clone(), message_text(&m.content)?)))
            .collect::<Result<Vec<_>, ApiError>>()?;
        let max = max_tokens(body.max_completion_tokens.or(body.max_tokens))?;
        Ok(body.reply.job(Kind::Chat, PromptSource::Chat(messages), max))
    })();
    match result {
        Ok(job) => run(pod, job).await,
        Err(error) => error.into_response(),
    }
}

fn usage(summary: &RequestSummary) -> Value {
    json!({
        "prompt_tokens": summary.prompt_tokens,
        "completion_tokens": summary.completion_tokens,
        "total_tokens": summary.prompt_tokens + summary.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": summary.cached_tokens },
    })
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The prompt's token ids. A tokenizer error (e.g. a chat template raising on the messages)
/// is the client's.
async fn tokenize(tokenizer: &PromptTokenizer, source: PromptSource) -> Result<Vec<u32>, ApiError> {
    let tokenize_now = move |tokenizer: &PromptTokenizer| match source {
        PromptSource::Ids(ids) => Ok(ids),
        PromptSource::Text(text) => tokenizer.completion(&text),
        PromptSource::Chat(messages) => tokenizer.chat(&messages),
    };
    let result = if tokenizer.is_expensive() {
        let tokenizer = tokenizer.clone();
        tokio::task::spawn_blocking(move || tokenize_now(&tokenizer))
            .await
            .map_err(|_| ApiError::unavailable("the tokenizer task failed"))?
    } else {
        tokenize_now(tokenizer)
    };
    result.map_err(ApiError::bad_request)
}

async fn run(pod: Pod, job: Job) -> Response {
    let prompt = match tokenize(&pod.info.tokenizer, job.prompt).await {
        Ok(prompt) => prompt,
        Err(error) => return error.into_response(),
    };
    let prompt_for_reply = if job.return_token_ids { Some(prompt.clone()) } else { None };
    let events = match pod.submit(NewRequest { prompt, max_tokens: job.max_tokens }).await {
        Ok(events) => events,
        Err(SubmitError::Rejected(reason)) => return ApiError::bad_request(reason.to_string()).into_response(),
        Err(SubmitError::Stopped) => return ApiError::unavailable("the engine has stopped").into_response(),
    };
    let prefix = if job.kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
    let id = format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let reply = Reply {
        kind: job.kind,
        id,
        created: unix_now(),
        model: pod.info.model.clone(),
        tokenizer: pod.info.tokenizer.clone(),
    };
    if job.stream {
        stream(reply, events, job.include_usage).into_response()
    } else {
        collect(reply, events, prompt_for_reply).await
    }
}

struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    tokenizer: PromptTokenizer,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    fn choice(&self, text: &str, finish_reason: Option<&str>, chunk: bool) -> Value {
        match (self.kind, chunk) {
            (Kind::Completion, _) => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason})
            }
            (Kind::Chat, false) => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish_reason})
            }
            (Kind::Chat, true) => {
                json!({"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": finish_reason})
            }
        }
    }

    fn envelope(&self, choices: Value, chunk: bool) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }
}

async fn collect(
    reply: Reply,
    mut events: mpsc::UnboundedReceiver<RequestEvent>,
    prompt: Option<Vec<u32>>,
) -> Response {
    let mut tokens = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            RequestEvent::Scheduled { .. } => {}
            RequestEvent::Token(token) => tokens.push(token),
            RequestEvent::Finished(summary) => {
                let mut choice = reply.choice(&reply.tokenizer.decode(&tokens), Some("length"), false);
                if let Some(prompt) = &prompt {
                    choice["token_ids"] = json!(tokens);
                    choice["prompt_token_ids"] = json!(prompt);
                }
                let mut body = reply.envelope(json!([choice]), false);
                body["usage"] = usage(&summary);
                return Json(body).into_response();
            }
        }
    }
    ApiError::unavailable("the engine stopped before the request finished").into_response()
}

fn stream(reply: Reply, mut events: mpsc::UnboundedReceiver<RequestEvent>, include_usage: bool) -> impl IntoResponse {
    let (sender, receiver) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let send = |value: Value| Ok(Event::default().data(value.to_string()));
        // A chat stream opens with the role, sent as vLLM sends it: with the engine's first
        // output, i.e. after the prefill (a router reads the first body byte as "computed").
        let mut role_pending = reply.kind == Kind::Chat;
        let role = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
        let mut pending: Option<u32> = None;
        while let Some(event) = events.recv().await {
            if role_pending && matches!(event, RequestEvent::Token(_) | RequestEvent::Finished(_)) {
                role_pending = false;
                let _ = sender.send(send(reply.envelope(role.clone(), true))).await;
            }
            match event {
                RequestEvent::Scheduled { .. } => {}
                RequestEvent::Token(token) => {
                    // Hold one token back so the last one carries the finish reason.
                    if let Some(previous) = pending.replace(token) {
                        let choice = reply.choice(&reply.tokenizer.decode(&[previous]), None, true);
                        if sender.send(send(reply.envelope(json!([choice]), true))).await.is_err() {
                            return;
                        }
                    }
                }
                RequestEvent::Finished(summary) => {
                    let text = pending.take().map(|t| reply.tokenizer.decode(&[t])).unwrap_or_default();
                    let choice = reply.choice(&text, Some("length"), true);
                    let _ = sender.send(send(reply.envelope(json!([choice]), true))).await;
                    if include_usage {
                        let mut last = reply.envelope(json!([]), true);
                        last["usage"] = usage(&summary);
                        let _ = sender.send(send(last)).await;
                    }
                    break;
                }
            }
        }
        let _ = sender.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(receiver))
}
