//! kvindex-tokenizer's integration tests, one binary (ripgrep's `tests/tests.rs` layout): one link
//! of the tokenizer stack, tonic and minijinja instead of one per file. Each module is a former
//! test file; run one with `cargo nextest run -p kvindex-tokenizer --test it oracle::`.

mod cli;
mod client_templates;
mod common;
mod grpc_python_e2e;
mod grpc_service;
mod incremental;
mod incremental_rules;
mod library;
mod metrics_docs;
mod oracle;
mod render_paths;
mod robustness;
