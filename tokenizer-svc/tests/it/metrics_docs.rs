//! tokenizer-svc/README.md's metrics table documents exactly the metrics the tokenizer
//! declares (`telemetry::METRICS` and the chat-template sandbox's): every metric once, nothing
//! that does not exist, and each with its kind and labels.

#[test]
fn readme_metrics_match_the_metric_tables() {
    let tables = [kvindex_tokenizer::telemetry::METRICS, kvindex_tokenizer::client_template::METRICS];
    let mut problems: Vec<String> = tables.iter().flat_map(|t| kvindex_metric_defs::check_table(t)).collect();
    problems.extend(kvindex_metric_defs::doc::check(&tables, include_str!("../../README.md")));
    assert!(problems.is_empty(), "tokenizer-svc/README.md disagrees with the metric tables:\n{}", problems.join("\n"));
}
