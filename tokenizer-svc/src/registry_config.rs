//! Which models exist and where their files are: `--model name=dir` pairs and `--models-dir`
//! scanning, validated before any tokenizer is loaded.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::client_template::ClientTemplates;
use crate::error::{Result, TokenizerError};
pub use crate::prefix_cache::DEFAULT_PREFIX_CACHE_BYTES;

/// Default number of tokenizers kept in memory at once.
pub const DEFAULT_MAX_LOADED_MODELS: usize = 8;

/// Model name → directory, the cache bounds, and the client-template policy.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    pub models: BTreeMap<String, PathBuf>,
    /// At most this many tokenizers stay loaded; the least recently used is dropped first.
    pub max_loaded_models: usize,
    /// Memory for tokenized prompt prefixes reused across requests (incremental tokenization),
    /// shared by all models; 0 disables reuse. In memory only, never persisted or logged.
    pub prefix_cache_bytes: usize,
    /// What happens to chat templates sent with requests: refused by default (see
    /// [`crate::client_template`]).
    pub client_templates: ClientTemplates,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            models: BTreeMap::new(),
            max_loaded_models: DEFAULT_MAX_LOADED_MODELS,
            prefix_cache_bytes: DEFAULT_PREFIX_CACHE_BYTES,
            client_templates: ClientTemplates::Refused,
        }
    }
}

impl RegistryConfig {
    /// Adds one `name=dir` pair (the `--model` flag's syntax).
    pub fn add_model_spec(&mut self, spec: &str) -> Result<()> {
        let (name, dir) = spec
            .split_once('=')
            .filter(|(n, d)| !n.is_empty() && !d.is_empty())
            .ok_or_else(|| TokenizerError::Config(format!("--model expects <name>=<dir>, got {spec:?}")))?;
        self.add_model(name, dir)
    }

    /// Adds a model; the directory must hold a `tokenizer.json`.
    pub fn add_model(&mut self, name: &str, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        if !dir.join("tokenizer.json").is_file() {
            return Err(TokenizerError::Config(format!("model {name:?}: {} has no tokenizer.json", dir.display())));
        }
        if self.models.insert(name.to_string(), dir.to_path_buf()).is_some() {
            return Err(TokenizerError::Config(format!("model {name:?} is configured twice")));
        }
        Ok(())
    }

    /// Adds every subdirectory of `root` holding a `tokenizer.json`, named after the subdirectory.
    pub fn add_models_dir(&mut self, root: impl AsRef<Path>) -> Result<usize> {
        let root = root.as_ref();
        let entries = std::fs::read_dir(root)
            .map_err(|e| TokenizerError::Config(format!("--models-dir {}: {e}", root.display())))?;
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.join("tokenizer.json").is_file() {
                if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                    found.push((name.to_string(), path.clone()));
                }
            }
        }
        found.sort();
        let count = found.len();
        for (name, path) in found {
            self.add_model(&name, path)?;
        }
        Ok(count)
    }
}
