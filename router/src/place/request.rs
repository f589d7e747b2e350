//! What the router needs from an OpenAI request body, parsed without HTTP: the model, the
//! prompt (text, token ids, or chat messages with their template inputs), `cache_salt` and
//! whether the answer streams. Both front doors (the proxy and the endpoint picker) parse the
//! same bodies here; the body itself is forwarded unchanged.

use kvindex_tokenizer::ChatRequest;
use serde_json::{Map, Value};

/// The OpenAI endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::ChatCompletions => "chat_completions",
        }
    }
}

/// The prompt as the client sent it.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// A completion prompt; tokenized as vLLM's completions endpoint does (BOS per the model).
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
    /// Chat messages and template inputs; rendered as vLLM's chat endpoint does.
    Chat(ChatRequest),
}

/// One request to place.
#[derive(Debug, Clone)]
pub struct RouteRequest {
    pub model: String,
    pub prompt: Prompt,
    pub cache_salt: Option<String>,
    pub stream: bool,
    /// Only these pods may be picked (the gateway's subset hint); `None` = any.
    pub subset: Option<Vec<String>>,
}

/// A body the router cannot place; the message is safe to return to the client and never
/// quotes the prompt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    pub message: String,
    /// The offending field, OpenAI's `param`.
    pub param: Option<&'static str>,
}

/// Client text quoted back in an error is cut and escaped as the tokenizer service does it.
pub use kvindex_tokenizer::echo::echo;

fn bad(param: &'static str, message: impl Into<String>) -> RequestError {
    RequestError { message: message.into(), param: Some(param) }
}

/// Parses an OpenAI request body sent to `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<RouteRequest, RequestError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| RequestError {
        message: format!("the request body is not valid JSON: {}", describe_json_error(&e)),
        param: None,
    })?;
    let Value::Object(mut obj) = value else {
        return Err(RequestError { message: "the request body must be a JSON object".into(), param: None });
    };
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(bad("model", "you must provide a model parameter"))
        }
        Some(_) => return Err(bad("model", "model must be a string")),
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream", "stream must be a boolean")),
    };
    let cache_salt = match obj.get("cache_salt") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(_) => return Err(bad("cache_salt", "cache_salt must be a non-empty string")),
    };
    let prompt = match endpoint {
        Endpoint::Completions => completion_prompt(obj.get("prompt"))?,
        Endpoint::ChatCompletions => Prompt::Chat(chat(&mut obj)?),
    };
    Ok(RouteRequest { model, prompt, cache_salt, stream, subset: None })
}

/// Line and column only: serde's message can quote input bytes.
fn describe_json_error(e: &serde_json::Error) -> String {
    let kind = match e.classify() {
        serde_json::error::Category::Io => "I/O error",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Data => "unexpected data",
        serde_json::error::Category::Eof => "unexpected end of input",
    };
    format!("{kind} at line {} column {}", e.line(), e.column())
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items.iter().map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
}

/// `prompt`: a string, token ids, or a batch of either; a batch is placed by its first prompt.
fn completion_prompt(prompt: Option<&Value>) -> Result<Prompt, RequestError> {
    let invalid = || bad("prompt", "prompt must be a string, an array of token ids, or an array of those");
    let prompt = match prompt {
        None | Some(Value::Null) => return Err(bad("prompt", "you must provide a prompt")),
        Some(p) => p,
    };
    let parsed = match prompt {
        Value::String(s) => Prompt::Text(s.clone()),
        Value::Array(items) if items.is_empty() => return Err(bad("prompt", "prompt must not be empty")),
        Value::Array(items) => match &items[0] {
            Value::Number(_) => Prompt::Tokens(token_ids(items).ok_or_else(invalid)?),
            Value::String(s) if items.iter().all(Value::is_string) => Prompt::Text(s.clone()),
            Value::Array(first) if items.iter().all(Value::is_array) => {
                Prompt::Tokens(token_ids(first).ok_or_else(invalid)?)
            }
            _ => return Err(invalid()),
        },
        _ => return Err(invalid()),
    };
    match &parsed {
        Prompt::Text(s) if s.is_empty() => Err(bad("prompt", "prompt must not be empty")),
        Prompt::Tokens(t) if t.is_empty() => Err(bad("prompt", "prompt must not be empty")),
        _ => Ok(parsed),
    }
}

