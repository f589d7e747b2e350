//! Phase 6 (`E2E_OVERLOAD`): overload. 64 pods that bind a PUB (queueing like vLLM's, see
//! [`super::hwm_pub`]) and a replay ROUTER keeping the last 10,000 batches (vLLM's default
//! `buffer_steps`), dialled by `kvindex serve --pod ...` with its default settings. Each
//! multiple of the server's capacity gets a fresh server and fresh pods: a warm-up at half the
//! capacity, `E2E_OVERLOAD_SECS` (default 60) at the multiple, then back to a quarter of the
//! capacity until every pod is EXACT and caught up (at most `E2E_OVERLOAD_RECOVER_SECS`, default
//! 300), then silence and a last check of every pod.
//!
//! Capacity (`E2E_OVERLOAD_CAPACITY`, block ops/s) is what the server applies while offered
//! more than it can take; unset, it is measured first (a probe at `E2E_OVERLOAD_PROBE`, default
//! 3M block ops/s, for 10 s). Pin it to compare two builds at the same offered rates.
//!
//! Every pod's batches follow from their seq alone (conversations of 8 stores, each followed by
//! one batch evicting the conversation `KEEP - 1` back), so the publisher's truth at any seq is
//! arithmetic: an over-report is a pod credited with a block of a conversation whose eviction
//! is at or below the seq the server says it applied. Probed every second during the phase and
//! for every pod at the end; must be 0. The same probe at the seq the engine *published*
//! counts what lag costs in claims (blocks credited that the engine had already evicted, its
//! eviction still in flight): `max_source_staleness_ms` withholds a source too far behind, so
//! those stop once every pod is past the bound (`stale sources peak`, `scores withheld`).

use std::collections::HashSet;

use super::hwm_pub::{Frames, HwmPub};
use super::*;

/// Conversations a pod holds at most (the one being stored included).
const KEEP: u64 = 4;
/// Batches per conversation: its stores and one eviction.
const CYCLE: u64 = CHUNKS as u64 + 1;
/// Block ops per cycle once evictions run: 8 × 16 stored, 128 removed.
const OPS_PER_CYCLE: f64 = (2 * CHUNKS * STORE_BLOCKS) as f64;
/// vLLM's `buffer_steps` default.
const BUFFER_STEPS: u64 = 10_000;
/// vLLM's PUB high-water mark default.
const HWM: usize = 100_000;
/// How often a pod notes (seq, time), for the publish → visible staleness.
const MARK_EVERY: Duration = Duration::from_millis(10);

fn pod_id(id: usize) -> String {
    format!("10.7.{}.{}:8000", id / 256, id % 256)
}

/// Publisher `id`'s hash of block `b` (0..128) of conversation `conv` (per-pod hashing, as
/// [`store_payload`] does it).
fn block_hash(id: usize, conv: u64, b: usize) -> u64 {
    ((id as u64) << 48) ^ (conv << 16) ^ b as u64 ^ 0x9e37_79b9_7f4a_7c15
}

/// Batch `seq` of pod `id`: chunk `seq % CYCLE` of conversation `seq / CYCLE`, or the eviction of
/// conversation `seq / CYCLE + 1 - KEEP` (an empty batch while there is none to evict).
fn payload(id: usize, seq: u64) -> Bytes {
    let (conv, k) = (seq / CYCLE, (seq % CYCLE) as usize);
    if k < CHUNKS {
        let mut tokens = vec![0u32; STORE_BLOCKS * BLOCK];
        let parent = (k > 0).then(|| block_hash(id, conv, k * STORE_BLOCKS - 1));
        return store_payload(id, conv, k, parent, false, &mut tokens).0;
    }
    match (conv + 1).checked_sub(KEEP) {
        Some(old) => eviction_payload((0..CHUNKS * STORE_BLOCKS).rev().map(|b| block_hash(id, old, b))),
        None => Bytes::from(rmp_serde::to_vec_named(&(now_ts(), Vec::<Removed>::new(), 0i64)).unwrap()),
    }
}

