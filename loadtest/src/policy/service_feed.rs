//! A real `kvindex serve` fed with the simulated pods' events: one dialing publisher (the
//! simulator's own wire encoder, topic `kv@sim-pod-<i>@<model>`, a replay ROUTER registered
//! through `POST /pods`) per pod, publishing each step's events as the step ends.
//!
//! The driver runs on a simulated clock, so before a policy reads the service it waits until
//! every pod's `last_seq` in `/debug/sources` shows what was published: the service then knows
//! exactly what an in-process subscriber would, one step late. Shared by the policies that
//! route through the product (`precise-grpc`, and `kvindex-router` processes).

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use crate::engine::KvEvent;
use crate::fleet::topic;
use crate::kvindex_service::{applied, KvindexService};
use crate::wire::{PubEndpoint, Publisher, PublisherConfig, WireVersion};

/// How long the service may take to apply what was published, or to see a new publisher.
const APPLY_DEADLINE: Duration = Duration::from_secs(30);
/// Between polls of `/debug/sources` while waiting: short, since a loopback apply takes
/// well under a millisecond.
const POLL_INTERVAL: Duration = Duration::from_millis(1);

struct FedPod {
    id: String,
    publisher: Publisher,
}

pub struct ServiceFeed {
    // Field order is drop order: the publishers' tasks stop with the runtime, then the service.
    runtime: Runtime,
    pods: Vec<FedPod>,
    service: KvindexService,
    /// Batches published since the service was last seen caught up.
    unconfirmed: bool,
}

impl ServiceFeed {
    /// Starts `kvindex serve` from `binary` and one publisher per pod, registers the pods, and
    /// waits until the service receives every pod's stream.
    pub fn start(binary: &Path, pods: usize, block_size: usize, model: &str) -> Result<ServiceFeed, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let service = KvindexService::start(binary, block_size)?;
        let pods = runtime.block_on(async {
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
                service.register_pod(&id, model, publisher.bound_replay_endpoint.as_deref()).await?;
                started.push(FedPod { id, publisher });
            }
            for pod in &started {
                join(&service, pod).await?;
            }
            Ok::<_, String>(started)
        })?;
        Ok(ServiceFeed { runtime, pods, service, unconfirmed: false })
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    pub fn service(&self) -> &KvindexService {
        &self.service
    }

    /// The pod id the service reports for simulated pod `index`.
    pub fn pod_id(&self, index: usize) -> Option<&str> {
        self.pods.get(index).map(|p| p.id.as_str())
    }

    pub fn pod_index(&self, id: &str) -> Option<usize> {
        self.pods.iter().position(|p| p.id == id)
    }

    /// Publishes a pod's step events.
    pub fn publish(&mut self, pod: usize, events: &[KvEvent]) {
        let Some(target) = self.pods.get(pod) else {
            return;
        };
        self.runtime.block_on(target.publisher.publish(events.to_vec()));
        self.unconfirmed = true;
    }

    /// Waits, if anything was published since the last time, until the service applied it.
    pub async fn caught_up(&mut self) -> Result<(), String> {
        if !std::mem::take(&mut self.unconfirmed) {
            return Ok(());
        }
        let deadline = Instant::now() + APPLY_DEADLINE;
        let targets: Vec<(&str, u64)> =
            self.pods.iter().map(|p| (p.id.as_str(), p.publisher.stats().next_seq)).collect();
        loop {
            let sources = self.service.sources().await?;
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
}

/// Makes sure the service receives `pod`'s live stream before the run: a dialing PUB drops what
/// it sends before the SUB's subscription arrives (ZeroMQ's slow joiner), so it publishes
/// `AllBlocksCleared` (a no-op on an empty pod) until the service has applied one. A lost
/// first batch is replayed from the pod's ROUTER when the next one shows the gap.
async fn join(service: &KvindexService, pod: &FedPod) -> Result<(), String> {
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
            return Err(format!("kvindex serve did not receive {}'s stream within {APPLY_DEADLINE:?}", pod.id));
        }
    }
}
