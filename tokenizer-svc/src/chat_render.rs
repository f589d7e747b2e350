//! Turns a `ChatRequest` into the exact prompt text `transformers.apply_chat_template` renders:
//! message normalisation, reasoning-field aliases, special tokens and kwargs in the context,
//! and HF's `continue_final_message` trimming.
use minijinja::value::Value;
use serde_json::{Map, Value as Json};

use crate::chat_request::ChatRequest;
use crate::error::{Result, TokenizerError};
use crate::template_env::ChatTemplate;
use crate::template_value::{json_value, ValueMap};

/// HF marks the end of the message to continue with this tag, then cuts the prompt there.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
/// Names a message's reasoning is passed under; the first is the one templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
/// Template variables that come from the request's own fields, never from kwargs.
const RESERVED_CONTEXT: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// Renders `request` with `template`; `special_tokens` are the model's named special tokens.
///
/// The template's globals are built as minijinja values straight from the request's JSON
/// ([`context_value`]), not from a normalised copy of every message converted again: on a long
/// chat the copy and the conversion cost a quarter of the render. A request that continues its
/// final message (which edits a copy of that message's text) takes [`render_chat_with`]'s path.
pub fn render_chat(
    template: &ChatTemplate,
    template_source: &str,
    special_tokens: &[(String, String)],
    request: &ChatRequest,
) -> Result<String> {
    if request.continue_final_message {
        return render_chat_with(template_source, special_tokens, request, |context| {
            template.render(Value::from_serialize(context))
        });
    }
    check_request(request)?;
    template.render(context_value(special_tokens, request)?)
}

/// [`render_chat`] with the template run by `render`, given the template's globals: how a
/// client template reaches its sandbox ([`crate::client_template`]) with the same context,
/// checks and `continue_final_message` cut as the model's own templates.
pub fn render_chat_with(
    template_source: &str,
    special_tokens: &[(String, String)],
    request: &ChatRequest,
    render: impl FnOnce(&Map<String, Json>) -> Result<String>,
) -> Result<String> {
    check_request(request)?;
    let mut messages = request.messages.iter().map(normalize_message).collect::<Result<Vec<_>>>()?;
    let final_text =
        if request.continue_final_message { Some(mark_final_message(&mut messages, template_source)?) } else { None };

    let mut context = Map::new();
    for (name, token) in special_tokens {
        context.insert(name.clone(), Json::String(token.clone()));
    }
    for (key, value) in &request.template_kwargs {
        context.insert(key.clone(), value.clone());
    }
    context.insert("messages".into(), Json::Array(messages));
    context.insert("tools".into(), request.tools.clone().map(Json::Array).unwrap_or(Json::Null));
    context.insert("documents".into(), request.documents.clone().map(Json::Array).unwrap_or(Json::Null));
    context.insert("add_generation_prompt".into(), Json::Bool(request.add_generation_prompt));

    let rendered = render(&context)?;
    match final_text {
        Some(final_text) => cut_at_continue_tag(rendered, &final_text),
        None => Ok(rendered),
    }
}

/// The template's globals of [`render_chat_with`] (without `continue_final_message`), built as
/// minijinja values directly: the same keys in the same order, each value what
/// `Value::from_serialize` makes of the JSON the slow path builds (see [`json_value`]).
fn context_value(special_tokens: &[(String, String)], request: &ChatRequest) -> Result<Value> {
    let mut context = ValueMap::with_capacity(special_tokens.len() + request.template_kwargs.len() + 4);
    for (name, token) in special_tokens {
        context.insert(Value::from(name.as_str()), Value::from(token.as_str()));
    }
    for (key, value) in &request.template_kwargs {
        context.insert(Value::from(key.as_str()), json_value(value));
    }
    let messages = request.messages.iter().map(message_value).collect::<Result<Vec<_>>>()?;
    context.insert(Value::from("messages"), Value::from_object(messages));
    let list = |items: &Option<Vec<Json>>| match items {
        Some(items) => Value::from_object(items.iter().map(json_value).collect::<Vec<_>>()),
        None => Value::from(()),
    };
    context.insert(Value::from("tools"), list(&request.tools));
    context.insert(Value::from("documents"), list(&request.documents));
    context.insert(Value::from("add_generation_prompt"), Value::from(request.add_generation_prompt));
    Ok(Value::from_object(context))
}

