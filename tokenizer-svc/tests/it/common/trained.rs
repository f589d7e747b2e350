//! A byte-level BPE trained in-process with the `tokenizers` crate, saved as a model directory
//! (tokenizer.json, tokenizer_config.json, chat template): real HF files, tiny and fast, for
//! tests that must run without the PyPI fixtures.
use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, TokenizerImpl};

pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
pub const TOOL_TEMPLATE: &str = "{{ bos_token }}TOOLS:{% for t in tools %}{{ t | tojson }}{% endfor %}\n{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
pub const RAISING_TEMPLATE: &str = "{% for m in messages %}\n{% if m.role == 'system' %}\n{{ raise_exception('System role not supported') }}\n{% endif %}\n{{ m.content }}\n{% endfor %}";

const CORPUS: &str = "The prefix cache stores key and value blocks of prompts. A router that renders \
chat templates like the engine finds the same blocks. Hello world! How are you today? \
Tokenizers split text into pieces; byte-level BPE never fails on unicode like café or 🚀.\n";

/// Trains the BPE once per call (fast: a few ms) and writes `dir/tokenizer.json`.
pub fn train_tokenizer(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, CORPUS.repeat(20)).unwrap();
    let specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"];
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(400)
        .min_frequency(1)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(specials.iter().map(|s| AddedToken::from(*s, true)).collect())
        .build();
    let mut tokenizer: TokenizerImpl<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    > = TokenizerImpl::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    tokenizer.train_from_files(&mut trainer, vec![corpus.to_string_lossy().into_owned()]).unwrap();
    let bos_id = tokenizer.token_to_id("<s>").unwrap();
    // Like Llama's tokenizer.json: completions get BOS from the post-processor.
    let processor = TemplateProcessing::builder()
        .try_single("<s> $A")
        .unwrap()
        .try_pair("<s> $A <s> $B:1")
        .unwrap()
        .special_tokens(vec![("<s>", bos_id)])
        .build()
        .unwrap();
    tokenizer.with_post_processor(Some(processor));
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    std::fs::remove_file(corpus).unwrap();
}

/// A model dir with a ChatML template in `chat_template.jinja`.
pub fn chatml_model(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    train_tokenizer(&dir);
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "eos_token": {"__type": "AddedToken", "content": "<|im_end|>"}, "tokenizer_class": "PreTrainedTokenizerFast"}"#,
    )
    .unwrap();
    std::fs::write(dir.join("chat_template.jinja"), CHATML).unwrap();
    dir
}

/// A model whose config holds named templates (`default`, `tool_use`), as some HF repos do.
pub fn multi_template_model(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    train_tokenizer(&dir);
    let config = serde_json::json!({
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": TOOL_TEMPLATE}],
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

/// A model whose template calls `raise_exception` on system messages.
pub fn raising_model(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    train_tokenizer(&dir);
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"bos_token": "<s>"}"#).unwrap();
    std::fs::write(dir.join("chat_template.jinja"), RAISING_TEMPLATE).unwrap();
    dir
}
