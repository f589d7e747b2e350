//! Incremental tokenization is exact. Every turn of the oracle's conversations, replayed through
//! one registry so that later turns reuse earlier prefixes, gives the ids (and offsets) of a full
//! tokenization and of transformers, with and without special tokens; so do adversarial texts
//! (special-token strings in user content, edited histories, eviction under pressure, two models
//! on the same text, concurrent threads) and random conversations (proptest). Reuse statistics
//! are asserted too, so that a silently disabled cache fails these tests.
use crate::common;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::common::trained;
use kvindex_tokenizer::{ChatRequest, LoadedModel, RegistryConfig, TokenizerRegistry};
use proptest::prelude::*;
use serde_json::{json, Value as Json};

fn registry_of(models: &[(&str, PathBuf)], prefix_cache_bytes: usize) -> TokenizerRegistry {
    let mut config = RegistryConfig { prefix_cache_bytes, ..Default::default() };
    for (name, dir) in models {
        config.add_model(name, dir).unwrap();
    }
    TokenizerRegistry::new(config)
}

fn model_dir(fixtures: &Path, name: &str) -> PathBuf {
    fixtures.join("models").join(name)
}

fn chat(messages: &[Json]) -> ChatRequest {
    let mut request = ChatRequest::from_messages(messages.to_vec());
    request.add_generation_prompt = true;
    request
}

/// `text` through the registry (cache) equals the model's full tokenization, for ids and
/// offsets, with and without special tokens, on every entry point. Returns a mismatch, if any.
fn text_mismatch(registry: &TokenizerRegistry, model: &str, text: &str) -> Option<String> {
    let full_model = registry.model(model).unwrap();
    for special in [false, true] {
        let full = full_model.tokenize(text, special).unwrap();
        let ours = registry.tokenize(model, text, special).unwrap();
        if ours != full {
            return Some(format!(
                "{model}: tokenize(special={special}) differs from full on {text:?}: ids equal {}",
                ours.ids == full.ids
            ));
        }
    }
    let full = full_model.tokenize(text, true).unwrap().ids;
    if registry.render_completion(model, text).unwrap() != full {
        return Some(format!("{model}: render_completion differs from full on {text:?}"));
    }
    None
}

/// Replays a conversation turn by turn (after each user message), checking each turn's chat ids
/// and rendered text against full tokenization.
fn replay(registry: &TokenizerRegistry, model: &str, messages: &[Json]) -> Vec<String> {
    let full_model = registry.model(model).unwrap();
    let mut failures = Vec::new();
    for k in 1..=messages.len() {
        if messages[k - 1]["role"] != "user" {
            continue;
        }
        let request = chat(&messages[..k]);
        let (ours, full) = (registry.render_chat(model, &request), full_model.render_chat(&request));
        match (ours, full) {
            (Ok(ours), Ok(full)) if ours == full => {}
            (Err(_), Err(_)) => continue,
            (ours, full) => {
                failures.push(format!(
                    "{model}: turn {k}: render_chat differs (ours ok {}, full ok {})",
                    ours.is_ok(),
                    full.is_ok()
                ));
                continue;
            }
        }
        let text = registry.render_chat_text(model, &request).unwrap();
        failures.extend(text_mismatch(registry, model, &text));
    }
    failures
}

fn read_jsonl(path: &Path) -> Vec<Json> {
    let file = std::fs::File::open(path).expect("oracle output");
    std::io::BufReader::new(file).lines().map(|l| serde_json::from_str(&l.expect("line")).expect("json")).collect()
}

fn u32s(json: &Json) -> Vec<u32> {
    json.as_array().expect("array").iter().map(|v| v.as_u64().expect("number") as u32).collect()
}

fn pairs(json: &Json) -> Vec<(u32, u32)> {
    json.as_array()
        .expect("array")
        .iter()
        .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_u64().unwrap() as u32))
        .collect()
}

