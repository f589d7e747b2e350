//! Admission of the gRPC calls whose cost grows with the prompt (ScoreTokens, GetPodScores,
//! RecordRoute), so that a flood of large prompts cannot hold up every other query.
//!
//! Scoring is synchronous CPU work. Run on the I/O threads, 200 concurrent 262k-token queries
//! kept every thread busy and a normal query waited behind them (p50 1.4 ms → 504 ms).
//! So requests are split by size:
//!
//! - **small** (at most `grpc_small_query_tokens` tokens): answered at once on the I/O thread,
//!   as before; never queued, never shed. Their cost is bounded by that size.
//! - **large**: computed off the I/O threads (tokio's blocking pool), at most
//!   `grpc_max_concurrent_large` at once. One that finds every slot busy waits, if the tokens
//!   already waiting plus its own stay within `grpc_max_queued_tokens`; otherwise it is refused
//!   at once with `RESOURCE_EXHAUSTED` and counted (`kvindex_grpc_shed_total{method}`): a caller
//!   learns immediately that the indexer is overloaded, and the router places the request by
//!   load, instead of every query slowing down.
//!
//! A waiting request whose client goes away gives its place back (the guard is dropped with
//! the handler's future); a running one finishes on its thread and then frees the slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use crate::config::admission::AdmissionConfig;
use crate::telemetry as m;

/// The admission state shared by every gRPC service of one server.
pub struct Admission {
    config: AdmissionConfig,
    slots: Arc<Semaphore>,
    /// Tokens of large requests waiting for a slot.
    queued: Arc<AtomicUsize>,
}

/// What a request was admitted to: the I/O thread (small) or a slot of its own (large).
#[must_use = "an admitted request runs its work through `run`"]
pub struct Admitted {
    slot: Option<Slot>,
}

/// A held slot; frees it (and the gauge) when dropped.
struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        metrics::gauge!(m::GRPC_LARGE_IN_FLIGHT).decrement(1.0);
    }
}

/// Tokens counted as waiting until dropped (admitted or abandoned).
struct Waiting {
    queued: Arc<AtomicUsize>,
    tokens: usize,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let left = self.queued.fetch_sub(self.tokens, Ordering::AcqRel) - self.tokens;
        metrics::gauge!(m::GRPC_QUEUED_TOKENS).set(left as f64);
    }
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Admission {
        let slots = Arc::new(Semaphore::new(config.max_concurrent_large.max(1)));
        metrics::gauge!(m::GRPC_QUEUED_TOKENS).set(0.0);
        Admission { config, slots, queued: Arc::new(AtomicUsize::new(0)) }
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// Admits a `method` request of `tokens` tokens: at once if it is small or a slot is free,
    /// after a wait if the queue has room for it, else `RESOURCE_EXHAUSTED` (counted).
    pub async fn admit(&self, method: &'static str, tokens: usize) -> Result<Admitted, Status> {
        if tokens <= self.config.small_query_tokens {
            return Ok(Admitted { slot: None });
        }
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Admitted::large(permit));
        }
        let before = self.queued.fetch_add(tokens, Ordering::AcqRel);
        let waiting = Waiting { queued: self.queued.clone(), tokens };
        if before + tokens > self.config.max_queued_tokens {
            drop(waiting);
            metrics::counter!(m::GRPC_SHED, "method" => method).increment(1);
            return Err(Status::resource_exhausted(format!(
                "overloaded: all {} slots for requests over {} tokens are busy and {before} tokens already wait \
                 (grpc_max_queued_tokens = {}); retry later",
                self.config.max_concurrent_large, self.config.small_query_tokens, self.config.max_queued_tokens
            )));
        }
        metrics::gauge!(m::GRPC_QUEUED_TOKENS).set((before + tokens) as f64);
        let permit = self.slots.clone().acquire_owned().await.map_err(|_| Status::unavailable("shutting down"))?;
        drop(waiting);
        Ok(Admitted::large(permit))
    }
}

