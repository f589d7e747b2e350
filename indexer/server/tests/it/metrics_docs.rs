//! docs/METRICS.md documents exactly the metrics `kvindex serve` exports, as their tables
//! declare them (`telemetry::METRICS`, discovery's and the chat-template sandbox's): every
//! metric once, nothing that does not exist, and each with its kind and labels.

#[test]
fn metrics_md_matches_the_metric_tables() {
    let tables = [
        kvindex_server::telemetry::METRICS,
        kvindex_discovery::metrics::METRICS,
        kvindex_tokenizer::client_template::METRICS,
    ];
    let mut problems: Vec<String> = tables.iter().flat_map(|t| kvindex_metric_defs::check_table(t)).collect();
    problems.extend(kvindex_metric_defs::doc::check(&tables, include_str!("../../../../docs/METRICS.md")));
    assert!(problems.is_empty(), "docs/METRICS.md disagrees with the metric tables:\n{}", problems.join("\n"));
}