/// The seq whose batch evicts conversation `conv`.
fn evicted_at(conv: u64) -> u64 {
    (conv + KEEP - 1) * CYCLE + CHUNKS as u64
}

/// The tokens of pod `id`'s conversation `conv` (as [`store_payload`] fills them, chunk by chunk).
fn conversation_tokens(id: usize, conv: u64) -> Vec<u32> {
    (0..(CHUNKS * STORE_BLOCKS * BLOCK) as u64)
        .map(|t| ((id as u64 * 1_000_003 + conv * 7919 + t) % 151_000) as u32)
        .collect()
}

struct Pod {
    id: usize,
    publisher: Arc<HwmPub>,
    /// Batches published (the next seq).
    next: Arc<AtomicU64>,
    /// (seq, when it was published), every [`MARK_EVERY`].
    marks: parking_lot::Mutex<Vec<(u64, Instant)>>,
}

impl Pod {
    /// When batch `seq` was published (to [`MARK_EVERY`], early).
    fn published_at(&self, seq: u64) -> Option<Instant> {
        let marks = self.marks.lock();
        let i = marks.partition_point(|(s, _)| *s <= seq);
        i.checked_sub(1).map(|i| marks[i].1)
    }
}

/// Binds pod `id`'s PUB and replay ROUTER. Returns the pod and its two endpoints.
async fn start_pod(id: usize, hwm: usize) -> (Arc<Pod>, String, String) {
    let topic = Bytes::from(format!("kv@{}@{MODEL}", pod_id(id)));
    let frames: Frames = {
        let topic = topic.clone();
        Arc::new(move |seq| vec![topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload(id, seq)])
    };
    let (publisher, pub_ep) = HwmPub::bind(hwm, frames).await;
    let next = Arc::new(AtomicU64::new(0));
    let mut router = RouterSocket::new();
    let replay_ep = router.bind("tcp://127.0.0.1:0").await.expect("bind ROUTER").to_string();
    let published = next.clone();
    tokio::spawn(async move {
        while let Ok(request) = router.recv().await {
            let frames = request.into_vec();
            let (Some(identity), Some(start)) = (frames.first(), frames.get(2)) else { continue };
            let Ok(start) = <[u8; 8]>::try_from(&start[..]).map(u64::from_be_bytes) else { continue };
            // Every buffered batch from `start` on: the buffer holds the last BUFFER_STEPS.
            let end = published.load(Ordering::Relaxed);
            for seq in start.max(end.saturating_sub(BUFFER_STEPS))..end {
                let reply =
                    vec![identity.clone(), Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload(id, seq)];
                if router.send(ZmqMessage::try_from(reply).unwrap()).await.is_err() {
                    break;
                }
            }
            let end = vec![identity.clone(), Bytes::new(), Bytes::from_static(&[0xff; 8]), Bytes::new()];
            let _ = router.send(ZmqMessage::try_from(end).unwrap()).await;
        }
    });
    let pod = Arc::new(Pod { id, publisher, next, marks: parking_lot::Mutex::new(Vec::new()) });
    (pod, pub_ep, replay_ep)
}

/// Paces every pod at `rate` block ops/s in all (f64 bits), one batch at a time, from one task.
fn pace(pods: Vec<Arc<Pod>>, rate: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last = Instant::now();
        let mut credit = 0.0f64;
        let mut marked = Instant::now() - MARK_EVERY;
        loop {
            tick.tick().await;
            let now = Instant::now();
            let per_pod =
                f64::from_bits(rate.load(Ordering::Relaxed)) / OPS_PER_CYCLE * CYCLE as f64 / PUBLISHERS as f64;
            // At most 100 ms of credit: a starved pacer does not burst for seconds.
            credit = (credit + now.duration_since(last).as_secs_f64() * per_pod).min(per_pod * 0.1 + 1.0);
            last = now;
            let n = credit.floor() as u64;
            credit -= n as f64;
            let mark = now.duration_since(marked) >= MARK_EVERY;
            if mark {
                marked = now;
            }
            for pod in &pods {
                let first = pod.next.load(Ordering::Relaxed);
                if mark {
                    pod.marks.lock().push((first, now));
                }
                for seq in first..first + n {
                    pod.publisher.publish(seq);
                }
                pod.next.store(first + n, Ordering::Relaxed);
            }
        }
    })
}

