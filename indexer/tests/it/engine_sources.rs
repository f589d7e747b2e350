//! SGLang's own captures (testdata/sglang-vectors) and TensorRT-LLM's format
//! (testdata/trtllm-vectors) through the core: the DP endpoint rule for every recorded rank,
//! and what their stores may credit. A salted store credits only salted prompts, bigram
//! (EAGLE) pages, partial last pages and multimodal blocks credit no plain prompt, whole pages
//! credit exactly their prefix.

use crate::support::{frames_of, read_records, sglang_frame_files, sglang_vectors_dir};
use kvindex::sglang::ports::{publisher_rank, rank_endpoint};
use kvindex::sglang::PageRules;
use kvindex::wire::{self, Engine, Event, EventBatch};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery, SkipReason};
use serde_json::Value;

const MODEL: &str = "Qwen/Qwen3-0.6B";

#[test]
fn every_recorded_rank_endpoint_follows_the_rule() {
    let records = read_records(&sglang_vectors_dir().join("endpoints-sglang.jsonl"));
    let mut checked = 0;
    for r in &records {
        match r["kind"].as_str() {
            Some("rank_endpoints") => {
                let rank = r["attn_dp_rank"].as_u64().unwrap() as u32;
                for (configured, got, error) in
                    [("endpoint", "pub", "pub_error"), ("replay_endpoint", "replay", "replay_error")]
                {
                    let Some(endpoint) = r[configured].as_str() else {
                        assert!(r[got].is_null());
                        continue;
                    };
                    match rank_endpoint(endpoint, rank) {
                        Ok(e) => assert_eq!(Some(e.as_str()), r[got].as_str(), "{r}"),
                        Err(e) => {
                            assert_eq!(r[got], "error", "{r}");
                            assert!(r[error].as_str().unwrap().ends_with(&e.to_string()), "{r}");
                        }
                    }
                    checked += 1;
                }
            }
            Some("select_kv_publisher_dp_rank") if !r["result"].is_null() => {
                let got = publisher_rank(
                    r["attn_dp_size"].as_u64().unwrap() as u32,
                    r["attn_dp_rank"].as_u64().unwrap() as u32,
                    r["dp_rank"].as_u64().map(|d| d as u32),
                );
                assert_eq!(u64::from(got), r["result"].as_u64().unwrap(), "{r}");
                checked += 1;
            }
            _ => {}
        }
    }
    assert!(checked >= 100, "only {checked} endpoint checks");
}

/// The live records of one release and scenario, in seq order.
fn live(version: &str, scenario: &str) -> Vec<Value> {
    let path = sglang_frame_files()
        .into_iter()
        .find(|p| p.file_name().unwrap().to_str().unwrap() == format!("frames-sglang-{version}.jsonl"))
        .expect("release file");
    read_records(&path).into_iter().filter(|r| r["scenario"] == scenario && r["kind"] == "live").collect()
}

/// Decodes a live record's payload as SGLang's and applies it after the page rules.
fn apply(index: &KvIndex, record: &Value, rules: PageRules) -> kvindex::ApplyReport {
    let frames = frames_of(record);
    let mut batch: EventBatch<'_> = wire::decode_batch_as(Engine::Sglang, &frames[2]).expect("decodes");
    let (partial, unkeyable) = rules.keep_servable(&mut batch, index.block_size());
    let mut report = index.apply("pod-a", MODEL, &batch);
    report.skipped[SkipReason::ALL.iter().position(|r| *r == SkipReason::PartialPage).unwrap()] += partial;
    report.skipped[SkipReason::ALL.iter().position(|r| *r == SkipReason::UnkeyableTokens).unwrap()] += unkeyable;
    report
}

/// The token ids of every plain store in `records`, concatenated (one chain per scenario).
fn stored_tokens(records: &[Value]) -> Vec<u32> {
    let mut out = Vec::new();
    for r in records {
        let frames = frames_of(r);
        let batch = wire::decode_batch_as(Engine::Sglang, &frames[2]).unwrap();
        for e in &batch.events {
            if let Event::BlockStored(s) = e {
                out.extend(s.token_ids.clone().unwrap_or_default());
            }
        }
    }
    out
}

/// Blocks matched for a prompt of `tokens` and one more token (the engine computes a prompt's
/// last token, so a prompt of exactly its held blocks is credited one block less).
fn matched(index: &KvIndex, tokens: &[u32], salt: Option<&str>) -> u32 {
    let prompt = [tokens, &[0]].concat();
    let q = ScoreQuery { model: MODEL, lora_name: None, cache_salt: salt, token_ids: &prompt, pods: None };
    index.score(&q).matches.first().map_or(0, |m| m.matched_blocks)
}

