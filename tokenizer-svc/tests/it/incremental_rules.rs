//! The cut-token rules of `incremental`, on tokenizers built in the test (no fixtures needed):
//! flagged (`lstrip`, `rstrip`, `single_word`) and contained tokens are never cut at, a
//! position-dependent pre-tokenizer (`Metaspace`, `prepend_scheme: first`) stays exact, a
//! non-identity normalizer keeps normalized tokens out, and truncation, `trim_offsets` or a
//! vocabulary without a usable token fall back to full tokenization. Every case compares the
//! registry (prefix cache on) with the model's full tokenization, after caching prefixes.
use crate::common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::common::trained;
use kvindex_tokenizer::{RegistryConfig, TokenizerRegistry};
use proptest::prelude::*;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::{Lowercase, NormalizerWrapper};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, Tokenizer, TokenizerImpl, TruncationParams};

/// Writes `tokenizer` as a model directory with a ChatML template.
fn save_model(tokenizer: &Tokenizer, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"bos_token": "<s>", "eos_token": "<|im_end|>"}"#).unwrap();
    std::fs::write(dir.join("chat_template.jinja"), trained::CHATML).unwrap();
    dir.to_path_buf()
}

/// The byte-level BPE of `common::trained`, modified by `change`.
fn variant(root: &Path, name: &str, change: impl FnOnce(&mut Tokenizer)) -> PathBuf {
    let base = root.join(format!("{name}-base"));
    trained::train_tokenizer(&base);
    let mut tokenizer = Tokenizer::from_file(base.join("tokenizer.json")).unwrap();
    change(&mut tokenizer);
    save_model(&tokenizer, &root.join(name))
}

/// A BPE trained behind `Metaspace` with `prepend_scheme: first`, as in recent Llama-2/Mistral
/// `tokenizer.json` files: whether a split starts at offset 0 changes its ids.
fn metaspace_model(root: &Path) -> PathBuf {
    let dir = root.join("metaspace");
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, "hello world the prefix cache stores blocks of prompts\n".repeat(30)).unwrap();
    let specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"];
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(120)
        .min_frequency(1)
        .show_progress(false)
        .special_tokens(specials.iter().map(|s| AddedToken::from(*s, true)).collect())
        .build();
    let mut tokenizer: TokenizerImpl<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    > = TokenizerImpl::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::First, true)));
    tokenizer.train_from_files(&mut trainer, vec![corpus.to_string_lossy().into_owned()]).unwrap();
    let bos = tokenizer.token_to_id("<s>").unwrap();
    tokenizer.with_post_processor(Some(
        TemplateProcessing::builder().try_single("<s> $A").unwrap().special_tokens(vec![("<s>", bos)]).build().unwrap(),
    ));
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    save_model(&tokenizer, &dir)
}

/// Every rule model in one registry (prefix cache on). Stats-asserting tests build their own,
/// so that tests running in parallel threads cannot disturb each other's counts.
fn build_registry(tag: &str) -> TokenizerRegistry {
    let root = common::scratch_dir(&format!("incremental-rules-{tag}"));
    let flags = variant(&root, "flags", |t| {
        t.add_special_tokens(vec![
            AddedToken::from("<L>", true).lstrip(true),
            AddedToken::from("<R>", true).rstrip(true),
            AddedToken::from("[W]", true).single_word(true),
            // Contains <|im_end|>, so <|im_end|> is no cut token any more; ends with a word
            // character while a single_word token exists, so it is none either.
            AddedToken::from("<|im_end|>x", true),
            // Normalized (identity normalizer here): a cut token.
            AddedToken::from("<N>", false),
        ])
        .unwrap();
    });
    let lowercase = variant(&root, "lowercase", |t| {
        t.with_normalizer(Some(Lowercase)).unwrap();
        t.add_tokens(vec![AddedToken::from("<N>", false)]).unwrap();
    });
    let truncating = variant(&root, "truncating", |t| {
        t.with_truncation(Some(TruncationParams { max_length: 16, ..Default::default() })).unwrap();
    });
    let trimming = variant(&root, "trimming", |t| {
        t.with_post_processor(Some(ByteLevel::new(false, true, true)));
    });
    let all_flagged = variant(&root, "all-flagged", |t| {
        let specials: Vec<AddedToken> =
            t.get_added_tokens_decoder().values().map(|token| token.clone().lstrip(true)).collect();
        t.add_special_tokens(specials).unwrap();
    });
    let mut config = RegistryConfig::default();
    for (name, dir) in [
        ("chatml", trained::chatml_model(&root, "chatml")),
        ("flags", flags),
        ("lowercase", lowercase),
        ("truncating", truncating),
        ("trimming", trimming),
        ("all-flagged", all_flagged),
        ("metaspace", metaspace_model(&root)),
    ] {
        config.add_model(name, dir).unwrap();
    }
    TokenizerRegistry::new(config)
}

