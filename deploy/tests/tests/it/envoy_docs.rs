//! The Envoy snippets of the READMEs pass `envoy --mode validate` (deploy/tests/envoy_validate.py
//! makes a fragment whole first), so the docs cannot drift from what Envoy accepts. The shipped
//! manifests and chart renders are validated by Envoy in manifests.rs.

use std::process::Command;

use kvindex_deploy_tests::tools::{envoy, python, repo_root};
use serde_json::json;

const DOCS: [&str; 3] = ["docs/ROUTER-CONFIG.md", "deploy/README.md", "README.md"];

/// `(line, text)` of every fenced ```yaml block of `markdown` that is Envoy configuration (names
/// an Envoy filter or holds a bootstrap).
fn envoy_snippets(markdown: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start();
        match &mut open {
            None if fence.starts_with("```yaml") => open = Some((i + 1, String::new())),
            Some(_) if fence.starts_with("```") => {
                let (at, text) = open.take().unwrap();
                if text.contains("envoy.filters.") || text.contains("static_resources:") {
                    found.push((at, text));
                }
            }
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    found
}

#[test]
fn the_readme_envoy_snippets_are_valid_to_envoy() {
    let root = repo_root();
    let mut snippets = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        for (line, yaml) in envoy_snippets(&text) {
            snippets.push(json!({"where": format!("{doc}:{line}"), "yaml": yaml}));
        }
    }
    let wheres: Vec<&str> = snippets.iter().map(|s| s["where"].as_str().unwrap()).collect();
    assert!(
        wheres.iter().any(|w| w.starts_with("docs/ROUTER-CONFIG.md")),
        "the pre-filter chain snippet is gone: {wheres:?}"
    );
    kvindex_testkit::run::output_ok_with_stdin(
        Command::new(python()).arg(root.join("deploy/tests/envoy_validate.py")).arg("--envoy").arg(envoy()).arg("-"),
        serde_json::to_string(&snippets).unwrap().as_bytes(),
        &format!("README Envoy snippets ({wheres:?})"),
    );
}

#[test]
fn snippets_are_found_in_yaml_fences_only() {
    let doc = "text\n```yaml\nhttp_filters:\n- name: envoy.filters.http.router\n```\n```yaml\nkind: Service\n```\n\
               ```\nenvoy.filters.http.router\n```\n";
    let found = envoy_snippets(doc);
    assert_eq!(found, [(2, "http_filters:\n- name: envoy.filters.http.router\n".to_string())]);
}
