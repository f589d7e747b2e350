//! kvindex-loadtest's integration tests, one binary (ripgrep's `tests/tests.rs` layout): one link
//! of the simulator, the policies runner and the tokenizer stack instead of one per file. Each
//! module is a former test file; run one with `cargo nextest run -p kvindex-loadtest --test it
//! sim_sockets::`.

mod cached_tokens;
mod kvindex_serve;
mod plot;
mod policies;
mod policies_grpc;
mod policies_router;
mod sglang_wire;
mod sim_sockets;
mod sim_tokenizer;
mod support;
mod vectors;
