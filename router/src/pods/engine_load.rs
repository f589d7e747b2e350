//! One pod's load as a scrape read it, the same for every engine family: a leaf that the
//! family parsers fill and the pod table keeps. A pod that is one data-parallel rank of an
//! engine serving all its ranks behind one endpoint reads only its rank's series.

/// One pod's load as last scraped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineLoad {
    pub waiting: f64,
    pub running: f64,
    /// 0–1.
    pub kv_usage: Option<f64>,
    /// KV-cache capacity in tokens (vLLM's `num_gpu_blocks × block_size`, SGLang's
    /// `max_total_num_tokens`, or pages × page size), when the engine reports it: tokens, not
    /// the engine's own blocks or pages, so pods of different block and page sizes compare.
    pub kv_tokens: Option<u64>,
    /// Data-parallel engines the page shows (distinct rank labels: vLLM's `engine`, SGLang's
    /// `dp_rank`), 1 without any; 1 for a page read for one rank.
    pub engines: u32,
}

impl Default for EngineLoad {
    fn default() -> Self {
        EngineLoad { waiting: 0.0, running: 0.0, kv_usage: None, kv_tokens: None, engines: 1 }
    }
}

/// Most engines (distinct rank labels) counted on one page: a peer cannot make the router keep
/// an entry per line of a 4 MiB body. Series of further engines are ignored.
pub const MAX_ENGINES: usize = 1024;

/// Why a `/metrics` page gave no load for a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// No request gauges of this engine family on the page.
    NotThisEngine,
    /// The family's gauges are there, but none of the data-parallel rank asked for: the pod is
    /// configured with more ranks than its engine runs.
    NoSuchRank,
}

/// Whether a series labelled `labels` belongs to `rank` (`None`: every series does), by the
/// family's rank label (`engine` for vLLM, `dp_rank` for SGLang).
pub fn of_rank(labels: &str, rank_label: &str, rank: Option<u32>) -> bool {
    match rank {
        None => true,
        Some(r) => crate::pods::prom_text::label(labels, rank_label).and_then(|v| v.parse::<u32>().ok()) == Some(r),
    }
}
