//! The core is pure (no sockets, no async runtime, no clocks, no metrics): the crate graph
//! enforces it, and this test keeps the service's dependencies out of the core's manifest.

#[test]
fn the_core_depends_on_no_service_crate() {
    let manifest: toml::Table = include_str!("../../Cargo.toml").parse().expect("indexer/Cargo.toml parses");
    let deps = manifest["dependencies"].as_table().expect("[dependencies]");
    let service_only = [
        "tokio",
        "tonic",
        "tonic-health",
        "tonic-reflection",
        "axum",
        "zeromq",
        "metrics",
        "metrics-exporter-prometheus",
        "tracing",
        "tracing-subscriber",
        "kvindex-proto",
        "kvindex-tokenizer",
        "kvindex-server",
        "clap",
        "toml",
    ];
    let found: Vec<&str> = service_only.iter().copied().filter(|d| deps.contains_key(*d)).collect();
    assert!(found.is_empty(), "the pure core must not depend on {found:?}: they belong to indexer/server");
}
