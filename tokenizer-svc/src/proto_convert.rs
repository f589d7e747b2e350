//! Converts llm-d's protobuf messages into the library's `ChatRequest`. Protobuf maps are
//! unordered, so their keys are sorted to make the rendered prompt (and thus its cache key)
//! deterministic for identical requests.
use kvindex_proto::tokenization as pb;
use serde_json::{Map, Value as Json};

use crate::chat_request::ChatRequest;
use crate::error::{Result, TokenizerError};

/// `RenderChatCompletionRequest` → `ChatRequest` (the OpenAI-style path vLLM serves).
pub fn chat_completion_request(req: &pb::RenderChatCompletionRequest) -> Result<ChatRequest> {
    let template_kwargs = match req.chat_template_kwargs.as_deref().map(str::trim) {
        None | Some("") => Map::new(),
        Some(text) => match serde_json::from_str::<Json>(text) {
            Ok(Json::Object(map)) => map,
            Ok(_) => return Err(TokenizerError::InvalidRequest("chat_template_kwargs must be a JSON object".into())),
            Err(e) => {
                return Err(TokenizerError::InvalidRequest(format!("chat_template_kwargs is not valid JSON: {e}")))
            }
        },
    };
    let tools =
        if req.tools.is_empty() { None } else { Some(req.tools.iter().map(tool_json).collect::<Result<Vec<_>>>()?) };
    Ok(ChatRequest {
        messages: req.messages.iter().map(message_json).collect(),
        tools,
        documents: None,
        chat_template: non_empty(&req.chat_template),
        add_generation_prompt: req.add_generation_prompt,
        continue_final_message: req.continue_final_message,
        template_kwargs,
    })
}

/// Deprecated `ChatTemplateRequest` → `ChatRequest`. Turns are consecutive parts of one
/// conversation, so their messages are concatenated.
pub fn chat_template_request(req: &pb::ChatTemplateRequest) -> ChatRequest {
    let struct_list = |maps: Vec<&std::collections::HashMap<String, pb::Value>>| -> Option<Vec<Json>> {
        if maps.is_empty() {
            None
        } else {
            Some(maps.into_iter().map(map_json).collect())
        }
    };
    let template_kwargs = match map_json(&req.chat_template_kwargs) {
        Json::Object(map) => map,
        _ => Map::new(),
    };
    ChatRequest {
        messages: req.conversation_turns.iter().flat_map(|t| t.messages.iter().map(message_json)).collect(),
        tools: struct_list(req.tools.iter().map(|t| &t.tool).collect()),
        documents: struct_list(req.documents.iter().map(|d| &d.document).collect()),
        chat_template: non_empty(&req.chat_template),
        add_generation_prompt: req.add_generation_prompt,
        continue_final_message: req.continue_final_message,
        template_kwargs,
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// `content` stays a string when given; otherwise the parts become OpenAI-style part objects.
fn message_json(message: &pb::ChatMessage) -> Json {
    let mut map = Map::new();
    map.insert("role".into(), Json::String(message.role.clone()));
    match &message.content {
        Some(content) => {
            map.insert("content".into(), Json::String(content.clone()));
        }
        None if !message.content_parts.is_empty() => {
            let parts = message.content_parts.iter().map(part_json).collect();
            map.insert("content".into(), Json::Array(parts));
        }
        None => {}
    }
    Json::Object(map)
}

fn part_json(part: &pb::ContentPart) -> Json {
    let mut map = Map::new();
    map.insert("type".into(), Json::String(part.r#type.clone()));
    if let Some(text) = &part.text {
        map.insert("text".into(), Json::String(text.clone()));
    }
    if let Some(image) = &part.image_url {
        map.insert("image_url".into(), serde_json::json!({ "url": image.url }));
    }
    Json::Object(map)
}

/// OpenAI tool shape: `{"type": "function", "function": {"name", "description", "parameters"}}`;
/// absent optional fields are omitted rather than rendered as `null`.
fn tool_json(tool: &pb::ChatCompletionTool) -> Result<Json> {
    let function = tool
        .function
        .as_ref()
        .ok_or_else(|| TokenizerError::InvalidRequest("a tool has no function definition".into()))?;
    let mut f = Map::new();
    f.insert("name".into(), Json::String(function.name.clone()));
    if let Some(description) = &function.description {
        f.insert("description".into(), Json::String(description.clone()));
    }
    if let Some(parameters) = &function.parameters_json {
        let parsed: Json = serde_json::from_str(parameters).map_err(|e| {
            TokenizerError::InvalidRequest(format!(
                "tool \"{}\": parameters_json is not valid JSON: {e}",
                crate::echo(&function.name)
            ))
        })?;
        f.insert("parameters".into(), parsed);
    }
    if let Some(strict) = function.strict {
        f.insert("strict".into(), Json::Bool(strict));
    }
    let kind = if tool.r#type.is_empty() { "function".to_string() } else { tool.r#type.clone() };
    Ok(serde_json::json!({ "type": kind, "function": Json::Object(f) }))
}

fn map_json(map: &std::collections::HashMap<String, pb::Value>) -> Json {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    Json::Object(keys.into_iter().map(|k| (k.clone(), value_json(&map[k]))).collect())
}

/// Protobuf `Value` → JSON. Numbers are doubles on the wire, so they stay floats (as they
/// would in the Python sidecar).
pub fn value_json(value: &pb::Value) -> Json {
    use pb::value::Value as V;
    match &value.value {
        None => Json::Null,
        Some(V::StringValue(s)) => Json::String(s.clone()),
        Some(V::NumberValue(n)) => serde_json::Number::from_f64(*n).map(Json::Number).unwrap_or(Json::Null),
        Some(V::BoolValue(b)) => Json::Bool(*b),
        Some(V::ListValue(list)) => Json::Array(list.values.iter().map(value_json).collect()),
        Some(V::StructValue(s)) => map_json(&s.fields),
    }
}
