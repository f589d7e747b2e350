//! Precise prefix routing through the real service: every simulated step's events reach a
//! `kvindex serve` over ZeroMQ ([`super::service_feed`]), and each prompt is scored by gRPC
//! `ScoreTokens` once the service has applied everything published.
//!
//! It then sees exactly what the in-process [`super::precise::Precise`] sees, one step late,
//! and must route identically. Any difference in hit rate is a bug in the transport, the
//! sequencer or the scoring path, which is what this policy is for.

use std::path::Path;

use kvindex_proto::kvindex::v1::indexer_client::IndexerClient;
use kvindex_proto::kvindex::v1::ScoreTokensRequest;
use tonic::transport::Channel;

use super::service_feed::ServiceFeed;
use super::{pick_weighted, FleetView, Policy};
use crate::engine::KvEvent;

pub struct PreciseGrpc {
    client: IndexerClient<Channel>,
    feed: ServiceFeed,
    model: String,
    block_size: usize,
    rotate: usize,
    failure: Option<String>,
}

impl PreciseGrpc {
    /// Starts `kvindex serve` from `binary` fed by `pods` simulated pods.
    pub fn start(binary: &Path, pods: usize, block_size: usize, model: &str) -> Result<PreciseGrpc, String> {
        let feed = ServiceFeed::start(binary, pods, block_size, model)?;
        let addr = feed.service().grpc_addr.clone();
        let client = feed
            .runtime()
            .block_on(IndexerClient::connect(format!("http://{addr}")))
            .map_err(|e| format!("gRPC connect {addr}: {e}"))?;
        Ok(PreciseGrpc { client, feed, model: model.to_string(), block_size, rotate: 0, failure: None })
    }

    fn score(&mut self, prompt: &[u32], pods: usize) -> Result<Vec<f64>, String> {
        let request =
            ScoreTokensRequest { model: self.model.clone(), token_ids: prompt.to_vec(), ..Default::default() };
        let (feed, client) = (&mut self.feed, &mut self.client);
        let runtime = feed.runtime().handle().clone();
        let response = runtime.block_on(async {
            feed.caught_up().await?;
            client
                .score_tokens(request)
                .await
                .map(|r| r.into_inner())
                .map_err(|status| format!("ScoreTokens: {status}"))
        })?;
        let mut fractions = vec![0.0; pods];
        for found in &response.scores {
            if let Some(slot) = self.feed.pod_index(&found.pod).and_then(|pod| fractions.get_mut(pod)) {
                *slot = (found.matched_blocks as usize * self.block_size) as f64 / prompt.len().max(1) as f64;
            }
        }
        Ok(fractions)
    }
}

impl Policy for PreciseGrpc {
    fn name(&self) -> &str {
        "precise-grpc"
    }

    fn wants_step_events(&self) -> bool {
        true
    }

    fn publish_step(&mut self, pod: usize, events: &[KvEvent]) {
        if !events.is_empty() && self.failure.is_none() {
            self.feed.publish(pod, events);
        }
    }

    fn choose(&mut self, prompt: &[u32], fleet: &FleetView<'_>) -> usize {
        self.rotate = self.rotate.wrapping_add(1);
        let fractions = if self.failure.is_some() {
            vec![0.0; fleet.pods.len()]
        } else {
            match self.score(prompt, fleet.pods.len()) {
                Ok(fractions) => fractions,
                Err(error) => {
                    self.failure = Some(error);
                    vec![0.0; fleet.pods.len()]
                }
            }
        };
        pick_weighted(fleet, &fractions, self.rotate)
    }

    fn failure(&self) -> Option<String> {
        self.failure.clone()
    }
}
