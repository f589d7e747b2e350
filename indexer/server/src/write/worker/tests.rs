//! The worker's scheduling around snapshot exports: only the pods being exported wait, and
//! what one may hold back is bounded.

use std::sync::mpsc;

use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use kvindex_zmtp::Budget;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::execute::MAX_HELD_BACK;
use super::live::applied_seq;
use super::*;
use crate::config::Config;
use crate::persist::snapshot::pool;
use crate::protocols::{Captured, HeldMap};
use crate::queue::Queues;
use crate::test_events::one_block_stored;
use crate::write::context::ServiceState;
use crate::write::transport::Peer;

const MODEL: &str = "m";

fn tokens(pod: usize, seq: u64) -> Vec<u32> {
    (0..16).map(|t| pod as u32 * 100_000 + seq as u32 * 16 + t).collect()
}

fn hash(pod: usize, seq: u64) -> u64 {
    1_000 * (pod as u64 + 1) + seq
}

/// Pod `pod`'s live batch `seq`: one block continuing the block of `seq - 1`.
fn live(pods: &[String], pod: usize, seq: u64) -> Work {
    let payload = one_block_stored(hash(pod, seq), seq.checked_sub(1).map(|s| hash(pod, s)), tokens(pod, seq), 0);
    Work::Live {
        origin: LiveSocket::Central,
        conn: ConnId(pod as u64 + 1),
        peer: Arc::new(Peer::Tcp(format!("127.0.0.{}:5557", pod + 1).parse().unwrap())),
        frames: vec![
            Bytes::from(format!("kv@{}@{MODEL}", pods[pod])),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ],
        lease: Budget::new(1 << 20).lease(),
        at: Instant::now(),
    }
}

/// Blocks of pod `pod`'s chain (batches 0 and 1, and a token past them: the last token is
/// never credited) the index credits it.
fn matched(context: &WorkerContext, pods: &[String], pod: usize) -> u32 {
    let tokens: Vec<u32> = [tokens(pod, 0), tokens(pod, 1), vec![0]].concat();
    let query = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: &tokens, pods: None };
    let score = context.index().score(&query);
    let id = context.index().pods().get(&pods[pod]);
    score.matches.iter().find(|m| Some(m.pod) == id).map_or(0, |m| m.matched_blocks)
}

/// A worker on a service state of its own, and one pod more than the snapshot pool has
/// threads (that one is not exported while they are busy), each with batch 0 applied.
fn worker_with_pods() -> (tokio::runtime::Runtime, Arc<WorkerContext>, Worker, Vec<String>) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let entered = runtime.enter();
    let config = Config::from_args(["--block-size", "16"]).unwrap();
    let (queues, _receivers) = Queues::new(1, 64);
    let index = KvIndex::new(KvIndexConfig { block_size: 16, ..Default::default() });
    let context = Arc::new(WorkerContext::of(&ServiceState::new(config, index, queues)));
    let mut worker = Worker::new(context.clone(), 0);
    let pods: Vec<String> = (0..=pool::threads()).map(|i| format!("10.0.0.{}:8000", i + 1)).collect();
    for pod in 0..pods.len() {
        worker.handle(live(&pods, pod, 0));
        assert_eq!(matched(&context, &pods, pod), 1);
    }
    drop(entered);
    (runtime, context, worker, pods)
}

/// Holds every snapshot pool thread at a gate until the returned senders are dropped: the
/// exports a capture hands out cannot run meanwhile.
fn close_the_pool() -> Vec<mpsc::Sender<()>> {
    let (started_tx, started) = mpsc::channel();
    let gates: Vec<mpsc::Sender<()>> = (0..pool::threads())
        .map(|_| {
            let (gate, wait) = mpsc::channel::<()>();
            let started_tx = started_tx.clone();
            pool::pool().spawn(move || {
                started_tx.send(()).unwrap();
                let _ = wait.recv();
            });
            gate
        })
        .collect();
    for _ in 0..gates.len() {
        started.recv_timeout(Duration::from_secs(10)).expect("every pool thread reaches its gate");
    }
    gates
}