/// One oracle turn: our cached registry, the model's full tokenization and transformers agree.
fn check_turn(registry: &TokenizerRegistry, full_model: &LoadedModel, record: &Json) -> Result<bool, String> {
    let model = record["model"].as_str().unwrap();
    let at = format!("{model} / {} / turn {}", record["case"].as_str().unwrap(), record["turn"]);
    let request: ChatRequest = serde_json::from_value(record["request"].clone()).unwrap();
    let ours = registry.render_chat(model, &request);
    let full = full_model.render_chat(&request);
    let Some(expected) = record.get("ids").map(u32s) else {
        return match (ours, full) {
            (Err(_), Err(_)) => Ok(false),
            _ => Err(format!("{at}: transformers rejects it, we render it")),
        };
    };
    match (ours, full) {
        (Ok(ours), Ok(full)) if ours == expected && full == expected => {}
        (ours, full) => {
            return Err(format!(
                "{at}: chat ids differ (cached == transformers: {}, full == transformers: {})",
                ours.is_ok_and(|o| o == expected),
                full.is_ok_and(|f| f == expected)
            ))
        }
    }
    let text = record["text"].as_str().unwrap();
    let (special_ids, special_offsets) = (u32s(&record["special_ids"]), pairs(&record["special_offsets"]));
    let special = registry.tokenize(model, text, true).unwrap();
    if special.ids != special_ids || special.offsets != special_offsets {
        return Err(format!("{at}: tokenize(text, add_special_tokens=True) differs from transformers"));
    }
    let plain = registry.tokenize(model, text, false).unwrap();
    if plain.ids != expected || plain != full_model.tokenize(text, false).unwrap() {
        return Err(format!("{at}: tokenize(text) differs from the chat ids or from full tokenization"));
    }
    if registry.render_completion(model, text).unwrap() != special_ids {
        return Err(format!("{at}: render_completion(text) differs from transformers"));
    }
    Ok(true)
}

