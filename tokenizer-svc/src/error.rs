//! The one error type of the library, so callers (the gRPC shell, the indexer) can map each
//! failure to a precise status without parsing messages.
use std::path::PathBuf;

use crate::rejection::Rejection;

/// Everything that can go wrong between a request and its token ids.
///
/// `Display` is for the caller (it is returned in `error_message`): a template's own
/// `raise_exception` text is included and may quote the conversation. Logs must use
/// [`TokenizerError::log_summary`], which never carries request content.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The model name is not configured. The name is the client's: quoted cut and escaped
    /// ([`crate::echo`]), in the message and in logs.
    #[error("unknown model \"{}\"", crate::echo(.0))]
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
    /// A chat template sent with the request was not rendered: client templates are off
    /// (the default), or it went past a budget (output, time, memory), crashed its renderer,
    /// or no renderer was free. See [`crate::client_template`].
    #[error("chat template {template:?}: {detail}")]
    ClientTemplateRejected { template: String, reason: Rejection, detail: String },
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
            Self::ClientTemplateRejected { reason: Rejection::Disabled, .. } => "client_template_disabled",
            Self::ClientTemplateRejected { .. } => "client_template_rejected",
        }
    }

    /// A description safe to log: the kind, model or template name and line, never the
    /// template's message (which may quote the prompt) or request-derived text.
    pub fn log_summary(&self) -> String {
        match self {
            Self::UnknownModel(model) => format!("{} model=\"{}\"", self.kind(), crate::echo(model)),
            Self::NoChatTemplate(model) => format!("{} model={model:?}", self.kind()),
            Self::ModelFiles { model, path, .. } => {
                format!("{} model={model:?} path={}", self.kind(), path.display())
            }
            Self::InvalidTokenizer { model, .. } | Self::Encode { model, .. } => {
                format!("{} model={model:?}", self.kind())
            }
            Self::Template { template, line, .. } => {
                format!(
                    "{} template={template:?} line={}",
                    self.kind(),
                    line.map(|l| l.to_string()).unwrap_or("?".into())
                )
            }
            Self::InvalidRequest(_) | Self::Config(_) => self.kind().to_string(),
            Self::ClientTemplateRejected { template, reason, .. } => {
                format!("{} template={template:?} reason={}", self.kind(), reason.label())
            }
        }
    }

    /// Whether the caller is at fault (as opposed to the server's model files).
    pub fn is_client_error(&self) -> bool {
        match self {
            Self::UnknownModel(_) | Self::NoChatTemplate(_) | Self::Template { .. } | Self::InvalidRequest(_) => true,
            Self::ClientTemplateRejected { reason, .. } => reason.is_client_error(),
            _ => false,
        }
    }
}

/// Library result alias.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_summary_drops_template_messages_that_may_quote_the_prompt() {
        let err = TokenizerError::Template {
            template: "m/default".into(),
            line: Some(7),
            reason: "unknown system risk: my secret prompt".into(),
        };
        assert!(err.to_string().contains("my secret prompt"), "the caller gets the full message");
        assert_eq!(err.log_summary(), "template_error template=\"m/default\" line=7");
    }
}
