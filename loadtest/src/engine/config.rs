//! The knobs of one simulated engine, with defaults from the reference scenario
//! (`docs/reference/anchors.md`: ~160k tokens of KV per pod, prefill ~16k tokens/s).

use kvindex::vllm_hash::{HashAlgo, VllmHashConfig, VllmVersion};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per KV block (`--block-size`).
    pub block_size: usize,
    /// KV blocks including vLLM's reserved null block (`num_gpu_blocks`).
    pub num_gpu_blocks: usize,
    /// Continuous-batching limit on running requests (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Tokens computed per engine step, prefill chunks and decodes together
    /// (`--max-num-batched-tokens`); longer prefills are chunked across steps.
    pub max_num_batched_tokens: usize,
    /// Prompt + completion tokens one request may span; `None` = the whole cache.
    pub max_model_len: Option<usize>,
    /// Prefill throughput in tokens per second of simulated time.
    pub prefill_tokens_per_s: f64,
    /// Duration of a step that decodes (one token for every decoding request).
    pub decode_s_per_token: f64,
    /// `PYTHONHASHSEED` of the simulated engine; `None` = unset (vLLM ≥0.29 then seeds with
    /// `"vllm-none-hash"`).
    pub hash_seed: Option<String>,
    /// Token ids that generated tokens are drawn from. The default (`a`–`z` and space as byte
    /// ids) round-trips through the byte tokenizer, so a client can send generated text back.
    pub output_alphabet: Vec<u32>,
    /// Seed of the generated tokens: the same seed and request order give the same outputs.
    pub output_seed: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            num_gpu_blocks: 10_000, // 160k tokens at block size 16
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: None,
            prefill_tokens_per_s: 16_000.0,
            decode_s_per_token: 0.02,
            hash_seed: Some("0".to_string()),
            output_alphabet: b"abcdefghijklmnopqrstuvwxyz ".iter().map(|&b| u32::from(b)).collect(),
            output_seed: 0x5eed,
        }
    }
}

impl EngineConfig {
    /// vLLM 0.33 with `--prefix-caching-hash-algo sha256_cbor` (llm-d's setting).
    pub fn hash_config(&self) -> VllmHashConfig {
        VllmHashConfig {
            version: VllmVersion::new(0, 33, 0),
            algo: HashAlgo::Sha256Cbor,
            pythonhashseed: self.hash_seed.clone(),
        }
    }

    /// Tokens of the usable cache (the null block excluded).
    pub fn capacity_tokens(&self) -> usize {
        self.num_gpu_blocks.saturating_sub(1) * self.block_size
    }

    pub fn effective_max_model_len(&self) -> usize {
        let capacity = self.capacity_tokens();
        self.max_model_len.map_or(capacity, |len| len.min(capacity))
    }
}