impl Admitted {
    fn large(permit: OwnedSemaphorePermit) -> Admitted {
        metrics::gauge!(m::GRPC_LARGE_IN_FLIGHT).increment(1.0);
        Admitted { slot: Some(Slot { _permit: permit }) }
    }

    /// Whether the request holds a slot of its own (it is large).
    pub fn is_large(&self) -> bool {
        self.slot.is_some()
    }

    /// Runs `work`: on this thread when small, on the blocking pool (holding the slot until it
    /// is done, even if the client goes away meanwhile) when large.
    pub async fn run<T: Send + 'static>(self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, Status> {
        match self.slot {
            None => Ok(work()),
            Some(slot) => tokio::task::spawn_blocking(move || {
                let _slot = slot;
                work()
            })
            .await
            .map_err(|_| Status::internal("the scoring task failed")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(max_concurrent_large: usize, max_queued_tokens: usize) -> Arc<Admission> {
        Arc::new(Admission::new(AdmissionConfig { small_query_tokens: 10, max_concurrent_large, max_queued_tokens }))
    }

    #[tokio::test]
    async fn small_requests_pass_while_large_ones_wait_or_are_shed() {
        let a = admission(1, 100);
        let first = a.admit("ScoreTokens", 50).await.unwrap();
        assert!(first.is_large());
        // Small requests never wait for a slot.
        for _ in 0..3 {
            assert!(!a.admit("ScoreTokens", 10).await.unwrap().is_large());
        }
        // A large one waits while the queue has room ...
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.admit("ScoreTokens", 60).await.map(|adm| adm.is_large()) }
        });
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while a.queued.load(Ordering::Acquire) != 60 {
            assert!(tokio::time::Instant::now() < deadline, "the second request never queued");
            tokio::task::yield_now().await;
        }
        // ... and the next, which would take the queue past 100 tokens, is refused at once.
        let shed = a.admit("ScoreTokens", 41).await.err().expect("shed");
        assert_eq!(shed.code(), tonic::Code::ResourceExhausted);
        assert!(shed.message().contains("grpc_max_queued_tokens = 100"), "{}", shed.message());
        assert_eq!(a.queued.load(Ordering::Acquire), 60, "a shed request leaves nothing queued");
        drop(first);
        assert!(waiter.await.unwrap().unwrap(), "the waiter gets the freed slot");
        assert_eq!(a.queued.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_gives_its_place_back() {
        let a = admission(1, 100);
        let running = a.admit("RecordRoute", 50).await.unwrap();
        let abandoned = tokio::time::timeout(std::time::Duration::from_millis(20), a.admit("RecordRoute", 100)).await;
        assert!(abandoned.is_err(), "it waited for the slot");
        assert_eq!(a.queued.load(Ordering::Acquire), 0);
        // Its 100 tokens left the queue: another 100 may wait (they would be shed otherwise).
        let again = tokio::time::timeout(std::time::Duration::from_millis(20), a.admit("RecordRoute", 100)).await;
        assert!(again.is_err(), "queued, not shed: {:?}", again.map(|r| r.map(|_| ())));
        drop(running);
    }

    #[tokio::test]
    async fn with_no_queue_a_large_request_is_shed_whenever_every_slot_is_busy() {
        let a = admission(2, 0);
        let (x, y) = (a.admit("GetPodScores", 11).await.unwrap(), a.admit("GetPodScores", 11).await.unwrap());
        assert_eq!(a.admit("GetPodScores", 11).await.err().map(|s| s.code()), Some(tonic::Code::ResourceExhausted));
        drop(x);
        let z = a.admit("GetPodScores", 11).await.unwrap();
        // Large work runs on the blocking pool and gives its answer back.
        assert_eq!(z.run(|| 7).await.unwrap(), 7);
        drop(y);
    }
}
