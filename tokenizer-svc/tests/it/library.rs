//! Library behaviour on tokenizers trained in the test: tokenization with offsets, BOS rules,
//! chat rendering paths, template selection, clear errors and the bounded model cache.
use crate::common;

use crate::common::trained;
use kvindex_tokenizer::{ChatRequest, ClientTemplates, RegistryConfig, TokenizerError, TokenizerRegistry};
use serde_json::json;

fn registry_with(models: &[(&str, std::path::PathBuf)], max_loaded: usize) -> TokenizerRegistry {
    let mut config = RegistryConfig { max_loaded_models: max_loaded, ..Default::default() };
    for (name, dir) in models {
        config.add_model(name, dir).unwrap();
    }
    TokenizerRegistry::new(config)
}

fn chat(messages: serde_json::Value) -> ChatRequest {
    ChatRequest::from_messages(messages.as_array().unwrap().clone())
}

#[test]
fn tokenize_offsets_cover_the_text_and_bos_follows_the_post_processor() {
    let root = common::scratch_dir("lib-tokenize");
    let registry = registry_with(&[("m", trained::chatml_model(&root, "m"))], 4);
    let text = "Hello world! café 🚀";
    let plain = registry.tokenize("m", text, false).unwrap();
    assert!(!plain.ids.is_empty());
    assert_eq!(plain.ids.len(), plain.offsets.len());
    assert_eq!(plain.offsets.first().unwrap().0, 0);
    assert_eq!(plain.offsets.last().unwrap().1 as usize, text.chars().count(), "offsets are in characters");
    let with_bos = registry.tokenize("m", text, true).unwrap();
    let bos = registry.model("m").unwrap().tokenizer().token_to_id("<s>").unwrap();
    assert_eq!(with_bos.ids[0], bos);
    assert_eq!(&with_bos.ids[1..], &plain.ids[..]);
    assert_eq!(registry.render_completion("m", text).unwrap(), with_bos.ids);
}

#[test]
fn chat_ids_are_the_rendered_text_without_extra_special_tokens() {
    let root = common::scratch_dir("lib-chat");
    let registry = registry_with(&[("m", trained::chatml_model(&root, "m"))], 4);
    let mut request =
        chat(json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  Hello  "}]));
    request.add_generation_prompt = true;
    let text = registry.render_chat_text("m", &request).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = registry.render_chat("m", &request).unwrap();
    assert_eq!(ids, registry.tokenize("m", &text, false).unwrap().ids);
    let im_start = registry.model("m").unwrap().tokenizer().token_to_id("<|im_start|>").unwrap();
    assert_eq!(ids[0], im_start, "no BOS is added on top of the template");
}

#[test]
fn continue_final_message_cuts_after_the_partial_answer() {
    let root = common::scratch_dir("lib-continue");
    let registry = registry_with(&[("m", trained::chatml_model(&root, "m"))], 4);
    let mut request = chat(json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello the"}]));
    request.continue_final_message = true;
    let text = registry.render_chat_text("m", &request).unwrap();
    assert!(text.ends_with("<|im_start|>assistant\nHello the"), "{text:?}");
    request.add_generation_prompt = true;
    assert!(matches!(registry.render_chat_text("m", &request), Err(TokenizerError::InvalidRequest(_))));
}

#[test]
fn template_files_replace_config_templates_and_named_selection_follows_hf() {
    let root = common::scratch_dir("lib-files");
    let dir = trained::multi_template_model(&root, "m");
    // additional_chat_templates/ replaces the config's list; with no `default`, plain chats fail.
    std::fs::create_dir_all(dir.join("additional_chat_templates")).unwrap();
    std::fs::write(dir.join("additional_chat_templates/tool_use.jinja"), "TOOLS {{ tools | length }}").unwrap();
    let registry = registry_with(&[("m", dir.clone())], 4);
    let mut request = chat(json!([{"role": "user", "content": "hi"}]));
    assert!(matches!(registry.render_chat_text("m", &request), Err(TokenizerError::NoChatTemplate(_))));
    request.tools = Some(vec![json!({"name": "f"})]);
    assert_eq!(registry.render_chat_text("m", &request).unwrap(), "TOOLS 1");
    // chat_template.jinja becomes `default`.
    std::fs::write(dir.join("chat_template.jinja"), "DEFAULT").unwrap();
    let registry = registry_with(&[("m", dir)], 4);
    request.tools = None;
    assert_eq!(registry.render_chat_text("m", &request).unwrap(), "DEFAULT");
}

#[test]
fn tool_use_template_is_selected_when_tools_are_given() {
    let root = common::scratch_dir("lib-multi");
    let registry = registry_with(&[("m", trained::multi_template_model(&root, "m"))], 4);
    let mut request = chat(json!([{"role": "user", "content": "weather?"}]));
    assert!(registry.render_chat_text("m", &request).unwrap().starts_with("<|im_start|>user"));
    request.tools =
        Some(vec![json!({"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": [true, null]}}})]);
    let text = registry.render_chat_text("m", &request).unwrap();
    assert_eq!(text, "<s>TOOLS:{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"b\": 1, \"a\": [true, null]}}}user: weather?\n", "trim_blocks eats the newline after endfor");
}