#[test]
fn a_salted_store_credits_only_salted_prompts() {
    for version in ["0.5.19", "0.5.23"] {
        let records = live(version, "cache-salt");
        let index = KvIndex::new(KvIndexConfig::default());
        let first = &records[0];
        let report = apply(&index, first, PageRules { page_size: Some(16) });
        assert!(report.stored_blocks > 0, "{version}: {report:?}");
        let tokens = stored_tokens(std::slice::from_ref(first));
        let salt = "tenant-a-salt";
        assert_eq!(matched(&index, &tokens, None), 0, "{version}: an unsalted prompt is never credited");
        assert_eq!(matched(&index, &tokens, Some("other-salt")), 0, "{version}");
        assert_eq!(matched(&index, &tokens, Some(salt)) as usize, tokens.len() / 16, "{version}");
    }
}

#[test]
fn whole_pages_credit_and_removals_take_them_back() {
    for version in ["0.5.6", "0.5.19", "0.5.23"] {
        let records = live(version, "main");
        let index = KvIndex::new(KvIndexConfig::default());
        let first = apply(&index, &records[0], PageRules { page_size: Some(16) });
        assert!(first.stored_blocks > 0, "{version}: {first:?}");
        let tokens = stored_tokens(&records[..1]);
        assert_eq!(matched(&index, &tokens, None) as usize, tokens.len() / 16, "{version}");
        // Every later batch applies without an unresolved parent; at the end the pod holds
        // what the engine still holds (the scenario ends with removals and a clear).
        for r in &records[1..] {
            let report = apply(&index, r, PageRules { page_size: Some(16) });
            assert_eq!(
                report.skipped(SkipReason::ParentUnknown),
                0,
                "{version} seq {}: {report:?}",
                r["expect"]["seq"]
            );
        }
    }
}

#[test]
fn bigram_and_partial_pages_never_credit() {
    for version in ["0.5.6", "0.5.19", "0.5.23"] {
        let index = KvIndex::new(KvIndexConfig::default());
        for r in live(version, "eagle-bigram") {
            let report = apply(&index, &r, PageRules { page_size: Some(16) });
            assert_eq!(report.stored_blocks, 0, "{version}: {report:?}");
        }
        let bigram = live(version, "eagle-bigram");
        let first = apply(&KvIndex::new(KvIndexConfig::default()), &bigram[0], PageRules { page_size: Some(16) });
        assert!(first.skipped(SkipReason::UnkeyableTokens) > 0, "{version}: {first:?}");
        for (scenario, page) in [("page-size-16-partial", 16), ("page-size-64-partial", 64)] {
            let index = KvIndex::new(KvIndexConfig::default());
            let records = live(version, scenario);
            let report = apply(&index, &records[0], PageRules { page_size: Some(page) });
            assert!(report.skipped(SkipReason::PartialPage) > 0, "{version} {scenario}: {report:?}");
            // The whole pages before the partial one credit exactly; nothing past them.
            let tokens = stored_tokens(&records[..1]);
            let whole = (tokens.len() / page) * page / 16;
            assert_eq!(matched(&index, &tokens, None) as usize, whole, "{version} {scenario}");
        }
    }
}

#[test]
fn trtllm_multimodal_blocks_never_credit_a_plain_prompt() {
    let path = sglang_vectors_dir().parent().unwrap().join("trtllm-vectors/frames-trtllm-format.jsonl");
    let records = read_records(&path);
    let index = KvIndex::new(KvIndexConfig::default());
    let apply_as = |scenario: &str, pod: &str| -> (kvindex::ApplyReport, Vec<Vec<u32>>) {
        let r = records.iter().find(|r| r["scenario"] == scenario).unwrap();
        let frames = frames_of(r);
        let batch = wire::decode_batch_as(Engine::Trtllm, &frames[2]).unwrap();
        let tokens = batch
            .events
            .iter()
            .filter_map(|e| match e {
                Event::BlockStored(s) => s.token_ids.clone(),
                _ => None,
            })
            .collect();
        (index.apply(pod, MODEL, &batch), tokens)
    };
    let (plain, tokens) = apply_as("plain-store", "pod-plain");
    assert_eq!(plain.stored_blocks, 2);
    assert_eq!(matched(&index, &tokens[0], None), 2);
    let (mm, mm_tokens) = apply_as("multimodal-store", "pod-mm");
    // Hex-string placeholders: unkeyable; int placeholders with mm_keys: keyed apart.
    assert_eq!(mm.skipped(SkipReason::UnkeyableTokens), 1, "{mm:?}");
    assert_eq!(mm.stored_blocks, 1, "{mm:?}");
    // The multimodal block's token ids are a plain prompt's first block: it must not match.
    assert_eq!(mm_tokens[0][..], tokens[0][..16]);
    let prompt = [&tokens[0][..], &[0]].concat();
    let q = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: &prompt, pods: Some(&["pod-mm"]) };
    assert!(index.score(&q).matches.iter().all(|m| m.matched_blocks == 0), "{:?}", index.score(&q));
}

