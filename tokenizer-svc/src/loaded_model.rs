//! One model ready to serve: its tokenizer adjusted the way `transformers` v5 adjusts it on load
//! (named special tokens from `tokenizer_config.json` added; BOS/EOS left to tokenizer.json's
//! post-processor) and its chat templates compiled once.
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use tokenizers::{AddedToken, Tokenizer};

use crate::chat_render::render_chat;
use crate::chat_request::ChatRequest;
use crate::error::{Result, TokenizerError};
use crate::model_files::{ModelDir, NamedTemplate, TokenizerConfig};
use crate::template_env::ChatTemplate;

/// Token ids of a text and, per token, its `(start, end)` character offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedText {
    pub ids: Vec<u32>,
    pub offsets: Vec<(u32, u32)>,
}

/// A loaded model. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct LoadedModel {
    name: String,
    tokenizer: Tokenizer,
    config: TokenizerConfig,
    templates: Vec<(NamedTemplate, ChatTemplate)>,
    /// Templates sent with requests (llm-d may send one on every call), compiled once each.
    request_templates: Mutex<Vec<(String, Arc<ChatTemplate>)>>,
}

/// How many distinct request-supplied templates stay compiled per model.
const REQUEST_TEMPLATE_CACHE: usize = 8;

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel").field("name", &self.name).finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// Loads `dir` as model `name`. Template syntax errors surface here, naming the template.
    pub fn load(name: &str, dir: &Path) -> Result<Self> {
        let files = ModelDir { dir: dir.to_path_buf() };
        let tokenizer_path = files.tokenizer_json();
        if !tokenizer_path.exists() {
            return Err(TokenizerError::ModelFiles {
                model: name.into(),
                path: tokenizer_path,
                reason: "file not found".into(),
            });
        }
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| TokenizerError::InvalidTokenizer { model: name.into(), reason: e.to_string() })?;
        let config = files.read_config(name)?;
        apply_transformers_adjustments(name, &mut tokenizer, &config)?;
        let templates = config
            .chat_templates
            .iter()
            .map(|t| Ok((t.clone(), ChatTemplate::compile(&format!("{name}/{}", t.name), &t.source)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { name: name.into(), tokenizer, config, templates, request_templates: Mutex::new(Vec::new()) })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The underlying HF tokenizer, for callers that need more than ids.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn config(&self) -> &TokenizerConfig {
        &self.config
    }

    /// Encodes `text`; `add_special_tokens` applies tokenizer.json's post-processor (BOS/EOS).
    pub fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<TokenizedText> {
        let encoding = self
            .tokenizer
            .encode_char_offsets(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode { model: self.name.clone(), reason: e.to_string() })?;
        let offsets = encoding.get_offsets().iter().map(|&(s, e)| (s as u32, e as u32)).collect();
        Ok(TokenizedText { ids: encoding.get_ids().to_vec(), offsets })
    }

    /// Renders the chat to text exactly as `apply_chat_template(..., tokenize=False)`.
    pub fn render_chat_text(&self, request: &ChatRequest) -> Result<String> {
        if let Some(source) = &request.chat_template {
            let template = self.request_template(source)?;
            return render_chat(&template, source, &self.config.special_tokens, request);
        }
        let chosen = self
            .config
            .select_template(request.tools.is_some())
            .ok_or_else(|| TokenizerError::NoChatTemplate(self.name.clone()))?;
        let (named, template) = self
            .templates
            .iter()
            .find(|(t, _)| t.name == chosen.name)
            .expect("every configured template is compiled at load");
        render_chat(template, &named.source, &self.config.special_tokens, request)
    }

    fn request_template(&self, source: &str) -> Result<Arc<ChatTemplate>> {
        if let Some((_, t)) = self.request_templates.lock().iter().find(|(s, _)| s == source) {
            return Ok(t.clone());
        }
        let compiled = Arc::new(ChatTemplate::compile(&format!("{}/request", self.name), source)?);
        let mut cache = self.request_templates.lock();
        if cache.len() >= REQUEST_TEMPLATE_CACHE {
            cache.remove(0);
        }
        cache.push((source.to_string(), compiled.clone()));
        Ok(compiled)
    }

    /// Renders and tokenizes like `apply_chat_template(..., tokenize=True)` and vLLM's chat
    /// endpoint: the template carries the special tokens, so none are added on top.
    pub fn render_chat(&self, request: &ChatRequest) -> Result<Vec<u32>> {
        let text = self.render_chat_text(request)?;
        Ok(self.tokenize(&text, false)?.ids)
    }

    /// Tokenizes a completion prompt as vLLM's completions endpoint does (special tokens added).
    pub fn render_completion(&self, prompt: &str) -> Result<Vec<u32>> {
        Ok(self.tokenize(prompt, true)?.ids)
    }
}

/// What `TokenizersBackend.__init__` (transformers v5) does after reading tokenizer.json: named
/// special tokens missing from the vocabulary are added as special tokens. BOS/EOS insertion is
/// left to tokenizer.json's post-processor: with a tokenizer.json present, transformers v5 drops
/// `add_bos_token`/`add_eos_token` from the config, and so do we.
fn apply_transformers_adjustments(name: &str, tokenizer: &mut Tokenizer, config: &TokenizerConfig) -> Result<()> {
    let missing: Vec<AddedToken> = config
        .special_tokens
        .iter()
        .filter(|(_, token)| tokenizer.token_to_id(token).is_none())
        .map(|(_, token)| AddedToken::from(token.clone(), true).normalized(false))
        .collect();
    if !missing.is_empty() {
        tokenizer
            .add_special_tokens(missing)
            .map_err(|e| TokenizerError::InvalidTokenizer { model: name.into(), reason: e.to_string() })?;
    }
    Ok(())
}