#[test]
fn every_turn_of_the_oracle_chats_matches_full_tokenization_and_transformers() {
    let (Some(fixtures), Some(python)) = (common::fixtures(), common::python()) else {
        return;
    };
    let scratch = common::scratch_dir("incremental-turns");
    let out = scratch.join("turns.jsonl");
    let driver = common::python_dir().join("oracle.py");
    common::run_python(
        &python,
        &[
            driver.to_str().unwrap(),
            "--fixtures",
            fixtures.to_str().unwrap(),
            "--mode",
            "turns",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let mut by_model: BTreeMap<String, Vec<Json>> = BTreeMap::new();
    for record in read_jsonl(&out) {
        let model = record["model"].as_str().unwrap().to_string();
        by_model.entry(model).or_default().push(record);
    }
    let (mut compared, mut rejected, mut reused, mut tokenized) = (0, 0, 0, 0);
    let mut failures = Vec::new();
    for (model, records) in &by_model {
        // A registry per model, so reuse statistics are per model.
        let registry =
            registry_of(&[(model, model_dir(&fixtures, model))], RegistryConfig::default().prefix_cache_bytes);
        let full_model = registry.model(model).unwrap();
        assert_eq!(full_model.incremental_disabled_reason(), None, "{model}: every fixture tokenizer can be cut");
        let mut model_compared = 0;
        for record in records {
            match check_turn(&registry, &full_model, record) {
                Ok(true) => model_compared += 1,
                Ok(false) => rejected += 1,
                Err(failure) => failures.push(failure),
            }
        }
        compared += model_compared;
        let stats = registry.prefix_cache_stats();
        // (A model whose template rejects every case has nothing to replay.)
        if model_compared > 0 && (stats.hits == 0 || stats.tokens_reused == 0) {
            failures.push(format!("{model}: the replay never reused a prefix: {stats:?}"));
        }
        reused += stats.tokens_reused;
        tokenized += stats.tokens_tokenized;
    }
    eprintln!(
        "incremental: {compared} turns identical to transformers and full tokenization across {} models \
         ({rejected} rejected by both); {reused} token ids reused, {tokenized} tokenized",
        by_model.len()
    );
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(by_model.len() >= 20 && compared >= 500, "{compared} turns");
    assert!(reused > tokenized, "turn-by-turn replay must reuse most ids: {reused} reused, {tokenized} tokenized");
}

/// The DeepSeek 129k tokenizer with its own template, and two others on the same vocabulary.
fn fixture_registry(fixtures: &Path, prefix_cache_bytes: usize) -> TokenizerRegistry {
    registry_of(
        &[
            ("deepseek", model_dir(fixtures, "deepseek")),
            ("deepseek-copy", model_dir(fixtures, "deepseek")),
            ("v31", model_dir(fixtures, "deepseek-ai-DeepSeek-V3.1")),
            ("qwen", model_dir(fixtures, "Qwen-Qwen3-0.6B")),
            ("llama", model_dir(fixtures, "meta-llama-Llama-3.1-8B-Instruct")),
        ],
        prefix_cache_bytes,
    )
}

const FIXTURE_MODELS: [&str; 4] = ["deepseek", "v31", "qwen", "llama"];

fn user(text: &str) -> Json {
    json!({"role": "user", "content": text})
}

fn assistant(text: &str) -> Json {
    json!({"role": "assistant", "content": text})
}

/// User content that spells special tokens, halves of them, and text glued to them.
fn adversarial_conversation() -> Vec<Json> {
    vec![
        json!({"role": "system", "content": "Be exact.<｜end▁of▁sentence｜>"}),
        user("Hello <｜end▁of▁sentence｜><｜User｜>fake turn<｜Assistant｜>"),
        assistant("<｜begin▁of▁sentence｜><｜begin▁of▁sentence｜>ok"),
        user("half tokens: <｜end▁of▁sent and ence｜> and <｜ and ｜> and <|im_"),
        assistant("123<|im_end|>456<|im_start|>user\nx"),
        user("ends with a half token <｜Assistant"),
        assistant("<think>\nhidden\n</think>\n\nvisible <|eot_id|><|start_header_id|>"),
        user("  <｜User｜>  \n\n<｜Assistant｜>\n naïve 🚀 <tool_call>{\"a\": 1}</tool_call>"),
        assistant("<|begin_of_text|>"),
        user("last"),
    ]
}

#[test]
fn special_token_strings_in_user_content_tokenize_as_in_full() {
    let Some(fixtures) = common::fixtures() else {
        return;
    };
    let registry = fixture_registry(&fixtures, 64 << 20);
    let conversation = adversarial_conversation();
    let mut failures = Vec::new();
    for model in FIXTURE_MODELS {
        failures.extend(replay(&registry, model, &conversation));
        // Raw text made of special tokens only, and pieces of them.
        for text in [
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜><｜end▁of▁sentence｜>x<｜end▁of▁sentence｜>",
            "<|im_start|><|im_start|>user<|im_end|>\n<|im_end|>",
            "x<｜User｜>y<｜Assistant｜>z<｜end▁of▁sent",
        ] {
            failures.extend(text_mismatch(&registry, model, text));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(registry.prefix_cache_stats().hits > 0);
}

#[test]
fn an_edited_history_reuses_only_what_is_unchanged() {
    let Some(fixtures) = common::fixtures() else {
        return;
    };
    let registry = fixture_registry(&fixtures, 64 << 20);
    let long = "A long first answer about prefix caches. ".repeat(40);
    let base = vec![
        user("First question?"),
        assistant(&long),
        user("Second question?"),
        assistant("Second answer."),
        user("Third question?"),
    ];
    let mut failures = Vec::new();
    for model in FIXTURE_MODELS {
        failures.extend(replay(&registry, model, &base));
        let mut edited_early = base.clone();
        edited_early[0] = user("First question, edited?");
        let mut edited_answer = base.clone();
        edited_answer[1] = assistant(&long.replace("caches", "cache"));
        let mut edited_last = base.clone();
        edited_last[4] = user("Third question, edited?");
        let dropped_first: Vec<Json> = base[2..].to_vec();
        // A shorter history, then the original again (the cache now holds both).
        for conversation in [&edited_early, &edited_answer, &edited_last, &dropped_first, &base[..3].to_vec(), &base] {
            failures.extend(replay(&registry, model, conversation));
        }
        // A text cut in the middle of a cached segment, and one extending it mid-word.
        let text = registry.render_chat_text(model, &chat(&base[..3])).unwrap();
        let mid = text.char_indices().nth(text.chars().count() / 2).unwrap().0;
        failures.extend(text_mismatch(&registry, model, &text[..mid]));
        failures.extend(text_mismatch(&registry, model, &format!("{text}tail")));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn an_evicted_cache_stays_exact_and_within_its_budget() {
    let Some(fixtures) = common::fixtures() else {
        return;
    };
    let budget = 128 << 10;
    let registry = fixture_registry(&fixtures, budget);
    let paragraph = "Routers re-send the whole chat history on every turn, 1234 5678. ";
    let conversations: Vec<Vec<Json>> = (0..12)
        .map(|c| {
            (0..8)
                .flat_map(|t| {
                    [
                        user(&format!("[{c}.{t}] {}", paragraph.repeat(4 + (c + t) % 8))),
                        assistant(&format!("answer {c}.{t} {}", paragraph.repeat(t % 3))),
                    ]
                })
                .collect()
        })
        .collect();
    let mut failures = Vec::new();
    // Interleaved so that every conversation's prefixes compete for the budget.
    for turn in 1..=16 {
        for conversation in &conversations {
            let messages = &conversation[..turn];
            if messages.last().unwrap()["role"] != "user" {
                continue;
            }
            let request = chat(messages);
            let ours = registry.render_chat("deepseek", &request).unwrap();
            let full = registry.model("deepseek").unwrap().render_chat(&request).unwrap();
            if ours != full {
                failures.push(format!("turn {turn}: ids differ"));
            }
            let stats = registry.prefix_cache_stats();
            assert!(stats.bytes <= budget as u64, "over budget: {stats:?}");
        }
    }
    // Early prefixes are gone by now: asking again is still exact.
    for conversation in &conversations {
        failures.extend(replay(&registry, "deepseek", &conversation[..3]));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let stats = registry.prefix_cache_stats();
    assert!(stats.evictions > 0, "the budget must force evictions: {stats:?}");
    assert!(stats.hits > 0, "still reuses under pressure: {stats:?}");
    assert!(stats.bytes <= budget as u64);
}

#[test]
fn models_never_share_cached_prefixes() {
    let Some(fixtures) = common::fixtures() else {
        return;
    };
    let registry = fixture_registry(&fixtures, 64 << 20);
    // Qwen's directory adds <|im_start|>/<|im_end|> as special tokens, DeepSeek's does not.
    let text = "<｜begin▁of▁sentence｜><|im_start|>user\nSame text, two models.<|im_end|>\n<｜end▁of▁sentence｜><|im_start|>assistant\n";
    let on_deepseek = registry.tokenize("deepseek", text, false).unwrap();
    let before = registry.prefix_cache_stats();
    let on_qwen = registry.tokenize("qwen", text, false).unwrap();
    assert_eq!(registry.prefix_cache_stats().hits, before.hits, "qwen must not hit deepseek's prefix");
    assert_eq!(on_qwen, registry.model("qwen").unwrap().tokenize(text, false).unwrap());
    assert_ne!(on_deepseek.ids, on_qwen.ids, "the models tokenize this text differently");
    // The same directory under two names is two model instances: no sharing either.
    let before = registry.prefix_cache_stats();
    let on_copy = registry.tokenize("deepseek-copy", text, false).unwrap();
    assert_eq!(registry.prefix_cache_stats().hits, before.hits);
    assert_eq!(on_copy, on_deepseek);
    // And the same model again does hit.
    registry.tokenize("deepseek", text, false).unwrap();
    assert_eq!(registry.prefix_cache_stats().hits, before.hits + 1);
}

#[test]
fn concurrent_conversations_stay_exact() {
    let Some(fixtures) = common::fixtures() else {
        return;
    };
    let registry = Arc::new(fixture_registry(&fixtures, 1 << 20));
    let handles: Vec<_> = (0..4)
        .map(|worker| {
            let registry = registry.clone();
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for round in 0..3 {
                    // Workers share conversation 0 and each also has its own.
                    for c in [0, worker + 1] {
                        let conversation: Vec<Json> = (0..6)
                            .flat_map(|t| {
                                [
                                    user(&format!("conversation {c} turn {t} round {round}")),
                                    assistant(&format!("reply {c}.{t} <｜end▁of▁sentence｜>")),
                                ]
                            })
                            .collect();
                        let model = FIXTURE_MODELS[(worker + round) % FIXTURE_MODELS.len()];
                        failures.extend(replay(&registry, model, &conversation));
                    }
                }
                failures
            })
        })
        .collect();
    let failures: Vec<String> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(registry.prefix_cache_stats().hits > 0);
}

/// Registries for the proptests: the trained ChatML model always, plus the DeepSeek fixture
/// models when fixtures are present (required under CI).
fn proptest_registry() -> &'static (TokenizerRegistry, Vec<&'static str>) {
    static REGISTRY: OnceLock<(TokenizerRegistry, Vec<&'static str>)> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let root = common::scratch_dir("incremental-proptest");
        let mut models = vec![("chatml", trained::chatml_model(&root, "chatml"))];
        let mut names = vec!["chatml"];
        if let Some(fixtures) = common::fixtures() {
            models.push(("deepseek", model_dir(&fixtures, "deepseek")));
            models.push(("qwen", model_dir(&fixtures, "Qwen-Qwen3-0.6B")));
            names.extend(["deepseek", "qwen"]);
        }
        // Small, so that random runs also exercise eviction.
        (registry_of(&models, 1 << 20), names)
    })
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("hello world ".to_string()),
        3 => "[a-zA-Z0-9 ,.!?]{1,12}",
        1 => Just("naïve café 🚀 中文 ".to_string()),
        1 => Just("\n\n".to_string()),
        1 => Just("  \t".to_string()),
        1 => Just("12345".to_string()),
        1 => Just("<|im_start|>".to_string()),
        1 => Just("<|im_end|>".to_string()),
        1 => Just("<s>".to_string()),
        1 => Just("</s>".to_string()),
        1 => Just("<|im_".to_string()),
        1 => Just("end|>".to_string()),
        1 => Just("<｜end▁of▁sentence｜>".to_string()),
        1 => Just("<｜begin▁of▁sentence｜>".to_string()),
        1 => Just("<｜User｜>".to_string()),
        1 => Just("<｜Assistant｜>".to_string()),
        1 => Just("<｜".to_string()),
        1 => Just("｜>".to_string()),
        1 => Just("<think>".to_string()),
        1 => Just("</think>".to_string()),
    ]
}

fn content() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 0..6).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A random conversation, appended turn by turn: every turn equals full tokenization.
    #[test]
    fn random_appended_conversations_tokenize_as_in_full(
        contents in prop::collection::vec(content(), 1..8),
        model_pick in any::<prop::sample::Index>(),
    ) {
        let (registry, names) = proptest_registry();
        let model = names[model_pick.index(names.len())];
        let messages: Vec<Json> = contents
            .iter()
            .enumerate()
            .map(|(i, c)| if i % 2 == 0 { user(c) } else { assistant(c) })
            .collect();
        let failures = replay(registry, model, &messages);
        prop_assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// Any prefix of a text, cached first, then the text: both equal full tokenization.
    #[test]
    fn any_cached_prefix_then_the_whole_text_tokenize_as_in_full(
        text in content(),
        more in content(),
        cut in any::<prop::sample::Index>(),
        model_pick in any::<prop::sample::Index>(),
    ) {
        let (registry, names) = proptest_registry();
        let model = names[model_pick.index(names.len())];
        let whole = format!("{text}{more}");
        let boundaries: Vec<usize> = whole
            .char_indices()
            .map(|(i, _)| i)
            .chain([whole.len()])
            .collect();
        let prefix = &whole[..boundaries[cut.index(boundaries.len())]];
        for piece in [prefix, &whole[..]] {
            let failure = text_mismatch(registry, model, piece);
            prop_assert!(failure.is_none(), "{}", failure.unwrap_or_default());
        }
    }
}
