//! One pod's load as a scrape read it, the same for every engine family: a leaf that the
//! family parsers fill and the pod table keeps.

/// One pod's load as last scraped.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    pub waiting: f64,
    pub running: f64,
    /// 0–1.
    pub kv_usage: Option<f64>,
    /// KV-cache capacity in the engine's blocks (vLLM's `num_gpu_blocks`, SGLang's pages), when
    /// the engine reports it.
    pub kv_blocks: Option<u64>,
}
