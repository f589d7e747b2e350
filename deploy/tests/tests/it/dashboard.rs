//! Every metric the Grafana dashboard charts must be one the code exports (name and, for
//! histograms, the series the exporter really writes), so a renamed or dropped metric fails
//! here, not as an empty panel in production.

use kvindex_deploy_tests::{exported::Exported, promql, tools::repo_root};
use serde_json::Value;

fn exprs(panels: &[Value], out: &mut Vec<(String, String)>) {
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        if let Some(inner) = p["panels"].as_array() {
            exprs(inner, out);
        }
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("panel {title:?} has no targets"));
        assert!(!targets.is_empty(), "panel {title:?} has no queries");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
            out.push((title.clone(), expr.to_string()));
        }
    }
}

#[test]
fn every_panel_charts_only_exported_metrics() {
    let root = repo_root();
    let dirs = ["indexer/server/src", "indexer/discovery/src", "router/src", "tokenizer-svc/src"].map(|d| root.join(d));
    let exported = Exported::from_dirs(&dirs.iter().map(|d| d.as_path()).collect::<Vec<_>>());
    assert!(exported.names.len() > 60, "too few metric names found in the sources: {:?}", exported.names);
    assert!(exported.bucketed.contains("kvindex_score_latency_seconds"), "bucket configuration not found");

    let text = std::fs::read_to_string(root.join("deploy/grafana/kvindex.json")).expect("read the dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut all = Vec::new();
    exprs(dashboard["panels"].as_array().expect("panels"), &mut all);
    assert!(all.len() >= 30, "only {} queries", all.len());

    let mut unknown = Vec::new();
    let mut used = std::collections::BTreeSet::new();
    for (title, expr) in &all {
        let names = promql::metric_names(expr);
        if names.is_empty() {
            unknown.push(format!("{title}: no metric in {expr:?}"));
        }
        for n in names {
            if !exported.exposes(&n) {
                unknown.push(format!("{title}: {n} is not a series the code exports"));
            }
            used.insert(n);
        }
    }
    assert!(unknown.is_empty(), "dashboard problems:\n{}", unknown.join("\n"));

    // What the issue asks the dashboard to show, by the metric that shows it.
    for needed in [
        "kvindex_sources",
        "kvindex_gaps_total",
        "kvindex_replays_total",
        "kvindex_blocks_total",
        "kvindex_event_to_visible_seconds_bucket",
        "kvindex_score_latency_seconds_bucket",
        "kvindex_index_entries",
        "kvindex_router_picks_total",
        "kvindex_router_fail_open_total",
        // Decision quality: best-overlap picks, reuse on offer vs delivered.
        "kvindex_router_overlap_picks_total",
        "kvindex_router_best_cached_blocks_total",
        "kvindex_router_overlap_given_up_blocks_bucket",
        "kvindex_router_cache_prediction_total",
        "kvindex_router_engine_cached_tokens_total",
        "kvindex_router_predicted_cached_tokens_total",
    ] {
        assert!(used.contains(needed), "the dashboard does not chart {needed}");
    }
}
