//! The simulator's tokenizers: how text prompts and chats become token ids, and generated ids
//! become text.
//!
//! By default one token per UTF-8 byte (id = byte value): trivial, deterministic and exactly
//! reversible, so text prompts and generated text round-trip: a client that sends a
//! conversation back as text gets the same token ids, and therefore the same block hashes, as
//! the pod generated. With `--tokenizer <dir>` the pod tokenizes as vLLM does, through the
//! tokenizer-svc library: completions with the tokenizer's special tokens (BOS per its
//! post-processor), chats through the model's own chat template.

use std::path::Path;
use std::sync::Arc;

use kvindex_tokenizer::{ChatRequest, RegistryConfig, TokenizerRegistry};
use serde_json::Value;

/// How a pod turns text into token ids. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub enum PromptTokenizer {
    /// One token per byte, the `<|role|>` chat rendering below.
    #[default]
    Bytes,
    /// A real vocabulary and chat template, loaded once at start.
    Model {
        registry: Arc<TokenizerRegistry>,
        /// The registry's name for the model (the served model name).
        model: String,
    },
}

impl PromptTokenizer {
    /// Loads `dir` (a `tokenizer.json`, and `tokenizer_config.json` for the chat template)
    /// now, so a bad directory fails the start rather than the first request.
    pub fn load(model: &str, dir: &Path) -> Result<PromptTokenizer, String> {
        let mut config = RegistryConfig::default();
        config.add_model(model, dir).map_err(|e| format!("--tokenizer {}: {e}", dir.display()))?;
        let registry = TokenizerRegistry::new(config);
        registry.initialize(model).map_err(|e| format!("--tokenizer {}: {e}", dir.display()))?;
        Ok(PromptTokenizer::Model { registry: Arc::new(registry), model: model.to_string() })
    }

    /// A completion prompt's ids, as vLLM's `/v1/completions` computes them.
    pub fn completion(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            PromptTokenizer::Bytes => Ok(encode(text)),
            PromptTokenizer::Model { registry, model } => {
                registry.render_completion(model, text).map_err(|e| e.to_string())
            }
        }
    }

    /// A chat's prompt ids, with the generation prompt, as vLLM's `/v1/chat/completions`
    /// renders them. `messages` are `(role, text)` pairs, content parts already joined.
    pub fn chat(&self, messages: &[(String, String)]) -> Result<Vec<u32>, String> {
        match self {
            PromptTokenizer::Bytes => Ok(encode(&render_chat(messages))),
            PromptTokenizer::Model { registry, model } => {
                let mut request = ChatRequest::from_messages(
                    messages
                        .iter()
                        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
                        .collect::<Vec<Value>>(),
                );
                // vLLM's chat endpoint default; without it the template stops before the
                // assistant's turn and the prompt differs from the engine's.
                request.add_generation_prompt = true;
                registry.render_chat(model, &request).map_err(|e| e.to_string())
            }
        }
    }

    /// Text of generated ids. With a real vocabulary the ids are whatever the engine's output
    /// alphabet says, so the text need not re-tokenize to the same ids.
    pub fn decode(&self, tokens: &[u32]) -> String {
        match self {
            PromptTokenizer::Bytes => decode(tokens),
            PromptTokenizer::Model { registry, model } => registry
                .model(model)
                .ok()
                .and_then(|loaded| loaded.tokenizer().decode(tokens, false).ok())
                .unwrap_or_else(|| "\u{fffd}".repeat(tokens.len())),
        }
    }

    /// True when tokenizing may take long enough (a real vocabulary) to belong off the
    /// async workers.
    pub fn is_expensive(&self) -> bool {
        matches!(self, PromptTokenizer::Model { .. })
    }
}

pub fn encode(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// Bytes are decoded as UTF-8 (invalid sequences as U+FFFD). Token ids above 255 (sent as
/// ids, not text) have no byte and decode as U+FFFD.
pub fn decode(tokens: &[u32]) -> String {
    let mut text = String::new();
    // Runs of byte tokens between ids above 255; each boundary becomes one U+FFFD.
    for run in tokens.split(|&token| token > 255) {
        let bytes: Vec<u8> = run.iter().map(|&token| token as u8).collect();
        text.push_str(&String::from_utf8_lossy(&bytes));
        text.push('\u{fffd}');
    }
    text.pop(); // n boundaries give n + 1 runs: drop the marker after the last one
    text
}

/// The chat template: each message as `<|role|>\n{content}\n`, then `<|assistant|>\n`.
pub fn render_chat(messages: &[(String, String)]) -> String {
    let mut text = String::new();
    for (role, content) in messages {
        text.push_str("<|");
        text.push_str(role);
        text.push_str("|>\n");
        text.push_str(content);
        text.push('\n');
    }
    text.push_str("<|assistant|>\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips() {
        let text = "héllo wörld";
        assert_eq!(decode(&encode(text)), text);
        assert_eq!(encode("ab"), vec![97, 98]);
        assert_eq!(decode(&[104, 1000, 105]), "h\u{fffd}i");
    }
}
