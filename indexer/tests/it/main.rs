//! The core's integration tests, one binary (ripgrep's `tests/tests.rs` layout): one link of the
//! core, proptest and the vectors' readers instead of one per file. Each module is a former test
//! file; run one with `cargo nextest run -p kvindex --test it index_model::`.

mod core_has_no_io;
mod digest_model;
mod engine_sources;
mod fuzz_corpus;
mod hybrid_coordinator;
mod index_model;
mod malformed_input;
mod real_hybrid_engine;
mod support;
mod tier_bounds;
mod vectors_ingest;
mod vllm_hash_vectors;
