//! kvindex-router's integration tests, one binary (ripgrep's `tests/tests.rs` layout): one link of
//! the router, tonic, hyper, the Envoy types and the tokenizer stack instead of one per file. Each
//! module is a former test file; run one with `cargo nextest run -p kvindex-router --test it
//! keep_alive::`.

mod bad_requests;
mod client_templates;
mod config_docs;
mod connection_caps;
mod decision_quality;
mod discovery;
mod envoy;
mod ext_proc;
mod fail_open;
mod indexer_tls;
mod keep_alive;
mod limits;
mod metrics_docs;
mod mixed_fleet_load;
mod pd;
mod pod_owner;
mod pods;
mod prefill_queue;
mod proxy;
mod replicas;
mod sglang_dp;
mod shared_load;
mod sibling_burst;
mod stickiness;
mod support;