#[test]
fn the_cross_check_recomputes_every_chained_store_of_every_release() {
    use kvindex::sglang::{EventFormat, PageChainCheck, SglangRelease};
    let mut total = kvindex::vllm_hash::Verification::default();
    let mut checks: std::collections::HashMap<String, PageChainCheck> = Default::default();
    for path in sglang_frame_files() {
        for r in read_records(&path) {
            let synthetic = r["hash_provenance"].as_array().is_some_and(|p| p.iter().any(|p| p.get("note").is_some()));
            if r["kind"] != "live" || synthetic {
                continue;
            }
            let release: SglangRelease = r["version"].as_str().unwrap().parse().unwrap();
            let format = match r["publisher"]["kv_events_format"].as_str() {
                Some("dynamo") => EventFormat::Dynamo,
                _ => EventFormat::Default,
            };
            // One check per scenario run (a source), fed in seq order.
            let key = format!("{} {}", r["version"], r["scenario"]);
            let check = checks.entry(key).or_insert_with(|| PageChainCheck::new(release, format));
            let frames = frames_of(&r);
            let batch = wire::decode_batch_as(Engine::Sglang, &frames[2]).unwrap();
            for e in &batch.events {
                if let Event::BlockStored(s) = e {
                    let v = check.check(s);
                    assert_eq!(v.mismatched, 0, "{} {} seq {}: {v:?}", r["version"], r["scenario"], r["expect"]["seq"]);
                    total.merge(&v);
                }
            }
        }
    }
    assert!(total.matched >= 200 && total.unverifiable > 0, "{total:?}");
    // Ids a misconfigured source would publish (another page size) all mismatch.
    let r = &read_records(&sglang_frame_files()[2])[0];
    let frames = frames_of(r);
    let mut batch = wire::decode_batch_as(Engine::Sglang, &frames[2]).unwrap();
    let Event::BlockStored(s) = &mut batch.events[0] else { panic!() };
    let mut check = PageChainCheck::new(r["version"].as_str().unwrap().parse().unwrap(), EventFormat::Default);
    s.block_size = Some(8);
    s.block_hashes.extend(s.block_hashes.clone());
    let v = check.check(s);
    assert!(v.checked > 0 && v.matched == 0, "{v:?}");
}

#[test]
fn page_size_1_credits_each_canonical_block_its_pages_complete() {
    use kvindex::sglang::SmallPages;
    for version in ["0.5.6", "0.5.19", "0.5.23"] {
        for block_size in [4usize, 16] {
            let index = KvIndex::new(KvIndexConfig { block_size, ..Default::default() });
            let mut pages = SmallPages::new(block_size);
            let records = live(version, "page-size-1");
            let mut tokens = Vec::new();
            let mut held = Vec::new();
            for r in &records {
                let frames = frames_of(r);
                let mut batch = wire::decode_batch_as(Engine::Sglang, &frames[2]).unwrap();
                PageRules { page_size: Some(1) }.keep_servable(&mut batch, block_size);
                let (rewritten, dropped) = pages.rewrite(&batch);
                assert_eq!(dropped, Default::default(), "{version}: every continuation resolves");
                let report = index.apply("pod-p1", MODEL, &rewritten);
                assert_eq!(report.skipped.iter().sum::<u64>(), 0, "{version}: {report:?}");
                tokens.extend(stored_tokens(std::slice::from_ref(r)));
                // The reference: the engine holds every stored token not yet removed (removals
                // take a node's tail), so the pod holds the whole blocks of that prefix.
                let removed: usize = batch
                    .events
                    .iter()
                    .map(|e| if let Event::BlockRemoved(x) = e { x.block_hashes.len() } else { 0 })
                    .sum();
                held.push(tokens.len() - removed);
                tokens.truncate(tokens.len() - removed);
                let want = held.last().unwrap() / block_size;
                assert_eq!(
                    matched(&index, &tokens, None) as usize,
                    want,
                    "{version} bs {block_size} seq {}",
                    r["expect"]["seq"]
                );
            }
            assert!(held.iter().any(|&h| h >= block_size), "{version}: the scenario completes a block");
        }
    }
}