fn shared_registry() -> &'static TokenizerRegistry {
    static REGISTRY: OnceLock<TokenizerRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| build_registry("shared"))
}

/// `text` through the registry equals full tokenization (ids and offsets, both BOS settings).
fn assert_exact(registry: &TokenizerRegistry, model: &str, text: &str) {
    let full = registry.model(model).unwrap();
    for special in [false, true] {
        assert_eq!(
            registry.tokenize(model, text, special).unwrap(),
            full.tokenize(text, special).unwrap(),
            "{model}: tokenize(special={special}) on {text:?}"
        );
        assert_eq!(
            registry.render_completion(model, text).unwrap(),
            full.tokenize(text, true).unwrap().ids,
            "{model}: render_completion on {text:?}"
        );
    }
}

/// Every third prefix at a character boundary, then the whole text: all exact.
fn assert_exact_after_prefixes(registry: &TokenizerRegistry, model: &str, text: &str) {
    for (i, _) in text.char_indices().step_by(3) {
        assert_exact(registry, model, &text[..i]);
    }
    assert_exact(registry, model, text);
}

#[test]
fn flagged_and_contained_tokens_are_never_cut_at() {
    let registry = &build_registry("flags");
    let stats = || registry.prefix_cache_stats();
    assert_eq!(registry.model("flags").unwrap().incremental_disabled_reason(), None);
    // Only flagged or contained tokens: no candidate cut point, so a bypass.
    let before = stats();
    assert_exact(registry, "flags", "a <L> b <R>  c [W] d<|im_end|>e <|im_end|>x");
    let after = stats();
    assert_eq!(after.hits + after.misses, before.hits + before.misses);
    assert!(after.bypassed > before.bypassed);
    // Cut tokens (<s>, <|im_start|>, the normalized <N>) around the flagged ones.
    let before = stats();
    let text = "<s><|im_start|>user  <L>  x<N> [W] y[W]z <R>  \n<|im_end|>x<|im_start|>a<N><N>";
    assert_exact_after_prefixes(registry, "flags", text);
    assert!(stats().hits > before.hits, "prefixes ending at cut tokens are reused");
}

#[test]
fn metaspace_first_splits_after_a_cut_are_tokenized_behind_their_cut_token() {
    let registry = &build_registry("metaspace");
    let stats = || registry.prefix_cache_stats();
    let model = registry.model("metaspace").unwrap();
    assert_eq!(model.incremental_disabled_reason(), None);
    // The split after <|im_start|> does not start at offset 0 in the whole text, so Metaspace
    // prepends no ▁ to it; tokenized alone it would. The ids must not change.
    let alone = model.tokenize("hello world", false).unwrap().ids;
    let behind = model.tokenize("<s>hello world", false).unwrap().ids;
    assert_ne!(&behind[1..], &alone[..], "the model must be position-dependent for this test to mean anything");
    let before = stats();
    for text in [
        "<s>hello world",
        "<s>hello world<|im_start|>hello world",
        "<s>hello world<|im_start|>hello world<|im_end|> the prefix<|im_start|>cache",
        "hello<|im_end|>hello<|im_end|> hello",
    ] {
        assert_exact_after_prefixes(registry, "metaspace", text);
    }
    assert!(stats().hits > before.hits);
}

