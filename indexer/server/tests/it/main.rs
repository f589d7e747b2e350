//! kvindex-server's integration tests, one binary (ripgrep's `tests/tests.rs` layout): one link of
//! the service, tonic, axum and RocksDB instead of one per file. Each module is a former test
//! file; run one with `cargo nextest run -p kvindex-server --test it service_api::`. nextest runs
//! every test in a process of its own, so the tests that set process-wide state (the Prometheus
//! recorder, the admin token file) see no other test's.

mod cli_record_replay;
mod cli_replay_hostile;
mod cli_serve;
mod cli_vllm_hash;
mod config_docs;
mod engine_vectors;
mod metrics_docs;
mod real_engine_dump;
mod service_api;
mod service_attacks;
mod service_attacks_grpc;
mod service_backpressure;
mod service_bootstrap;
mod service_catch_up;
mod service_descriptors;
mod service_disconnect;
mod service_discovery;
mod service_discovery_engine;
mod service_engine_units;
mod service_faults;
mod service_gap_replay;
mod service_http_limits;
mod service_llmd;
mod service_pod_owner;
mod service_record_route;
mod service_replay_queue;
mod service_reservations;
mod service_sglang;
mod service_sglang_releases;
mod service_snapshot;
mod service_source_table;
mod service_staleness;
mod service_tls;
mod service_vectors;
mod support;
mod vectors_decode;
