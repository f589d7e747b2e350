//! Bodies of the `kvindex` subcommands; `main.rs` only parses arguments and dispatches.

pub mod decode;
pub mod serve;
pub mod vllm_hash;
