//! kvindex-discovery's integration tests, one binary (ripgrep's `tests/tests.rs` layout): one
//! link of the crate and its test dependencies instead of one per file. Each module is a former
//! test file; run one with `cargo nextest run -p kvindex-discovery --test it desired::`.

mod desired;
mod engine_probe;
mod watcher;
