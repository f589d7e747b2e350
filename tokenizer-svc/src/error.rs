//! The one error type of the library, so callers (the gRPC shell, the indexer) can map each
//! failure to a precise status without parsing messages.
use std::path::PathBuf;

/// Everything that can go wrong between a request and its token ids.
///
/// Messages never contain prompt text or token ids: only model names, paths and template
/// positions, so they are safe to log and to return to clients.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The model name is not configured.
    #[error("unknown model {0:?}")]
    UnknownModel(String),
    /// A model directory lacks a file the model needs, or a file cannot be read.
    #[error("model {model:?}: cannot read {path}: {reason}")]
    ModelFiles { model: String, path: PathBuf, reason: String },
    /// `tokenizer.json` could not be parsed or built.
    #[error("model {model:?}: invalid tokenizer: {reason}")]
    InvalidTokenizer { model: String, reason: String },
    /// The model has no chat template and the request supplied none.
    #[error("model {0:?} has no chat template")]
    NoChatTemplate(String),
    /// The template does not compile or fails while rendering (including `raise_exception`).
    #[error("chat template {template:?}{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Template { template: String, line: Option<usize>, reason: String },
    /// The request itself is malformed (bad JSON kwargs, empty conversation, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The tokenizer failed on the text.
    #[error("model {model:?}: tokenization failed: {reason}")]
    Encode { model: String, reason: String },
    /// Configuration given at start-up is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl TokenizerError {
    /// A short stable label for metrics (`outcome` label).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnknownModel(_) => "unknown_model",
            Self::ModelFiles { .. } => "model_files",
            Self::InvalidTokenizer { .. } => "invalid_tokenizer",
            Self::NoChatTemplate(_) => "no_chat_template",
            Self::Template { .. } => "template_error",
            Self::InvalidRequest(_) => "invalid_request",
            Self::Encode { .. } => "encode_error",
            Self::Config(_) => "config_error",
        }
    }

    /// Whether the caller is at fault (as opposed to the server's model files).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            Self::UnknownModel(_) | Self::NoChatTemplate(_) | Self::Template { .. } | Self::InvalidRequest(_)
        )
    }
}

/// Library result alias.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
