//! kvindex-loadtest: a simulated vLLM fleet for testing and benchmarking kvindex.
//!
//! [`engine`] is the pure pod model (prefix cache, scheduler, timing, events); [`wire`] turns
//! its events into vLLM's exact ZeroMQ messages and serves replay; [`http`] is the
//! OpenAI-compatible API of one pod; [`pod`] runs an engine on the wall clock; [`cli`] is the
//! `kvindex-sim` command line.

pub mod cli;
pub mod engine;
pub mod fleet;
pub mod http;
pub mod pod;
pub mod wire;
