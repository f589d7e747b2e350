//! The library's front door: model name in, token ids out. The gRPC service, the CLI and the
//! indexer's in-process `GetPodScores` all go through `TokenizerRegistry`, and all get
//! incremental tokenization from it: prefixes tokenized before are reused from a bounded cache
//! (see [`crate::incremental`]), with the same ids as tokenizing in full.
use std::sync::Arc;

use crate::chat_request::ChatRequest;
use crate::error::{Result, TokenizerError};
use crate::loaded_model::{Bounded, LoadedModel, TokenizedText};
use crate::model_cache::ModelCache;
use crate::prefix_cache::{PrefixCache, PrefixCacheStats};
use crate::registry_config::RegistryConfig;

/// Configured models, loaded lazily into a bounded cache. Share it as `Arc<TokenizerRegistry>`;
/// every method is `&self` and CPU-bound (call it from `spawn_blocking` in async code).
///
/// ```no_run
/// use kvindex_tokenizer::{ChatRequest, RegistryConfig, TokenizerRegistry};
/// let mut config = RegistryConfig::default();
/// config.add_model_spec("deepseek=/models/deepseek").unwrap();
/// let registry = TokenizerRegistry::new(config);
/// let ids = registry.tokenize("deepseek", "Hello", true).unwrap().ids;
/// let chat = ChatRequest::from_messages(vec![serde_json::json!({"role": "user", "content": "Hi"})]);
/// let chat_ids = registry.render_chat("deepseek", &chat).unwrap();
/// # let _ = (ids, chat_ids);
/// ```
#[derive(Debug)]
pub struct TokenizerRegistry {
    config: RegistryConfig,
    cache: ModelCache,
    prefixes: PrefixCache,
}

impl TokenizerRegistry {
    pub fn new(config: RegistryConfig) -> Self {
        let cache = ModelCache::new(config.max_loaded_models);
        let prefixes = PrefixCache::new(config.prefix_cache_bytes);
        Self { config, cache, prefixes }
    }

    /// Prefix reuse so far (hits, misses, tokens reused vs tokenized) and the cache's size, for
    /// metrics. Counts only: the cache's content never leaves it.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.prefixes.stats()
    }

    /// Configured model names, sorted.
    pub fn model_names(&self) -> Vec<String> {
        self.config.models.keys().cloned().collect()
    }

    /// Names of the models currently in memory.
    pub fn loaded_model_names(&self) -> Vec<String> {
        self.cache.loaded()
    }

    /// The model, loading it on first use (and after eviction).
    pub fn model(&self, name: &str) -> Result<Arc<LoadedModel>> {
        if let Some(model) = self.cache.get(name) {
            return Ok(model);
        }
        let dir = self.config.models.get(name).ok_or_else(|| TokenizerError::UnknownModel(name.to_string()))?;
        let started = std::time::Instant::now();
        let loaded = LoadedModel::load_with(name, dir, self.config.client_templates.clone());
        metrics::counter!(crate::telemetry::MODEL_LOADS, "outcome" => if loaded.is_ok() { "ok" } else { "error" })
            .increment(1);
        let (model, evicted) = self.cache.insert(name, Arc::new(loaded?));
        tracing::info!(model = name, elapsed_ms = started.elapsed().as_millis() as u64, "tokenizer loaded");
        for gone in evicted {
            metrics::counter!(crate::telemetry::MODEL_EVICTIONS).increment(1);
            tracing::info!(model = gone.name(), "tokenizer evicted from cache");
            self.prefixes.purge_model(gone.instance());
        }
        Ok(model)
    }

    /// Loads the model ahead of traffic (llm-d's `InitializeTokenizer`).
    pub fn initialize(&self, model: &str) -> Result<()> {
        self.model(model).map(|_| ())
    }

    /// Encodes plain text, with character offsets.
    pub fn tokenize(&self, model: &str, text: &str, add_special_tokens: bool) -> Result<TokenizedText> {
        self.model(model)?.tokenize_reusing(&self.prefixes, text, add_special_tokens)
    }

    /// Renders a chat to prompt text (no tokenization).
    pub fn render_chat_text(&self, model: &str, request: &ChatRequest) -> Result<String> {
        self.model(model)?.render_chat_text(request)
    }

    /// Renders and tokenizes a chat exactly as vLLM's chat endpoint would.
    pub fn render_chat(&self, model: &str, request: &ChatRequest) -> Result<Vec<u32>> {
        let model = self.model(model)?;
        let text = model.render_chat_text(request)?;
        model.ids_reusing(&self.prefixes, &text, false)
    }

    /// [`Self::render_chat`] against a token limit: tokenization stops once the running count
    /// passes `limit` at a cut point (see [`LoadedModel::ids_within`]).
    pub fn render_chat_within(&self, model: &str, request: &ChatRequest, limit: usize) -> Result<Bounded> {
        let model = self.model(model)?;
        let text = model.render_chat_text(request)?;
        model.ids_within(&self.prefixes, &text, false, limit)
    }

    /// [`Self::render_completion`] against a token limit.
    pub fn render_completion_within(&self, model: &str, prompt: &str, limit: usize) -> Result<Bounded> {
        self.model(model)?.ids_within(&self.prefixes, prompt, true, limit)
    }

    /// Tokenizes a completion prompt exactly as vLLM's completions endpoint would.
    pub fn render_completion(&self, model: &str, prompt: &str) -> Result<Vec<u32>> {
        self.model(model)?.ids_reusing(&self.prefixes, prompt, true)
    }
}