/// The pods out for export.
fn exporting(worker: &Worker, pods: &[String]) -> Vec<usize> {
    (0..pods.len())
        .filter(|&p| worker.table.iter().map(|(_, st)| st).any(|st| *st.pod == *pods[p] && st.ext.exporting.is_some()))
        .collect()
}

#[test]
fn a_snapshot_holds_back_only_the_pods_it_is_exporting() {
    let (runtime, context, mut worker, pods) = worker_with_pods();
    let _entered = runtime.enter();
    let threads = pool::threads();
    let gates = close_the_pool();
    let (reply, mut answer) = tokio::sync::oneshot::channel();
    worker.handle(Work::Snapshot { held: Arc::new(HeldMap::new()), sink: None, reply });
    let exporting = exporting(&worker, &pods);
    assert_eq!(exporting.len(), threads, "one pod per pool thread is out for export, no more");

    // Batch 1 of every pod, while the exports wait.
    for pod in 0..pods.len() {
        worker.handle(live(&pods, pod, 1));
    }
    for pod in 0..pods.len() {
        let st = worker.table.iter().map(|(_, st)| st).find(|st| *st.pod == *pods[pod]).unwrap();
        if exporting.contains(&pod) {
            assert_eq!(matched(&context, &pods, pod), 1, "a pod being exported waits for its export");
            assert_eq!(applied_seq(st), Some(0), "its status says what is applied");
        } else {
            assert_eq!(matched(&context, &pods, pod), 2, "the worker goes on with the other pods");
            assert_eq!(applied_seq(st), Some(1));
        }
    }
    assert!(answer.try_recv().is_err(), "the snapshot is not answered before its exports");

    drop(gates);
    let deadline = Instant::now() + Duration::from_secs(20);
    let captured = loop {
        worker.advance_capture();
        match answer.try_recv() {
            Ok(captured) => break captured,
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                assert!(Instant::now() < deadline, "the snapshot was never answered");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("the capture dropped its answer: {e}"),
        }
    };
    for pod in 0..pods.len() {
        assert_eq!(matched(&context, &pods, pod), 2, "held-back batches apply once the export is done");
    }
    // Each record is its pod at its cursor: the exported ones before batch 1, the other after.
    assert_eq!(captured.len(), pods.len());
    for c in captured {
        let Captured::Fresh { record, .. } = c else { panic!("nothing was stored: every stream is fresh") };
        let pod = pods.iter().position(|p| **p == *record.pod()).unwrap();
        let cursor = if exporting.contains(&pod) { 0 } else { 1 };
        assert_eq!(record.cursor, cursor);
        assert_eq!(record.residencies(), cursor + 1, "the record holds exactly the blocks up to its cursor");
    }
}

#[test]
fn a_pod_held_back_too_long_makes_the_worker_wait_for_its_export() {
    let (runtime, context, mut worker, pods) = worker_with_pods();
    let _entered = runtime.enter();
    let gates = close_the_pool();
    let (reply, _answer) = tokio::sync::oneshot::channel();
    worker.handle(Work::Snapshot { held: Arc::new(HeldMap::new()), sink: None, reply });
    let held = exporting(&worker, &pods)[0];
    let stream = |w: &Worker| {
        w.table
            .iter()
            .map(|(_, st)| st)
            .find(|st| *st.pod == *pods[held])
            .map(|st| (st.ext.exporting, st.ext.waiting.len(), applied_seq(st)))
            .unwrap()
    };
    for seq in 1..MAX_HELD_BACK as u64 {
        worker.handle(live(&pods, held, seq));
    }
    assert_eq!(stream(&worker), (Some(0), MAX_HELD_BACK - 1, Some(0)), "held back, up to the bound");
    // The pool may run again; the batch that reaches the bound waits for the pod's export.
    drop(gates);
    worker.handle(live(&pods, held, MAX_HELD_BACK as u64));
    assert_eq!(stream(&worker), (None, 0, Some(MAX_HELD_BACK as u64)), "the export is done and every batch applied");
    assert_eq!(matched(&context, &pods, held), 2);
}
