//! The library's chat request: the inputs of HF's `apply_chat_template`, as plain JSON so any
//! front end (llm-d's gRPC, OpenAI JSON, the indexer) can build one without lossy conversions.
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// One chat to render, mirroring `apply_chat_template(conversation, tools, documents, ...)`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ChatRequest {
    /// Messages as JSON objects (`role`, `content` as a string or a list of parts,
    /// `tool_calls`, `reasoning_content`, ...). Keys with `null` values are dropped, as HF does.
    pub messages: Vec<Json>,
    /// Tool JSON schemas; `None` renders with `tools = None`, as HF does without tools.
    pub tools: Option<Vec<Json>>,
    /// RAG documents; `None` renders with `documents = None`.
    pub documents: Option<Vec<Json>>,
    /// Overrides the model's template when set.
    pub chat_template: Option<String>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// Extra template variables (`chat_template_kwargs`), e.g. `enable_thinking`. They override
    /// the special tokens of the same name.
    pub template_kwargs: Map<String, Json>,
}

impl ChatRequest {
    /// A request with only messages, the common case.
    pub fn from_messages(messages: Vec<Json>) -> Self {
        Self { messages, ..Default::default() }
    }
}