#[test]
fn template_errors_name_the_template_and_line() {
    let root = common::scratch_dir("lib-raise");
    let registry = registry_with(&[("strict", trained::raising_model(&root, "strict"))], 4);
    let err = registry.render_chat("strict", &chat(json!([{"role": "system", "content": "x"}]))).unwrap_err();
    match &err {
        TokenizerError::Template { template, line, reason } => {
            assert_eq!(template, "strict/default");
            assert_eq!(*line, Some(3));
            assert!(reason.contains("System role not supported"), "{reason}");
        }
        other => panic!("expected a template error, got {other:?}"),
    }
    assert!(err.to_string().contains("\"strict/default\" line 3"), "{err}");
    assert!(err.is_client_error());
}

#[test]
fn bad_inputs_are_typed_errors_not_panics() {
    let root = common::scratch_dir("lib-bad");
    let dir = trained::chatml_model(&root, "m");
    let registry = registry_with(&[("m", dir.clone())], 4);
    assert!(matches!(registry.tokenize("nope", "x", true), Err(TokenizerError::UnknownModel(_))));
    assert!(matches!(registry.render_chat("m", &ChatRequest::default()), Err(TokenizerError::InvalidRequest(_))));
    assert!(matches!(
        registry.render_chat("m", &chat(json!(["not an object"]))),
        Err(TokenizerError::InvalidRequest(_))
    ));
    let mut clash = chat(json!([{"role": "user", "content": "x"}]));
    clash.template_kwargs.insert("messages".into(), json!([]));
    assert!(matches!(registry.render_chat("m", &clash), Err(TokenizerError::InvalidRequest(_))));
    let mut broken = chat(json!([{"role": "user", "content": "x"}]));
    broken.chat_template = Some("{% for %}".into());
    // A request's own template is refused by default, compiled only where it is trusted.
    assert!(matches!(registry.render_chat("m", &broken), Err(TokenizerError::ClientTemplateRejected { .. })));
    let mut config = RegistryConfig { client_templates: ClientTemplates::Trusted, ..Default::default() };
    config.add_model("m", &dir).unwrap();
    let trusting = TokenizerRegistry::new(config);
    assert!(matches!(trusting.render_chat("m", &broken), Err(TokenizerError::Template { line: Some(1), .. })));

    // A model whose own template does not compile fails to load with a clear error.
    let bad = root.join("bad");
    trained::train_tokenizer(&bad);
    std::fs::write(bad.join("chat_template.jinja"), "{% if %}").unwrap();
    let registry = registry_with(&[("bad", bad.clone())], 4);
    assert!(matches!(registry.initialize("bad"), Err(TokenizerError::Template { .. })));
    // Corrupt tokenizer.json.
    std::fs::remove_file(bad.join("chat_template.jinja")).unwrap();
    std::fs::write(bad.join("tokenizer.json"), "{not json").unwrap();
    assert!(matches!(registry.initialize("bad"), Err(TokenizerError::InvalidTokenizer { .. })));
    // No template at all.
    let plain = root.join("plain");
    trained::train_tokenizer(&plain);
    let registry = registry_with(&[("plain", plain)], 4);
    assert!(matches!(
        registry.render_chat("plain", &chat(json!([{"role": "user", "content": "x"}]))),
        Err(TokenizerError::NoChatTemplate(_))
    ));
}

#[test]
fn configuration_rejects_bad_specs_and_scans_models_dir() {
    let root = common::scratch_dir("lib-config");
    trained::chatml_model(&root, "alpha");
    trained::raising_model(&root, "beta");
    std::fs::create_dir_all(root.join("not-a-model")).unwrap();
    let mut config = RegistryConfig::default();
    assert_eq!(config.add_models_dir(&root).unwrap(), 2);
    assert_eq!(config.models.keys().cloned().collect::<Vec<_>>(), vec!["alpha", "beta"]);
    assert!(config.add_model_spec("alpha=/elsewhere").is_err(), "missing dir");
    assert!(config.add_model_spec("no-equals-sign").is_err());
    assert!(config.add_model_spec(&format!("alpha={}", root.join("alpha").display())).is_err(), "duplicate name");
    assert!(RegistryConfig::default().add_models_dir(root.join("missing")).is_err());
}

#[test]
fn the_model_cache_is_bounded_and_reloads_evicted_models() {
    let root = common::scratch_dir("lib-cache");
    let registry =
        registry_with(&[("a", trained::chatml_model(&root, "a")), ("b", trained::chatml_model(&root, "b"))], 1);
    assert!(registry.loaded_model_names().is_empty(), "loading is lazy");
    let first = registry.tokenize("a", "Hello", false).unwrap();
    registry.tokenize("b", "Hello", false).unwrap();
    assert_eq!(registry.loaded_model_names(), vec!["b"]);
    assert_eq!(registry.tokenize("a", "Hello", false).unwrap(), first);
    assert_eq!(registry.loaded_model_names(), vec!["a"]);
}

#[test]
fn concurrent_first_use_loads_once_and_agrees() {
    let root = common::scratch_dir("lib-concurrent");
    let registry = std::sync::Arc::new(registry_with(&[("m", trained::chatml_model(&root, "m"))], 2));
    let expected = {
        let mut config = RegistryConfig::default();
        config.add_model("m", root.join("m")).unwrap();
        TokenizerRegistry::new(config).tokenize("m", "Hello world! café", true).unwrap()
    };
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let registry = registry.clone();
            std::thread::spawn(move || registry.tokenize("m", "Hello world! café", true).unwrap())
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), expected);
    }
    assert_eq!(registry.loaded_model_names(), vec!["m"]);
}
