//! One model ready to serve: its tokenizer adjusted the way `transformers` v5 adjusts it on load
//! (named special tokens from `tokenizer_config.json` added; BOS/EOS left to tokenizer.json's
//! post-processor), its chat templates compiled once, and what incremental tokenization may cut.
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use tokenizers::{AddedToken, Tokenizer};

use crate::chat_render::{render_chat, render_chat_with};
use crate::chat_request::ChatRequest;
use crate::client_template::{self, ClientTemplates};
use crate::error::{Result, TokenizerError};
use crate::incremental::{self, CutPlan, Encoded};
use crate::model_files::{ModelDir, NamedTemplate, TokenizerConfig};
use crate::prefix_cache::PrefixCache;
use crate::template_env::ChatTemplate;
pub use crate::tokenized::{Bounded, TokenizedText};

/// A loaded model. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct LoadedModel {
    name: String,
    /// Unique per load, so cached prefixes never outlive or cross models.
    instance: u64,
    tokenizer: Tokenizer,
    /// Where texts may be cut for incremental tokenization, or why they may not.
    cuts: std::result::Result<CutPlan, String>,
    config: TokenizerConfig,
    templates: Vec<(NamedTemplate, ChatTemplate)>,
    /// What happens to templates sent with requests.
    client_templates: ClientTemplates,
    /// Templates sent with requests (llm-d may send one on every call), compiled once each;
    /// only with [`ClientTemplates::Trusted`].
    request_templates: Mutex<Vec<(String, Arc<ChatTemplate>)>>,
}

