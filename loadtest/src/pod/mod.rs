//! One simulated pod as its HTTP server sees it: one engine per data-parallel rank
//! ([`rank::Rank`]), each with its own KV cache and publisher, and vLLM's internal load
//! balancing across them.
//!
//! As in vLLM with `--data-parallel-size d`, every rank publishes on its own endpoint (the
//! pod's port + rank) under the pod's one topic, and its batches carry `data_parallel_rank`.
//! A request goes to the rank with the lowest `4 × waiting + running` (vLLM's DP load
//! balancer score), ties taken in turn.

pub mod rank;
mod submission;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::engine::NewRequest;
use crate::wire::WireVersion;
pub use rank::Rank;
pub use submission::{RequestEvent, SubmitError};

/// Identity and knobs of a pod, fixed at start.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub model: String,
    /// `127.0.0.1:<http port>`: the pod id inside the topic.
    pub pod_id: String,
    pub topic: String,
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub max_model_len: usize,
    /// Whose `/metrics` names the pod exposes: SGLang's when it speaks SGLang's events.
    pub metrics_dialect: MetricsDialect,
    /// Text to token ids for the OpenAI API (the byte tokenizer unless `--tokenizer`).
    pub tokenizer: crate::http::tokenizer::PromptTokenizer,
}

/// Which engine's metric names a pod's `/metrics` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsDialect {
    #[default]
    Vllm,
    Sglang,
}

impl MetricsDialect {
    /// The engine whose events the pod speaks.
    pub fn of(wire: WireVersion) -> Self {
        match wire {
            WireVersion::Sglang(_) => MetricsDialect::Sglang,
            WireVersion::V0_33 | WireVersion::V0_23 => MetricsDialect::Vllm,
        }
    }
}

/// The handle HTTP handlers use. Cheap to clone.
#[derive(Clone)]
pub struct Pod {
    ranks: Arc<[Rank]>,
    next_tie: Arc<AtomicUsize>,
    pub info: Arc<PodInfo>,
}

impl Pod {
    /// A pod over its started ranks (at least one).
    pub fn new(info: PodInfo, ranks: Vec<Rank>) -> Pod {
        Pod { ranks: ranks.into(), next_tie: Arc::new(AtomicUsize::new(0)), info: Arc::new(info) }
    }

    pub fn ranks(&self) -> &[Rank] {
        &self.ranks
    }

    fn pick_rank(&self) -> Option<&Rank> {
        let count = self.ranks.len();
        let start = self.next_tie.fetch_add(1, Ordering::Relaxed);
        (0..count).map(|offset| &self.ranks[(start + offset) % count]).min_by_key(|rank| {
            let stats = rank.stats();
            4 * stats.num_waiting + stats.num_running
        })
    }

    /// Queues a request on the least loaded rank; the receiver yields its events until
    /// `Finished`.
    pub async fn submit(&self, request: NewRequest) -> Result<mpsc::UnboundedReceiver<RequestEvent>, SubmitError> {
        self.pick_rank().ok_or(SubmitError::Stopped)?.submit(request).await
    }

    /// Resets every rank's prefix cache; `false` when any rank refused (requests running).
    pub async fn reset_prefix_cache(&self) -> Result<bool, SubmitError> {
        let mut all = true;
        for rank in self.ranks.iter() {
            all &= rank.reset_prefix_cache().await?;
        }
        Ok(all)
    }
}