fn set_rate(rate: &AtomicU64, ops: f64) {
    rate.store(ops.to_bits(), Ordering::Relaxed);
}

/// One stream's row of `/debug/sources`.
struct Source {
    state: String,
    last_seq: Option<u64>,
    clears: u64,
    replays_started: u64,
    lag_ms: Option<f64>,
    /// Past `max_source_staleness_ms`: withheld from scores (absent before it existed).
    stale: bool,
}

fn sources(server: &Server) -> std::collections::HashMap<String, Source> {
    let v: serde_json::Value = serde_json::from_str(&server.get("/debug/sources")).unwrap_or_default();
    v["sources"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let source = Source {
                        state: s["state"].as_str().unwrap_or("?").to_string(),
                        last_seq: s["last_seq"].as_u64(),
                        clears: s["clears"].as_u64().unwrap_or(0),
                        replays_started: s["replays_started"].as_u64().unwrap_or(0),
                        lag_ms: s["lag_ms"].as_f64(),
                        stale: s["stale"].as_bool().unwrap_or(false),
                    };
                    (s["pod"].as_str().unwrap_or("").to_string(), source)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Pod `pod`'s matched blocks for its conversation `conv`.
async fn matched(client: &mut IndexerClient<tonic::transport::Channel>, pod: &Pod, conv: u64) -> u32 {
    let req = ScoreTokensRequest {
        model: MODEL.into(),
        token_ids: conversation_tokens(pod.id, conv),
        pods: vec![pod_id(pod.id)],
        ..Default::default()
    };
    match client.score_tokens(req).await {
        Ok(r) => r
            .into_inner()
            .scores
            .iter()
            .filter(|s| s.pod == pod_id(pod.id))
            .map(|s| s.matched_blocks)
            .max()
            .unwrap_or(0),
        Err(_) => 0,
    }
}

/// Over-reports of `pod` at applied seq `applied`: blocks credited to it of the `convs` most
/// recently evicted conversations (the publisher evicted them at or below `applied`).
async fn over_reports(
    client: &mut IndexerClient<tonic::transport::Channel>,
    pod: &Pod,
    applied: u64,
    convs: u64,
) -> u64 {
    // The newest conversation whose eviction is at or below `applied`.
    let Some(newest) =
        (applied + 1).checked_sub(CHUNKS as u64 + 1).map(|s| s / CYCLE).and_then(|c| c.checked_sub(KEEP - 1))
    else {
        return 0;
    };
    debug_assert!(evicted_at(newest) <= applied);
    let mut over = 0;
    for conv in newest.saturating_sub(convs - 1)..=newest {
        over += u64::from(matched(client, pod, conv).await);
    }
    over
}

/// Blocks credited to `pod` of the oldest conversation it holds at the seq the server applied,
/// when its engine had already evicted it by the seq it published: a claim lag makes (its
/// eviction is in flight). 0 when that conversation is not evicted at the engine either.
async fn engine_evicted_credit(
    client: &mut IndexerClient<tonic::transport::Channel>,
    pod: &Pod,
    applied: u64,
    published: u64,
) -> u64 {
    // Conversations c with evicted_at(c) <= applied are gone from the index; the next is held.
    let oldest_held = applied.checked_sub(CHUNKS as u64).map_or(0, |a| (a / CYCLE + 2).saturating_sub(KEEP));
    debug_assert!(evicted_at(oldest_held) > applied);
    if evicted_at(oldest_held) > published || (oldest_held + 1) * CYCLE > applied {
        return 0;
    }
    u64::from(matched(client, pod, oldest_held).await)
}

#[derive(Default)]
struct Samples {
    /// Publish → visible staleness of each pod at each sample, s.
    staleness: Vec<f64>,
    /// The server's own largest source lag at each sample, s (`lag_ms` of `/debug/sources`).
    server_lag: Vec<f64>,
    degraded_ever: HashSet<String>,
    degraded_peak: usize,
    over: u64,
    probes: u64,
    /// Most sources withheld as too far behind their engine at once.
    stale_peak: usize,
    /// Blocks credited that the engine had evicted at its own (published) seq
    /// ([`engine_evicted_credit`]): what lag costs in claims (the probe above is at the
    /// applied seq).
    lag_over: u64,
}

impl Samples {
    /// Staleness and states of every pod now; over-report probes of `probe` pods.
    async fn take(
        &mut self,
        server: &Server,
        pods: &[Arc<Pod>],
        client: &mut IndexerClient<tonic::transport::Channel>,
        probe: &mut dyn Iterator<Item = usize>,
    ) -> std::collections::HashMap<String, Source> {
        let now = Instant::now();
        let view = sources(server);
        for pod in pods {
            let Some(s) = view.get(&pod_id(pod.id)) else { continue };
            let oldest_unapplied = s.last_seq.map_or(0, |l| l + 1);
            let stale = if oldest_unapplied < pod.next.load(Ordering::Relaxed) {
                pod.published_at(oldest_unapplied).map_or(0.0, |at| now.duration_since(at).as_secs_f64())
            } else {
                0.0
            };
            self.staleness.push(stale);
            if s.state == "DEGRADED" {
                self.degraded_ever.insert(pod_id(pod.id));
            }
        }
        self.degraded_peak = self.degraded_peak.max(view.values().filter(|s| s.state == "DEGRADED").count());
        // The server's own view of it (`lag_ms` in `/debug/sources`; absent before it existed).
        self.server_lag.push(view.values().filter_map(|s| s.lag_ms).fold(0.0, f64::max) / 1e3);
        self.stale_peak = self.stale_peak.max(view.values().filter(|s| s.stale).count());
        for i in probe {
            let pod = &pods[i];
            if let Some(applied) = view.get(&pod_id(pod.id)).and_then(|s| s.last_seq) {
                self.over += over_reports(client, pod, applied, 1).await;
                self.probes += 1;
                let published = pod.next.load(Ordering::Relaxed).saturating_sub(1);
                self.lag_over += engine_evicted_credit(client, pod, applied, published).await;
            }
        }
        view
    }
}

pub struct OverloadResult {
    multiple: f64,
    offered: f64,
    published: f64,
    applied: f64,
    publisher_drops: u64,
    queue_drops: f64,
    gaps: f64,
    replays_started: u64,
    filled: f64,
    failed: f64,
    clears: f64,
    pods_cleared: usize,
    degraded_ever: usize,
    degraded_end: usize,
    over: u64,
    probes: u64,
    stale_peak: usize,
    lag_over: u64,
    withheld: f64,
    receive_ms: [f64; 2],
    event_ms: [f64; 2],
    stale_s: [f64; 3],
    server_lag_max_s: f64,
    exact_after_s: Option<f64>,
    caught_up_after_s: Option<f64>,
    /// How long after the stop they were waited for.
    window_s: f64,
    /// None: the index was still applying at the end of the window, so not checked.
    final_under: Option<u64>,
}

/// Starts 64 pods and a server dialling them; waits for `/readyz`.
async fn start(hwm: usize) -> (Server, Vec<Arc<Pod>>, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let mut args: Vec<String> = Vec::new();
    let mut pods = Vec::new();
    for id in 0..PUBLISHERS {
        let (pod, pub_ep, replay_ep) = start_pod(id, hwm).await;
        args.push("--pod".into());
        args.push(format!("{},{MODEL},{pub_ep},{replay_ep}", pod_id(id)));
        pods.push(pod);
    }
    let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(poll_until(60, || server.get("/readyz").starts_with("ready")).await, "the server never got ready");
    let rate = Arc::new(AtomicU64::new(0f64.to_bits()));
    let pacer = pace(pods.clone(), rate.clone());
    (server, pods, rate, pacer)
}

/// Whether every pod is EXACT and has applied everything up to `targets` (seqs, exclusive).
fn all_exact(view: &std::collections::HashMap<String, Source>) -> bool {
    view.len() == PUBLISHERS && view.values().all(|s| s.state == "EXACT")
}

fn caught_up(view: &std::collections::HashMap<String, Source>, pods: &[Arc<Pod>], targets: &[u64]) -> bool {
    pods.iter()
        .zip(targets)
        .all(|(p, &t)| view.get(&pod_id(p.id)).is_some_and(|s| s.last_seq.map_or(0, |l| l + 1) >= t))
}

/// What the server applies while offered `probe` block ops/s (the last 6 of 10 s).
pub async fn calibrate(probe: f64) -> f64 {
    let (server, _pods, rate, pacer) = start(HWM).await;
    set_rate(&rate, probe);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (b0, t0) = (server.metric("kvindex_blocks_total", ""), Instant::now());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let applied = (server.metric("kvindex_blocks_total", "") - b0) / t0.elapsed().as_secs_f64();
    pacer.abort();
    applied
}

pub async fn phase(multiple: f64, capacity: f64, secs: f64, hwm: usize) -> OverloadResult {
    let (server, pods, rate, pacer) = start(hwm).await;
    let mut client = IndexerClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let mut probe = (0..PUBLISHERS).cycle().step_by(7);
    // Warm-up at half the capacity: every pod EXACT and caught up before the overload.
    set_rate(&rate, 0.5 * capacity);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let targets: Vec<u64> = pods.iter().map(|p| p.next.load(Ordering::Relaxed)).collect();
    assert!(
        poll_until(60, || {
            let v = sources(&server);
            all_exact(&v) && caught_up(&v, &pods, &targets)
        })
        .await,
        "the warm-up at half the capacity never settled"
    );
    let counters = |s: &Server| {
        [
            s.metric("kvindex_blocks_total", ""),
            s.metric("kvindex_queue_dropped_total", ""),
            s.metric("kvindex_gaps_total", ""),
            s.metric("kvindex_replays_total", "outcome=\"filled\""),
            s.metric("kvindex_replays_total", "") - s.metric("kvindex_replays_total", "outcome=\"filled\""),
            s.metric("kvindex_clears_total", ""),
            s.metric("kvindex_scores_withheld_total", ""),
        ]
    };
    let c0 = counters(&server);
    let view0 = sources(&server);
    let (recv0, event0) = (
        server_buckets(&server, "kvindex_receive_to_visible_seconds"),
        server_buckets(&server, "kvindex_event_to_visible_seconds"),
    );
    let published0: u64 = pods.iter().map(|p| p.next.load(Ordering::Relaxed)).sum();
    let drops0: u64 = pods.iter().map(|p| p.publisher.dropped.load(Ordering::Relaxed)).sum();

    let mut samples = Samples::default();
    set_rate(&rate, multiple * capacity);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.take(&server, &pods, &mut client, &mut probe.by_ref().take(4)).await;
    }
    let overload_s = start.elapsed().as_secs_f64();
    let published_overload = pods.iter().map(|p| p.next.load(Ordering::Relaxed)).sum::<u64>() - published0;
    // The load stops: back to a quarter of the capacity.
    let targets: Vec<u64> = pods.iter().map(|p| p.next.load(Ordering::Relaxed)).collect();
    set_rate(&rate, 0.25 * capacity);
    let stopped = Instant::now();
    let recover_s: f64 = std::env::var("E2E_OVERLOAD_RECOVER_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(300.0);
    let (mut exact_after, mut caught_after) = (None, None);
    let mut last_probe = Instant::now();
    while stopped.elapsed().as_secs_f64() < recover_s && (exact_after.is_none() || caught_after.is_none()) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let t = stopped.elapsed().as_secs_f64();
        let view = if last_probe.elapsed() >= Duration::from_secs(1) {
            last_probe = Instant::now();
            samples.take(&server, &pods, &mut client, &mut probe.by_ref().take(4)).await
        } else {
            sources(&server)
        };
        if exact_after.is_none() && all_exact(&view) {
            exact_after = Some(t);
        }
        if caught_after.is_none() && caught_up(&view, &pods, &targets) {
            caught_after = Some(t);
        }
    }
    let c1 = counters(&server);
    let view1 = sources(&server);
    let recv = bucket_delta(&recv0, &server_buckets(&server, "kvindex_receive_to_visible_seconds"));
    let event = bucket_delta(&event0, &server_buckets(&server, "kvindex_event_to_visible_seconds"));
    let degraded_end = view1.values().filter(|s| s.state == "DEGRADED").count();
    let pods_cleared = view1.iter().filter(|(pod, s)| s.clears > view0.get(*pod).map_or(0, |s0| s0.clears)).count();
    let replays_started = view1
        .iter()
        .map(|(pod, s)| s.replays_started.saturating_sub(view0.get(pod).map_or(0, |s0| s0.replays_started)))
        .sum();

    // Silence, then every pod checked against its publisher at what it applied.
    set_rate(&rate, 0.0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let last: Vec<u64> = pods.iter().map(|p| p.next.load(Ordering::Relaxed)).collect();
    // What was published after the stop is behind what was published before it: let it all in,
    // so that the index stands still while it is checked.
    let settled = poll_until(recover_s as u64, || caught_up(&sources(&server), &pods, &last)).await;
    let view = sources(&server);
    let (mut over_final, mut under) = (0, 0);
    for pod in &pods {
        let Some(s) = view.get(&pod_id(pod.id)) else { continue };
        let Some(applied) = s.last_seq else { continue };
        over_final += over_reports(&mut client, pod, applied, KEEP).await;
        // The conversations it holds, whole, at what it applied: under-reports (a DEGRADED pod
        // lost some; an EXACT one must hold them all).
        if s.state == "EXACT" && settled {
            let newest = (applied + 1) / CYCLE;
            for conv in newest.saturating_sub(KEEP)..=newest {
                // Every store of it applied, its eviction not.
                if conv * CYCLE + CHUNKS as u64 <= applied + 1 && evicted_at(conv) > applied {
                    under += u64::from((CHUNKS * STORE_BLOCKS) as u32 - matched(&mut client, pod, conv).await);
                }
            }
        }
    }
    pacer.abort();
    let drops1: u64 = pods.iter().map(|p| p.publisher.dropped.load(Ordering::Relaxed)).sum();
    samples.staleness.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let total = c1[0] - c0[0];
    OverloadResult {
        multiple,
        offered: multiple * capacity,
        published: published_overload as f64 / overload_s * OPS_PER_CYCLE / CYCLE as f64,
        applied: total / (overload_s + stopped.elapsed().as_secs_f64()),
        publisher_drops: drops1 - drops0,
        queue_drops: c1[1] - c0[1],
        gaps: c1[2] - c0[2],
        replays_started,
        filled: c1[3] - c0[3],
        failed: c1[4] - c0[4],
        clears: c1[5] - c0[5],
        pods_cleared,
        degraded_ever: samples.degraded_ever.len(),
        degraded_end,
        over: samples.over + over_final,
        probes: samples.probes + PUBLISHERS as u64,
        stale_peak: samples.stale_peak,
        lag_over: samples.lag_over,
        withheld: c1[6] - c0[6],
        receive_ms: [0.5, 0.99].map(|q| bucket_quantile(&recv, q)),
        event_ms: [0.5, 0.99].map(|q| bucket_quantile(&event, q)),
        stale_s: [0.5, 0.99, 1.0].map(|q| quantile(&samples.staleness, q)),
        server_lag_max_s: samples.server_lag.iter().copied().fold(0.0, f64::max),
        exact_after_s: exact_after,
        caught_up_after_s: caught_after,
        window_s: recover_s,
        final_under: settled.then_some(under),
    }
}

/// A time after the stop, or that it was not reached within the window.
fn secs(s: Option<f64>, window: f64) -> String {
    s.map_or_else(|| format!("> {window:.0} s"), |s| format!("{s:.1} s"))
}

/// Runs the phase for each multiple and prints its table.
pub fn run(rt: &tokio::runtime::Runtime) {
    let multiples: Vec<f64> =
        std::env::var("E2E_OVERLOAD").unwrap_or_default().split(',').filter_map(|s| s.trim().parse().ok()).collect();
    if multiples.is_empty() {
        return;
    }
    let secs_each: f64 = std::env::var("E2E_OVERLOAD_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(60.0);
    let hwm: usize = std::env::var("E2E_OVERLOAD_HWM").ok().and_then(|v| v.parse().ok()).unwrap_or(HWM);
    let capacity = match std::env::var("E2E_OVERLOAD_CAPACITY").ok().and_then(|v| v.parse().ok()) {
        Some(c) => c,
        None => {
            let probe = std::env::var("E2E_OVERLOAD_PROBE").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000_000.0);
            let c = rt.block_on(calibrate(probe));
            println!("\nOverload: capacity measured at {c:.0} applied block ops/s (offered {probe:.0})");
            c
        }
    };
    println!();
    println!(
        "Overload ({PUBLISHERS} dialled pods, PUB HWM {hwm}, replay buffer {BUFFER_STEPS} batches, capacity {capacity:.0} block ops/s, {secs_each:.0} s per multiple, then 0.25×):"
    );
    println!("| offered | published block ops/s | applied (phase) | receive→visible p50 / p99 ≤ | event→visible p50 / p99 ≤ | publish→visible staleness p50 / p99 / max | server lag max | publisher drops | queue drops | gaps | replays started / filled / failed | clears (pods) | DEGRADED ever / at end | over-reports (probes) | under at end | all EXACT after stop | caught up after stop | stale sources peak | scores withheld | engine-evicted blocks credited (probes) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in multiples {
        let r = rt.block_on(phase(m, capacity, secs_each, hwm));
        println!(
            "| {:.2}× ({:.0}) | {:.0} | {:.0} | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.2} / {:.2} / {:.2} s | {:.2} s | {} | {} | {} | {} / {} / {} | {} ({}) | {} / {} | {} ({}) | {} | {} | {} | {} | {} | {} ({}) |",
            r.multiple,
            r.offered,
            r.published,
            r.applied,
            r.receive_ms[0],
            r.receive_ms[1],
            r.event_ms[0],
            r.event_ms[1],
            r.stale_s[0],
            r.stale_s[1],
            r.stale_s[2],
            r.server_lag_max_s,
            r.publisher_drops,
            r.queue_drops,
            r.gaps,
            r.replays_started,
            r.filled,
            r.failed,
            r.clears,
            r.pods_cleared,
            r.degraded_ever,
            r.degraded_end,
            r.over,
            r.probes,
            r.final_under.map_or("not checked".to_string(), |u| u.to_string()),
            secs(r.exact_after_s, r.window_s),
            secs(r.caught_up_after_s, r.window_s),
            r.stale_peak,
            r.withheld,
            r.lag_over,
            r.probes - PUBLISHERS as u64,
        );
    }
}
