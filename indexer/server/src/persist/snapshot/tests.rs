//! Incremental snapshots against the live index: a running apply worker, its pods changed,
//! cleared and removed between snapshots, and after each snapshot the stored one, loaded as
//! a restart would load it, compared with what the live index holds. A snapshot that kept a
//! record its pod had moved away from (a skipped change) fails here: the stored record would
//! no longer be the pod's export, and the restored index would credit what the pod dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use kvindex_zmtp::Budget;

use super::store::SnapshotDir;
use super::*;
use crate::config::Config;
use crate::protocols::{ConnId, Peer};
use crate::protocols::{LiveSocket, Work};
use crate::queue::Queues;
use crate::test_events::{all_blocks_cleared, blocks_removed, one_block_stored};
use crate::write::worker::context::WorkerContext;
use crate::write::worker::Worker;

const MODEL: &str = "m";
const PODS: usize = 4;

fn pod(p: usize) -> String {
    format!("10.0.1.{}:8000", p + 1)
}

fn tokens(p: usize, block: u64) -> Vec<u32> {
    (0..16).map(|t| p as u32 * 100_000 + block as u32 * 16 + t).collect()
}

fn hash(p: usize, block: u64) -> u64 {
    1_000_000 * (p as u64 + 1) + block
}

/// A service state with one apply worker running on its own thread, snapshotting to `dir`.
struct Service {
    runtime: tokio::runtime::Runtime,
    state: Arc<ServiceState>,
    snapshots: Arc<Snapshots>,
    /// Each pod's next seq.
    seqs: HashMap<usize, u64>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Service {
    fn start(dir: &std::path::Path) -> Service {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let entered = runtime.enter();
        let config = Config::from_args(["--block-size", "16"]).unwrap();
        let (queues, mut receivers) = Queues::new(1, 64);
        let index = KvIndex::new(KvIndexConfig { block_size: 16, ..Default::default() });
        let state = Arc::new(ServiceState::new(config, index, queues));
        let snapshots = open(&state, Some(SnapshotDir::claim(dir).unwrap())).unwrap().expect("a snapshot dir");
        let rx = receivers.remove(0);
        let worker_context = Arc::new(WorkerContext::of(&state));
        let worker = std::thread::spawn(move || Worker::new(worker_context, 0).run(rx));
        drop(entered);
        Service { runtime, state, snapshots, seqs: HashMap::new(), worker: Some(worker) }
    }

    /// Sends pod `p`'s next batch.
    fn publish(&mut self, p: usize, payload: Vec<u8>) {
        let seq = self.seqs.entry(p).or_insert(0);
        let work = Work::Live {
            origin: LiveSocket::Central,
            conn: ConnId(p as u64 + 1),
            peer: Arc::new(Peer::Tcp(format!("127.0.1.{}:5557", p + 1).parse().unwrap())),
            frames: vec![
                Bytes::from(format!("kv@{}@{MODEL}", pod(p))),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                Bytes::from(payload),
            ],
            lease: Budget::new(1 << 20).lease(),
            at: Instant::now(),
        };
        *seq += 1;
        assert!(self.runtime.block_on(self.state.queues().send(0, work)), "the worker takes work");
    }

    /// Stores blocks `from..to` of pod `p`'s chain, one batch each.
    fn store(&mut self, p: usize, from: u64, to: u64) {
        for b in from..to {
            let parent = b.checked_sub(1).map(|b| hash(p, b));
            self.publish(p, one_block_stored(hash(p, b), parent, tokens(p, b), 0));
        }
    }

    /// Waits until every pod in `blocks` holds that many blocks.
    fn settle(&self, blocks: &[(usize, u64)]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let held = |&(p, n): &(usize, u64)| self.state.index().pod_stats(&pod(p)).map(|s| s.blocks) == Some(n);
            if blocks.iter().all(held) {
                return;
            }
            assert!(Instant::now() < deadline, "the worker never applied the batches");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn snapshot(&self) {
        self.runtime.block_on(take(&self.state, &self.snapshots, false)).expect("the snapshot is written");
    }

    /// The generation each stream's stored record was written by.
    fn generations(&self) -> HashMap<String, u64> {
        let stored = self.runtime.block_on(self.snapshots.held.lock());
        stored.held.iter().map(|(k, h)| (k.clone(), h.generation)).collect()
    }

    /// The stored snapshot, loaded as a restart loads it, is exactly the live index: each
    /// record is its pod's export now, no pod is missing or extra, and the records imported
    /// into a fresh index answer every prompt as the live index does.
    fn assert_restore_is_live(&self, live_pods: &[usize]) {
        let loaded = self.snapshots.store().load(kvindex::keys::RECIPE_VERSION, 16).unwrap().expect("a snapshot");
        let live = self.state.index();
        let mut pods: Vec<&str> = loaded.streams.iter().map(|r| r.pod()).collect();
        pods.sort_unstable();
        let mut expected: Vec<String> = live_pods.iter().map(|&p| pod(p)).collect();
        expected.sort_unstable();
        assert_eq!(pods, expected, "one record per live stream, none for a removed one");
        let restored = KvIndex::new(KvIndexConfig { block_size: 16, ..Default::default() });
        for record in loaded.streams {
            let now = live.export_pod(record.pod()).expect("a live pod");
            assert_eq!(record.export, now, "{}'s record is its pod as it is now", record.pod());
            assert_eq!(restored.import_pod(&record.into_export()).refused, 0);
        }
        for p in 0..PODS {
            for len in 1..=12u64 {
                let prompt: Vec<u32> = (0..len).flat_map(|b| tokens(p, b)).chain([7]).collect();
                let q = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: &prompt, pods: None };
                let credit = |index: &KvIndex| {
                    let mut m: Vec<(Option<String>, u32)> = index
                        .score(&q)
                        .matches
                        .iter()
                        .map(|m| (index.pods().name(m.pod).map(|n| n.to_string()), m.matched_blocks))
                        .filter(|m| m.1 > 0)
                        .collect();
                    m.sort();
                    m
                };
                assert_eq!(credit(&restored), credit(live), "pod {p}'s chain of {len} blocks");
            }
        }
        assert_eq!(restored.table().entries(), live.table().entries());
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.runtime.block_on(self.state.queues().send(0, Work::Stop));
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Pods changed, cleared (by their engine, and by the service without their stream moving)
/// and removed between incremental snapshots: each snapshot restores exactly the live index,
/// and rewrites only the records of the pods that changed.
#[test]
fn incremental_snapshots_restore_exactly_the_live_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = Service::start(dir.path());
    for p in 0..PODS {
        service.store(p, 0, 6);
    }
    service.settle(&[(0, 6), (1, 6), (2, 6), (3, 6)]);
    service.snapshot();
    service.assert_restore_is_live(&[0, 1, 2, 3]);
    let first = service.generations();
    assert_eq!(first.len(), PODS);

    // Pod 0 grows and loses a block, pod 1 is cleared by its engine and stores again, pod 2
    // is cleared by its engine, pod 3 does not move.
    service.store(0, 6, 9);
    service.publish(0, blocks_removed(vec![hash(0, 8)], 0));
    service.publish(1, all_blocks_cleared(0));
    service.store(1, 0, 2);
    service.publish(2, all_blocks_cleared(0));
    service.settle(&[(0, 8), (1, 2), (2, 0), (3, 6)]);
    service.snapshot();
    service.assert_restore_is_live(&[0, 1, 2, 3]);
    let second = service.generations();
    let key = |p: usize| format::stream_key(&pod(p), 0);
    assert_eq!(second[&key(3)], first[&key(3)], "the pod that did not move keeps its record");
    for p in 0..3 {
        assert!(second[&key(p)] > first[&key(p)], "pod {p} moved: its record is written again");
    }

    // The service clears pod 3 (as it does on a gap it cannot replay): its stream's cursor
    // does not move, its pod does. Pod 1 is removed.
    assert!(service.state.index().clear_pod(&pod(3)) > 0);
    let (done, removed) = tokio::sync::oneshot::channel();
    assert!(service.runtime.block_on(service.state.queues().send(0, Work::RemovePod { pod: pod(1), done })));
    assert!(service.runtime.block_on(removed).unwrap(), "pod 1 was known");
    service.settle(&[(3, 0)]);
    service.snapshot();
    service.assert_restore_is_live(&[0, 2, 3]);
    let third = service.generations();
    assert!(third[&key(3)] > second[&key(3)], "a pod cleared under a still cursor is written again");
    assert_eq!(third[&key(0)], second[&key(0)]);
    assert!(!third.contains_key(&key(1)), "a removed pod's record is gone");

    // And from disk, after the store is closed: the same snapshot.
    let live: Vec<_> = [0, 2, 3].iter().map(|&p| service.state.index().export_pod(&pod(p)).unwrap()).collect();
    drop(service);
    let store = Store::open(Arc::new(SnapshotDir::claim(dir.path()).unwrap())).unwrap();
    let loaded = store.load(kvindex::keys::RECIPE_VERSION, 16).unwrap().unwrap();
    assert!(loaded.leftovers.is_empty(), "every replaced record was deleted");
    let mut exports: Vec<_> = loaded.streams.into_iter().map(StreamRecord::into_export).collect();
    exports.sort_by(|a, b| a.pod.cmp(&b.pod));
    assert_eq!(exports, live);
}
