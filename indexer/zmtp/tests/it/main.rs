//! kvindex-zmtp's integration tests, one binary (ripgrep's `tests/tests.rs` layout): one link of
//! the crate and its test dependencies instead of one per file. Each module is a former test
//! file; run one with `cargo nextest run -p kvindex-zmtp --test it raw_peers::`.
//! `tests/decoder_fuzz.rs` stays a binary of its own: it installs a counting global allocator,
//! which would otherwise count (and slow) every other test here.

mod fuzz_corpus;
mod pyzmq_peers;
mod raw_peers;
mod support;
mod zeromq_crate_peers;
