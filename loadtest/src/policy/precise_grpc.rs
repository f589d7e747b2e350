//! Precise prefix routing through the real service: every simulated step's events go out on a
//! real ZeroMQ PUB per pod (the simulator's own publisher and wire encoder, topic
//! `kv@<pod>@<model>`) to a `kvindex serve` central SUB, and each prompt is scored by gRPC
//! `ScoreTokens`.
//!
//! The driver runs on a simulated clock, so before each choice this policy waits until the
//! service has applied every batch published so far (each pod's `last_seq` in
//! `/debug/sources`): it then sees exactly what the in-process [`super::precise::Precise`] sees,
//! one step late, and must route identically. Any difference in hit rate is a bug in the
//! transport, the sequencer or the scoring path, which is what this policy is for.

use std::path::Path;
use std::time::{Duration, Instant};

use kvindex_proto::kvindex::v1::indexer_client::IndexerClient;
use kvindex_proto::kvindex::v1::ScoreTokensRequest;
use tokio::runtime::Runtime;
use tonic::transport::Channel;

use super::{pick_weighted, FleetView, Policy};
use crate::engine::KvEvent;
use crate::fleet::topic;
use crate::kvindex_service::{applied, KvindexService};
use crate::wire::{PubEndpoint, Publisher, PublisherConfig, WireVersion};

/// How long the service may take to apply what was published, or to see a new publisher.
const APPLY_DEADLINE: Duration = Duration::from_secs(30);
/// Between polls of `/debug/sources` while waiting: short, since a loopback apply takes
/// well under a millisecond.
const POLL_INTERVAL: Duration = Duration::from_millis(1);

struct GrpcPod {
    id: String,
    publisher: Publisher,
}

pub struct PreciseGrpc {
    // Field order is drop order: the publishers' tasks stop with the runtime, then the service.
    runtime: Runtime,
    pods: Vec<GrpcPod>,
    client: IndexerClient<Channel>,
    service: KvindexService,
    model: String,
    block_size: usize,
    rotate: usize,
    /// Batches published since the service was last seen caught up.
    unconfirmed: bool,
    failure: Option<String>,
}

impl PreciseGrpc {
    /// Starts `kvindex serve` from `binary`, one dialing publisher (with a replay ROUTER) per
    /// pod, registers the pods, and waits until the service receives every pod's stream.
    pub fn start(
        binary: &Path,
        pods: usize,
        block_size: usize,
        model: &str,
    ) -> Result<PreciseGrpc, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let service = KvindexService::start(binary, block_size)?;
        let (pods, client) = runtime.block_on(async {
            let mut started = Vec::with_capacity(pods);
            for index in 0..pods {
                let id = format!("sim-pod-{index}");
                let publisher = Publisher::start(PublisherConfig {
                    topic: topic(&id, model),
                    endpoint: PubEndpoint::Connect(service.zmq_endpoint.clone()),
                    replay_endpoint: Some("tcp://127.0.0.1:0".into()),
                    buffer_steps: 100_000,
                    wire: WireVersion::V0_33,
                    data_parallel_rank: 0,
                })
                .await?;
                service
                    .register_pod(&id, model, publisher.bound_replay_endpoint.as_deref())
                    .await?;
                started.push(GrpcPod { id, publisher });
            }
            let client = IndexerClient::connect(format!("http://{}", service.grpc_addr))
                .await
                .map_err(|e| format!("gRPC connect {}: {e}", service.grpc_addr))?;
            for pod in &started {
                join(&service, pod).await?;
            }
            Ok::<_, String>((started, client))
        })?;
        Ok(PreciseGrpc {
            runtime,
            pods,
            client,
            service,
            model: model.to_string(),
            block_size,
            rotate: 0,
            unconfirmed: false,
            failure: None,
        })
    }

    fn score(&mut self, prompt: &[u32], pods: usize) -> Result<Vec<f64>, String> {
        let service = &self.service;
        let publishers: Vec<(&str, &Publisher)> = self
            .pods
            .iter()
            .map(|p| (p.id.as_str(), &p.publisher))
            .collect();
        let request = ScoreTokensRequest {
            model: self.model.clone(),
            token_ids: prompt.to_vec(),
            ..Default::default()
        };
        let client = &mut self.client;
        let wait = std::mem::take(&mut self.unconfirmed);
        let response = self.runtime.block_on(async move {
            if wait {
                caught_up(service, &publishers).await?;
            }
            client
                .score_tokens(request)
                .await
                .map(|r| r.into_inner())
                .map_err(|status| format!("ScoreTokens: {status}"))
        })?;
        let mut fractions = vec![0.0; pods];
        for found in &response.scores {
            if let Some(pod) = self.pods.iter().position(|p| p.id == found.pod) {
                if let Some(slot) = fractions.get_mut(pod) {
                    *slot = (found.matched_blocks as usize * self.block_size) as f64
                        / prompt.len().max(1) as f64;
                }
            }
        }
        Ok(fractions)
    }
}

/// Makes sure the service receives `pod`'s live stream before the run: a dialing PUB drops what
/// it sends before the SUB's subscription arrives (ZeroMQ's slow joiner), so it publishes
/// `AllBlocksCleared` (a no-op on an empty pod) until the service has applied one. A lost
/// first batch is replayed from the pod's ROUTER when the next one shows the gap.
async fn join(service: &KvindexService, pod: &GrpcPod) -> Result<(), String> {
    let deadline = Instant::now() + APPLY_DEADLINE;
    loop {
        pod.publisher.publish(vec![KvEvent::AllBlocksCleared]).await;
        let published = pod.publisher.stats().next_seq;
        // Give this batch a moment to arrive before sending another: polls, not a fixed wait.
        let retry_at = Instant::now() + Duration::from_millis(100);
        while Instant::now() < retry_at {
            if applied(&service.sources().await?, &pod.id, published)? {
                return Ok(());
            }
            tokio::time::sleep(POLL_INTERVAL * 5).await;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "kvindex serve did not receive {}'s stream within {APPLY_DEADLINE:?}",
                pod.id
            ));
        }
    }
}

/// Waits until the service applied everything every pod published.
async fn caught_up(service: &KvindexService, pods: &[(&str, &Publisher)]) -> Result<(), String> {
    let deadline = Instant::now() + APPLY_DEADLINE;
    let targets: Vec<(&str, u64)> = pods
        .iter()
        .map(|(id, publisher)| (*id, publisher.stats().next_seq))
        .collect();
    loop {
        let sources = service.sources().await?;
        let mut all = true;
        for (id, next_seq) in &targets {
            all &= applied(&sources, id, *next_seq)?;
        }
        if all {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "kvindex serve did not apply every pod's batches {targets:?} within {APPLY_DEADLINE:?}"
            ));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
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
        if events.is_empty() || self.failure.is_some() {
            return;
        }
        let Some(target) = self.pods.get(pod) else {
            return;
        };
        self.runtime
            .block_on(target.publisher.publish(events.to_vec()));
        self.unconfirmed = true;
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