/// A message as a template value: [`normalize_message`]'s result, without copying the message
/// when there is nothing to normalise (most messages).
fn message_value(message: &Json) -> Result<Value> {
    match message {
        Json::Object(map) if !map.iter().any(|(k, v)| v.is_null() || REASONING_FIELDS.contains(&k.as_str())) => {
            Ok(json_value(message))
        }
        _ => Ok(json_value(&normalize_message(message)?)),
    }
}

/// The request checks `transformers` makes before it renders.
fn check_request(request: &ChatRequest) -> Result<()> {
    if request.messages.is_empty() {
        return Err(TokenizerError::InvalidRequest("the conversation has no messages".into()));
    }
    if request.continue_final_message && request.add_generation_prompt {
        return Err(TokenizerError::InvalidRequest(
            "continue_final_message and add_generation_prompt are mutually exclusive".into(),
        ));
    }
    if let Some(key) = request.template_kwargs.keys().find(|k| RESERVED_CONTEXT.contains(&k.as_str())) {
        // HF raises a TypeError (duplicate keyword); silently picking one would hide a bug.
        return Err(TokenizerError::InvalidRequest(format!(
            "chat_template_kwargs may not set {key:?}; use the request field instead"
        )));
    }
    Ok(())
}

/// Drops `null`-valued keys and fills the reasoning aliases, as HF's normalisation does.
fn normalize_message(message: &Json) -> Result<Json> {
    let Json::Object(map) = message else {
        return Err(TokenizerError::InvalidRequest("every message must be a JSON object".into()));
    };
    if !map.iter().any(|(k, v)| v.is_null() || REASONING_FIELDS.contains(&k.as_str())) {
        // Nothing to drop or alias (most messages): a copy keeps the map's hash table, where
        // collecting the entries again would hash every key.
        return Ok(message.clone());
    }
    let map: Map<String, Json> =
        map.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
    let reasoning = REASONING_FIELDS.iter().find_map(|f| map.get(*f).cloned());
    Ok(Json::Object(match reasoning {
        Some(reasoning) => {
            // {"thinking": r, **message, "reasoning_content": r}: key order matters to templates.
            let mut aliased = Map::new();
            aliased.insert("thinking".into(), reasoning.clone());
            for (k, v) in map {
                aliased.insert(k, v);
            }
            aliased.insert("reasoning_content".into(), reasoning);
            aliased
        }
        None => map,
    }))
}

/// Appends the continue tag to the final message's text and returns that text.
fn mark_final_message(messages: &mut [Json], template_source: &str) -> Result<String> {
    let last = messages.last_mut().and_then(Json::as_object_mut).expect("messages checked non-empty");
    let Some(content) = last.get_mut("content") else {
        return Err(TokenizerError::InvalidRequest(
            "continue_final_message is set but the final message has no content to continue".into(),
        ));
    };
    if !template_source.contains("content") {
        return Err(TokenizerError::InvalidRequest(
            "continue_final_message is set but the chat template never reads `content`".into(),
        ));
    }
    match content {
        Json::String(text) => {
            let original = text.clone();
            text.push_str(CONTINUE_TAG);
            Ok(original)
        }
        Json::Array(parts) => {
            for part in parts.iter_mut().rev() {
                if let Some(Json::String(text)) = part.get_mut("text") {
                    let original = text.clone();
                    text.push_str(CONTINUE_TAG);
                    return Ok(original);
                }
            }
            Err(TokenizerError::InvalidRequest(
                "continue_final_message is set but the final message has no text part".into(),
            ))
        }
        _ => Err(TokenizerError::InvalidRequest("continue_final_message: unsupported content type".into())),
    }
}

fn cut_at_continue_tag(rendered: String, final_text: &str) -> Result<String> {
    let tag = CONTINUE_TAG.trim();
    let tag_loc = match rendered.rfind(tag) {
        Some(loc) if rendered.contains(final_text.trim()) => loc,
        _ => {
            return Err(TokenizerError::InvalidRequest(
                "continue_final_message is set but the template dropped the final message".into(),
            ))
        }
    };
    if rendered[tag_loc..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..tag_loc].to_string())
    } else {
        Ok(rendered[..tag_loc].trim_end().to_string())
    }
}