#[test]
fn normalized_tokens_are_no_cut_points_under_a_real_normalizer() {
    let registry = &build_registry("lowercase");
    let stats = || registry.prefix_cache_stats();
    let before = stats();
    // <N> is normalized and the normalizer lowercases: never a cut point; <s> still is.
    assert_exact(registry, "lowercase", "Hello <N> World <n> AGAIN");
    assert!(stats().bypassed > before.bypassed);
    assert_exact_after_prefixes(registry, "lowercase", "<s>Hello <N> World<|im_start|>USER <n>x");
}

#[test]
fn truncation_and_unusable_vocabularies_fall_back_to_full_tokenization() {
    let registry = &build_registry("fallback");
    let stats = || registry.prefix_cache_stats();
    for (model, reason) in [("truncating", "truncation"), ("all-flagged", "no added token")] {
        let why = registry.model(model).unwrap().incremental_disabled_reason().map(str::to_string);
        assert!(why.as_deref().is_some_and(|w| w.contains(reason)), "{model}: {why:?}");
        let before = stats();
        assert_exact(registry, model, "<s><|im_start|>user\nhello world<|im_end|><|im_start|>x");
        let after = stats();
        assert_eq!(after.hits + after.misses, before.hits + before.misses);
        assert!(after.bypassed >= before.bypassed + 4);
    }
}

#[test]
fn a_text_full_of_cut_tokens_is_tokenized_in_full() {
    let registry = &build_registry("many");
    let text = "<s>".repeat(70_000);
    let before = registry.prefix_cache_stats();
    assert_eq!(
        registry.render_completion("chatml", &text).unwrap(),
        registry.model("chatml").unwrap().tokenize(&text, true).unwrap().ids
    );
    let after = registry.prefix_cache_stats();
    assert_eq!((after.bypassed, after.misses), (before.bypassed + 1, before.misses));
}

#[test]
fn trim_offsets_sends_offset_requests_to_full_tokenization() {
    let registry = &build_registry("trimming");
    let stats = || registry.prefix_cache_stats();
    let text = "<s><|im_start|>user\n  hello   world  <|im_end|>\n<|im_start|>assistant\n";
    // Ids are still cut (render_completion), offsets are not (tokenize).
    registry.render_completion("trimming", text).unwrap();
    let before = stats();
    assert_exact(registry, "trimming", text);
    let after = stats();
    assert_eq!(after.bypassed, before.bypassed + 2, "every tokenize() bypasses");
    assert_eq!(after.hits, before.hits + 2, "every render_completion() hits");
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z ]{1,8}",
        1 => Just("  ".to_string()),
        1 => Just("\n".to_string()),
        1 => Just("<s>".to_string()),
        1 => Just("</s>".to_string()),
        1 => Just("<|im_start|>".to_string()),
        1 => Just("<|im_end|>".to_string()),
        1 => Just("<|im_end|>x".to_string()),
        1 => Just("<|im_".to_string()),
        1 => Just("<L>".to_string()),
        1 => Just("<R>".to_string()),
        1 => Just("[W]".to_string()),
        1 => Just("<N>".to_string()),
        1 => Just("<n>".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random texts of tokens, halves of tokens, flagged tokens and whitespace, on every model,
    /// after caching a random prefix: always exact.
    #[test]
    fn random_texts_are_exact_on_every_rule_model(
        parts in prop::collection::vec(fragment(), 0..12),
        cut in any::<prop::sample::Index>(),
        model in prop::sample::select(vec![
            "chatml", "flags", "lowercase", "truncating", "trimming", "all-flagged", "metaspace",
        ]),
    ) {
        let registry = shared_registry();
        let text = parts.concat();
        let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        assert_exact(registry, model, &text[..boundaries[cut.index(boundaries.len())]]);
        assert_exact(registry, model, &text);
    }
}