/// How many distinct trusted request-supplied templates stay compiled per model.
const REQUEST_TEMPLATE_CACHE: usize = 8;

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel").field("name", &self.name).finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// Loads `dir` as model `name`, refusing templates sent with requests. Template syntax
    /// errors surface here, naming the template.
    pub fn load(name: &str, dir: &Path) -> Result<Self> {
        Self::load_with(name, dir, ClientTemplates::Refused)
    }

    /// [`Self::load`], with `client_templates` deciding what happens to templates sent with
    /// requests.
    pub fn load_with(name: &str, dir: &Path, client_templates: ClientTemplates) -> Result<Self> {
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
        let cuts = CutPlan::analyze(&tokenizer);
        match &cuts {
            Ok(plan) => {
                tracing::debug!(model = name, cut_tokens = plan.cut_token_count(), "incremental tokenization enabled")
            }
            Err(reason) => tracing::info!(
                model = name,
                reason = reason.as_str(),
                "incremental tokenization disabled: every request is tokenized in full"
            ),
        }
        Ok(Self {
            name: name.into(),
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            tokenizer,
            cuts,
            config,
            templates,
            client_templates,
            request_templates: Mutex::new(Vec::new()),
        })
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

    pub(crate) fn instance(&self) -> u64 {
        self.instance
    }

    /// Why this model's texts are always tokenized in full (`None`: prefixes are reused).
    pub fn incremental_disabled_reason(&self) -> Option<&str> {
        self.cuts.as_ref().err().map(String::as_str)
    }

    fn encode_error(&self, e: tokenizers::Error) -> TokenizerError {
        TokenizerError::Encode { model: self.name.clone(), reason: e.to_string() }
    }

    /// Encodes `text` in full, without the prefix cache; `add_special_tokens` applies
    /// tokenizer.json's post-processor (BOS/EOS).
    pub fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<TokenizedText> {
        let encoding =
            self.tokenizer.encode_char_offsets(text, add_special_tokens).map_err(|e| self.encode_error(e))?;
        let offsets = encoding.get_offsets().iter().map(|&(s, e)| (s as u32, e as u32)).collect();
        Ok(TokenizedText { ids: encoding.get_ids().to_vec(), offsets })
    }

    /// Ids of `text` in full, without the prefix cache (no offsets computed).
    fn full_ids(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self.tokenizer.encode_fast(text, add_special_tokens).map_err(|e| self.encode_error(e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Like [`Self::tokenize`] (same ids and offsets), reusing prefixes stored in `cache` and
    /// storing this text's (see [`crate::incremental`]).
    pub fn tokenize_reusing(&self, cache: &PrefixCache, text: &str, add_special_tokens: bool) -> Result<TokenizedText> {
        if let Some(Encoded::Done(done)) = self.incremental(cache, text, add_special_tokens, true, None)? {
            return Ok(done);
        }
        let full = self.tokenize(text, add_special_tokens)?;
        cache.record_bypass(full.ids.len());
        Ok(full)
    }

    /// The ids of [`Self::tokenize_reusing`], without computing offsets.
    pub fn ids_reusing(&self, cache: &PrefixCache, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        if let Some(Encoded::Done(done)) = self.incremental(cache, text, add_special_tokens, false, None)? {
            return Ok(done.ids);
        }
        let ids = self.full_ids(text, add_special_tokens)?;
        cache.record_bypass(ids.len());
        Ok(ids)
    }

    /// The ids of [`Self::ids_reusing`] when there are at most `limit`; past it, tokenization
    /// stops at the first cut point past the limit (a text without cut points is tokenized in
    /// full and then compared).
    pub fn ids_within(
        &self,
        cache: &PrefixCache,
        text: &str,
        add_special_tokens: bool,
        limit: usize,
    ) -> Result<Bounded> {
        let ids = match self.incremental(cache, text, add_special_tokens, false, Some(limit))? {
            Some(Encoded::Done(done)) => done.ids,
            Some(Encoded::OverLimit { counted }) => return Ok(Bounded::OverLimit { counted }),
            None => {
                let ids = self.full_ids(text, add_special_tokens)?;
                cache.record_bypass(ids.len());
                ids
            }
        };
        Ok(if ids.len() > limit { Bounded::OverLimit { counted: ids.len() } } else { Bounded::Ids(ids) })
    }

    fn incremental(
        &self,
        cache: &PrefixCache,
        text: &str,
        add_special_tokens: bool,
        with_offsets: bool,
        limit: Option<usize>,
    ) -> Result<Option<Encoded>> {
        let Ok(plan) = &self.cuts else {
            return Ok(None);
        };
        incremental::encode(plan, &self.tokenizer, cache, self.instance, text, add_special_tokens, with_offsets, limit)
            .map_err(|e| self.encode_error(e))
    }

    /// Renders the chat to text exactly as `apply_chat_template(..., tokenize=False)`.
    pub fn render_chat_text(&self, request: &ChatRequest) -> Result<String> {
        if let Some(source) = &request.chat_template {
            return self.render_client_template(source, request);
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

    /// A template that came with the request: refused, sandboxed or trusted, per the policy.
    fn render_client_template(&self, source: &str, request: &ChatRequest) -> Result<String> {
        let name = format!("{}/request", self.name);
        match &self.client_templates {
            ClientTemplates::Refused => Err(client_template::disabled(&name)),
            ClientTemplates::Sandboxed(sandbox) => {
                render_chat_with(source, &self.config.special_tokens, request, |context| {
                    sandbox.render(&name, source, context)
                })
            }
            ClientTemplates::Trusted => {
                let template = self.request_template(source)?;
                render_chat(&template, source, &self.config.special_tokens, request)
            }
        }
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
    /// endpoint: the template carries the special tokens, so none are added on top. In full,
    /// without the prefix cache (the registry's `render_chat` uses it).
    pub fn render_chat(&self, request: &ChatRequest) -> Result<Vec<u32>> {
        let text = self.render_chat_text(request)?;
        self.full_ids(&text, false)
    }

    /// Tokenizes a completion prompt as vLLM's completions endpoint does (special tokens added),
    /// in full, without the prefix cache.
    pub fn render_completion(&self, prompt: &str) -> Result<Vec<u32>> {
        self.full_ids(prompt, true)
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
