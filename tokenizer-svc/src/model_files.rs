//! Reads a model directory the way `transformers` does (tokenizer.json, tokenizer_config.json,
//! chat_template.jinja), so that special tokens and the chat template are exactly
//! those vLLM would use for the same directory.
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::error::{Result, TokenizerError};

/// The named special tokens HF exposes to chat templates (`special_tokens_map`).
pub const SPECIAL_TOKEN_ATTRIBUTES: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// What `tokenizer_config.json` (plus `chat_template.jinja`) says about a model.
#[derive(Debug, Clone, Default)]
pub struct TokenizerConfig {
    /// `(attribute, token)` for each named special token that is set, in HF's attribute order.
    pub special_tokens: Vec<(String, String)>,
    /// Named chat templates; a single template is named `default`.
    pub chat_templates: Vec<NamedTemplate>,
}

/// One chat template and the name HF selects it by (`default`, `tool_use`, ...).
#[derive(Debug, Clone)]
pub struct NamedTemplate {
    pub name: String,
    pub source: String,
}

impl TokenizerConfig {
    /// The value of a named special token such as `bos_token`.
    pub fn special_token(&self, attribute: &str) -> Option<&str> {
        self.special_tokens.iter().find(|(a, _)| a == attribute).map(|(_, t)| t.as_str())
    }

    /// HF's template choice: `tool_use` when tools are given and it exists, else `default`.
    /// (Named templates without a `default` have nothing to fall back on, as in HF.)
    pub fn select_template(&self, with_tools: bool) -> Option<&NamedTemplate> {
        let by_name = |n: &str| self.chat_templates.iter().find(|t| t.name == n);
        if with_tools {
            if let Some(t) = by_name("tool_use") {
                return Some(t);
            }
        }
        by_name("default")
    }
}

/// Paths of the files one model is made of.
#[derive(Debug, Clone)]
pub struct ModelDir {
    pub dir: PathBuf,
}

impl ModelDir {
    pub fn tokenizer_json(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }

    /// Parses `tokenizer_config.json` (optional) and `chat_template.jinja` (optional, wins over
    /// the config's `chat_template`, as in transformers).
    pub fn read_config(&self, model: &str) -> Result<TokenizerConfig> {
        let config_path = self.dir.join("tokenizer_config.json");
        let json: Json = if config_path.exists() {
            let text = read_text(model, &config_path)?;
            serde_json::from_str(&text).map_err(|e| TokenizerError::ModelFiles {
                model: model.to_string(),
                path: config_path.clone(),
                reason: format!("invalid JSON: {e}"),
            })?
        } else {
            Json::Object(Default::default())
        };
        let mut config = TokenizerConfig::default();
        for attribute in SPECIAL_TOKEN_ATTRIBUTES {
            if let Some(token) = json.get(attribute).and_then(token_content) {
                config.special_tokens.push((attribute.to_string(), token));
            }
        }
        // Template files replace the config's templates entirely, as in transformers v5:
        // `chat_template.jinja` is `default`, `additional_chat_templates/<name>.jinja` is `<name>`.
        let jinja_path = self.dir.join("chat_template.jinja");
        if jinja_path.exists() {
            let source = read_text(model, &jinja_path)?;
            config.chat_templates.push(NamedTemplate { name: "default".into(), source });
        }
        let extra_dir = self.dir.join("additional_chat_templates");
        if let Ok(entries) = std::fs::read_dir(&extra_dir) {
            let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for path in files {
                let name = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".jinja"));
                if let Some(name) = name {
                    let source = read_text(model, &path)?;
                    config.chat_templates.push(NamedTemplate { name: name.to_string(), source });
                }
            }
        }
        if config.chat_templates.is_empty() {
            match json.get("chat_template") {
                Some(Json::String(source)) => {
                    config.chat_templates.push(NamedTemplate { name: "default".into(), source: source.clone() })
                }
                Some(Json::Array(list)) => {
                    for entry in list {
                        if let (Some(name), Some(source)) =
                            (entry.get("name").and_then(Json::as_str), entry.get("template").and_then(Json::as_str))
                        {
                            config.chat_templates.push(NamedTemplate { name: name.into(), source: source.into() });
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(config)
    }
}

/// A special token is either a plain string or a serialized `AddedToken` with `content`.
fn token_content(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Object(map) => map.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

fn read_text(model: &str, path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| TokenizerError::ModelFiles {
        model: model.to_string(),
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}