/// `messages` and the template inputs vLLM's chat endpoint takes.
fn chat(obj: &mut Map<String, Value>) -> Result<ChatRequest, RequestError> {
    let messages = match obj.remove("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(bad("messages", "messages must not be empty")),
        None | Some(Value::Null) => return Err(bad("messages", "you must provide messages")),
        Some(_) => return Err(bad("messages", "messages must be an array")),
    };
    for message in &messages {
        let role_ok = message.get("role").is_some_and(Value::is_string);
        if !message.is_object() || !role_ok {
            return Err(bad("messages", "every message must be an object with a string role"));
        }
    }
    let flag = |obj: &Map<String, Value>, name: &'static str, default: bool| match obj.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(name, format!("{name} must be a boolean"))),
    };
    let add_generation_prompt = flag(obj, "add_generation_prompt", true)?;
    let continue_final_message = flag(obj, "continue_final_message", false)?;
    if add_generation_prompt && continue_final_message {
        return Err(bad(
            "continue_final_message",
            "cannot set both continue_final_message and add_generation_prompt to true",
        ));
    }
    let list = |obj: &mut Map<String, Value>, name: &'static str| match obj.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(_) => Err(bad(name, format!("{name} must be an array"))),
    };
    let tools = list(obj, "tools")?;
    let documents = list(obj, "documents")?;
    let chat_template = match obj.remove("chat_template") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(t),
        Some(_) => return Err(bad("chat_template", "chat_template must be a string")),
    };
    let template_kwargs = match obj.remove("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(kwargs)) => kwargs,
        Some(_) => return Err(bad("chat_template_kwargs", "chat_template_kwargs must be an object")),
    };
    Ok(ChatRequest {
        messages,
        tools,
        documents,
        chat_template,
        add_generation_prompt,
        continue_final_message,
        template_kwargs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_json(endpoint: Endpoint, body: Value) -> Result<RouteRequest, RequestError> {
        parse(endpoint, body.to_string().as_bytes())
    }

    #[test]
    fn completion_prompts_in_every_shape() {
        let text = parse_json(Endpoint::Completions, json!({"model": "m", "prompt": "hi", "stream": true})).unwrap();
        assert!(matches!(text.prompt, Prompt::Text(ref s) if s == "hi"));
        assert!(text.stream);
        let ids = parse_json(Endpoint::Completions, json!({"model": "m", "prompt": [1, 2, 3]})).unwrap();
        assert!(matches!(ids.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
        let batch = parse_json(Endpoint::Completions, json!({"model": "m", "prompt": [[7, 8], [9]]})).unwrap();
        assert!(matches!(batch.prompt, Prompt::Tokens(ref t) if t == &[7, 8]));
        let texts =
            parse_json(Endpoint::Completions, json!({"model": "m", "prompt": ["a", "b"], "cache_salt": "s"})).unwrap();
        assert!(matches!(texts.prompt, Prompt::Text(ref s) if s == "a"));
        assert_eq!(texts.cache_salt.as_deref(), Some("s"));
    }

    #[test]
    fn chats_carry_their_template_inputs() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}], "chat_template_kwargs": {"enable_thinking": false},
            "add_generation_prompt": false, "continue_final_message": true});
        let Prompt::Chat(chat) = parse_json(Endpoint::ChatCompletions, body).unwrap().prompt else { panic!("chat") };
        assert_eq!(chat.messages.len(), 1);
        assert_eq!(chat.tools.as_ref().map(Vec::len), Some(1));
        assert!(!chat.add_generation_prompt && chat.continue_final_message);
        assert_eq!(chat.template_kwargs["enable_thinking"], json!(false));
        let default = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let Prompt::Chat(chat) = parse_json(Endpoint::ChatCompletions, default).unwrap().prompt else { panic!("chat") };
        assert!(chat.add_generation_prompt, "vLLM's default");
    }

    #[test]
    fn bad_bodies_name_the_field_and_never_quote_the_input() {
        let secret = "{\"model\": \"m\", \"prompt\": \"my secret\" oops}";
        let e = parse(Endpoint::Completions, secret.as_bytes()).unwrap_err();
        assert!(e.message.contains("not valid JSON") && !e.message.contains("secret"), "{e}");
        let cases = [
            (Endpoint::Completions, json!([1, 2]), None),
            (Endpoint::Completions, json!({"prompt": "x"}), Some("model")),
            (Endpoint::Completions, json!({"model": 3, "prompt": "x"}), Some("model")),
            (Endpoint::Completions, json!({"model": "m"}), Some("prompt")),
            (Endpoint::Completions, json!({"model": "m", "prompt": ""}), Some("prompt")),
            (Endpoint::Completions, json!({"model": "m", "prompt": [-1]}), Some("prompt")),
            (Endpoint::Completions, json!({"model": "m", "prompt": [1, "a"]}), Some("prompt")),
            (Endpoint::Completions, json!({"model": "m", "prompt": [4294967296u64]}), Some("prompt")),
            (Endpoint::Completions, json!({"model": "m", "prompt": "x", "stream": "yes"}), Some("stream")),
            (Endpoint::ChatCompletions, json!({"model": "m", "messages": []}), Some("messages")),
            (Endpoint::ChatCompletions, json!({"model": "m", "messages": [{"content": "x"}]}), Some("messages")),
            (
                Endpoint::ChatCompletions,
                json!({"model": "m", "messages": [{"role": "user"}], "tools": {}}),
                Some("tools"),
            ),
            (
                Endpoint::ChatCompletions,
                json!({"model": "m", "messages": [{"role": "user"}], "continue_final_message": true}),
                Some("continue_final_message"),
            ),
        ];
        for (endpoint, body, param) in cases {
            let e = parse_json(endpoint, body.clone()).expect_err(&body.to_string());
            assert_eq!(e.param, param, "{body}: {e}");
        }
    }
}
