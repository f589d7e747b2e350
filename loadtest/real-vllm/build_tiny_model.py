"""Builds the tiny model directory the real-vLLM checks serve, offline and deterministically.

Why: model weights cannot be downloaded here, and a real vLLM engine only needs a config and a
tokenizer when it runs with `--load-format dummy` (random weights). The config is the smallest
Llama the CPU attention backend accepts (head_dim 64; block size 32 on the server side); the
tokenizer is a byte-level BPE trained here on a built-in corpus, with ChatML special tokens and a
ChatML chat template, so vLLM, transformers and kvindex-tokenizer all read the same directory.
A second directory, tiny-model-hybrid/, holds a Gemma-3 text config with one sliding-window
layer (window 64) and one full-attention layer and the same tokenizer: the smallest hybrid model
(two KV-cache groups) for checking hybrid scoring against a real engine.

Usage: python build_tiny_model.py [OUT_PARENT]   (default: beside this script; writes
OUT_PARENT/tiny-model and OUT_PARENT/tiny-model-hybrid)
Needs `tokenizers` (the vLLM venv has it). Two runs give byte-identical files.
"""

import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

# Gemma 3 text: layer 0 sliding window (64 tokens = 2 blocks of 32), layer 1 full attention.
HYBRID_CONFIG = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "query_pre_attn_scalar": 64,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention"],
    "attention_bias": False,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

# ChatML, as Qwen-style models write it; no BOS (the tokenizer adds none either).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

PARAGRAPHS = """\
A prefix cache keeps the keys and values of attention for blocks of tokens that a model has
already seen. When a new request starts with the same tokens, the engine reuses those blocks
and skips the work of computing them again. The router wants to send each request to the pod
that already holds the longest prefix of its prompt, because that pod answers first.
Every engine publishes the blocks it stores and the blocks it evicts. An indexer listens to all
of them, keeps a map from block hashes to pods, and answers one question: for this prompt, how
many leading blocks does each pod hold? It must never claim a block that a pod does not hold.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.
You are a helpful assistant. Answer the question briefly and politely. Summarize the text below.
Translate the following sentence into French. Write a short poem about the sea and the wind.
What is the capital of France? Paris is the capital of France. Berlin is the capital of Germany.
def score(tokens, block_size=32): return [hash(tuple(tokens[i:i + block_size])) for i in range(0, len(tokens), block_size)]
for (int i = 0; i < n; i++) { sum += values[i]; } return sum / n;
SELECT name, count(*) FROM requests WHERE cached_tokens > 0 GROUP BY name ORDER BY 2 DESC;
The weather today is sunny with a light breeze from the west, and tomorrow brings rain.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096 65536 3.14159 2.71828
"""

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "can more other time people year day way man world life hand part child eye woman place work "
    "week case point number group problem fact cache block token prompt model engine router pod "
    "index event stored removed cleared hash prefix request replay socket stream queue memory "
    "server client network latency throughput score match chat system user assistant message "
    "question answer story river mountain forest city garden window kitchen music light water "
    "green blue red yellow small large quick slow early late happy quiet bright dark warm cold "
    "read write build test measure compare publish subscribe evict store clear serve route send "
    "about after before between during under over through without within again always never "
    "because however therefore although while until unless whether either neither both each"
).split()


def corpus():
    rng = random.Random(15)
    lines = PARAGRAPHS.splitlines()
    for _ in range(3000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        sentence = " ".join(words)
        sentence = sentence[0].upper() + sentence[1:] + rng.choice([".", ".", ".", "?", "!", ","])
        if rng.random() < 0.2:
            sentence += f" {rng.randint(0, 9999)}"
        lines.append(sentence)
    return lines


def build_tokenizer():
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != VOCAB_SIZE:
        sys.exit(f"trained vocab has {size} entries, want {VOCAB_SIZE}: grow the corpus")
    return tokenizer


def tokenizer_config(tokenizer):
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(tokenizer.token_to_id(t)): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }


def write_json(path, value):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_model(out, tokenizer, config):
    os.makedirs(out, exist_ok=True)
    tokenizer.save(os.path.join(out, "tokenizer.json"), pretty=True)
    write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config(tokenizer))
    write_json(os.path.join(out, "config.json"), config)
    write_json(
        os.path.join(out, "generation_config.json"),
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
    )
    print(f"tiny model written to {out}")


def main():
    parent = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    tokenizer = build_tokenizer()
    for token, want in zip(SPECIAL_TOKENS, range(3)):
        assert tokenizer.token_to_id(token) == want, token
    write_model(os.path.join(parent, "tiny-model"), tokenizer, CONFIG)
    write_model(os.path.join(parent, "tiny-model-hybrid"), tokenizer, HYBRID_CONFIG)


if __name__ == "__main__":
    main()
