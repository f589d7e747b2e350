//! kvindex-tokenizer: exact token ids for kvindex's prefix index. Loads HF tokenizers and chat
//! templates from local model directories and reproduces `transformers.apply_chat_template`
//! (what vLLM runs) in Rust, so routers key the index on the ids the engine actually caches.
//!
//! Library first: [`TokenizerRegistry`] is the whole API; [`grpc_service`] and [`server`] are a
//! thin shell serving llm-d's `tokenization.TokenizationService` on top of it.

pub mod chat_render;
pub mod chat_request;
pub mod client_template;
mod cut_finder;
pub mod echo;
pub mod error;
pub mod grpc_service;
pub mod incremental;
pub mod loaded_model;
pub mod model_cache;
pub mod model_files;
pub mod prefix_cache;
pub mod proto_convert;
pub mod python_json;
pub mod python_repr;
pub mod registry;
pub mod registry_config;
pub mod rejection;
pub mod server;
pub mod telemetry;
pub mod template_env;
pub mod template_value;
pub mod tokenized;

pub use chat_request::ChatRequest;
pub use client_template::{ClientTemplates, Sandbox, SandboxLimits};
pub use echo::echo;
pub use error::{Result, TokenizerError};
pub use loaded_model::{Bounded, LoadedModel, TokenizedText};
pub use prefix_cache::{PrefixCache, PrefixCacheStats};
pub use registry::TokenizerRegistry;
pub use registry_config::RegistryConfig;
