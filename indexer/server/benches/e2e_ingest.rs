//! End-to-end benchmark of `kvindex serve` (harness = false):
//!
//! 1. Ingest over TCP loopback from 64 concurrent publishers (our own load generator: the
//!    `zeromq` crate's PUB + rmp-serde map-form batches shaped like vLLM 0.33's), paced at a
//!    ladder of target rates. Reports applied block ops/s, loss (sent − applied, gaps, queue
//!    drops) and event-to-visible p50/p99 (the server's histogram of batch `ts` → applied, same
//!    clock).
//! 2. ScoreTokens over gRPC for an 8k-token prompt (512 blocks, held by 4 pods) at a target
//!    request rate (open loop) while the 64 publishers ingest at a target block-op rate, beside
//!    a trivial gRPC echo (the floor), from three clients, in rounds (`e2e_ingest/score.rs`).
//!    Reports client-side p50/p99 and the server's own. Runs last.
//!
//! 3. (`E2E_RSS_ENTRIES`, default 10M) The index filled over the wire: server RSS per entry.
//! 4. (`E2E_RESTART_ENTRIES`, default off) A warm restart: 64 pods that bind their PUB and
//!    replay ROUTER as vLLM engines do fill the index to that many entries; the server stops
//!    gracefully (final snapshot), each pod publishes `E2E_RESTART_REPLAY` (default 4) more
//!    batches while it is down, and the server starts again: the time from spawn to `/readyz`
//!    (snapshot load, the short replay from each cursor, and the import of every pod).
//!
//! 5. (`E2E_STEADY_ENTRIES`, default off) Steady churn into an index that full, from 64 dialled
//!    pods (filled at 500k stores/s, then `E2E_STEADY_RATE` offered block ops/s, stores and
//!    evictions, default 250k: below what two cores apply, so nothing queues) for `E2E_STEADY_SECS` (default
//!    150), snapshots every `E2E_STEADY_SNAPSHOTS` seconds or none: applied block ops/s, the
//!    server's CPU per million ops (the snapshot overhead on ingest) and its RSS at the start
//!    and peak of the window. `E2E_STEADY_ROUNDS=n` (with `E2E_STEADY_SNAPSHOTS`) runs n rounds
//!    each of snapshots off and on, interleaved, and prints medians and ratios. The pods of phases 4 and 5
//!    hash per pod, like engines with different seeds, unless `E2E_ONE_HASH` is set.
//!
//! 6. (`E2E_OVERLOAD` = comma list of multiples of the capacity, e.g. `1.5,2,4`; default off)
//!    Overload: 64 dialled pods with vLLM's PUB high-water mark and replay buffer offered each
//!    multiple of what the server applies for `E2E_OVERLOAD_SECS` (default 60), then a quarter
//!    of it: lag, gaps, replays, clears, over-reports and the time back to all EXACT (see
//!    `e2e_ingest/overload.rs`).
//!
//! 7. (`E2E_BOOTSTRAP_ENTRIES`, default off) A new replica beside a sibling filled that full,
//!    cold, with `--bootstrap-from` the sibling, and the sibling restarted from its own snapshot:
//!    spawn → `/readyz`, entries, and the hit over the first `E2E_BOOTSTRAP_PROBE_SECS` (default
//!    60) of traffic against the sibling's (see `e2e_ingest/bootstrap.rs`).
//!
//! 8. (`E2E_RESERVE_RATE` picks/s, default off) The shared in-flight load's cost: ScoreTokens
//!    p50/p99 and the server's CPU with reservations flowing at that rate (RecordRoute + two
//!    batched releases per pick) and without, alternating (see `e2e_ingest/reserve.rs`).
//!
//! `E2E_KVINDEX` = another `kvindex` binary to run instead of this build's (a before/after
//! comparison with the same bench).
//!
//! Run: `cargo bench -p kvindex-server --bench e2e_ingest` (optional env: `E2E_RATES` = comma list of
//! ingest targets in block ops/s, `E2E_SECS`, `E2E_SCORE_RPS` = comma list, `E2E_SCORE_INGEST`,
//! `E2E_SCORE_ROUNDS` (default 3), `E2E_SCORE_TOKENS` (the prompt's length, default 8192),
//! `E2E_SERVE_ARGS` = extra `serve` flags, e.g. `--snapshot-dir /tmp/s --snapshot-interval 1`,
//! `E2E_LOG` = the server's `RUST_LOG`, default `warn`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use kvindex_proto::kvindex::v1::indexer_client::IndexerClient;
use kvindex_proto::kvindex::v1::ScoreTokensRequest;
use kvindex_testkit::process::ChildProcess;
use kvindex_testkit::serve::Serve;

#[path = "e2e_ingest/bootstrap.rs"]
mod bootstrap;
#[path = "support/echo.rs"]
mod echo;
#[path = "e2e_ingest/hwm_pub.rs"]
mod hwm_pub;
#[path = "e2e_ingest/overload.rs"]
mod overload;
#[path = "e2e_ingest/reserve.rs"]
mod reserve;
#[path = "e2e_ingest/score.rs"]
mod score;

const PUBLISHERS: usize = 64;
const BLOCK: usize = 16;
/// Blocks per BlockStored batch; a conversation is CHUNKS stores, then one batch removing it.
const STORE_BLOCKS: usize = 16;
const CHUNKS: usize = 8;
const MODEL: &str = "bench-model";

#[derive(Serialize)]
struct Stored<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: &'a [u32],
    block_size: u32,
    lora_id: Option<i64>,
    medium: &'static str,
    lora_name: Option<&'static str>,
}

#[derive(Serialize)]
struct Removed {
    #[serde(rename = "type")]
    ty: &'static str,
    block_hashes: [u64; 1],
    medium: &'static str,
}

fn now_ts() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

struct Server {
    process: ChildProcess,
    grpc: String,
    http: String,
    zmq: String,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let binary = std::env::var("E2E_KVINDEX").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kvindex").to_string());
        let serving = Serve::new(binary)
            .loopback()
            .args(["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"])
            // All publishers dial from 127.0.0.1: one source, past the default cap of 32
            // connections per source (refused before the greeting: the `zeromq` crate then says
            // `connect: Other("Failed Greeting exchange")`).
            .args(["--zmq-max-connections-per-source", &(2 * PUBLISHERS).to_string()])
            // Every publisher's pods are one address's streams, past the default cap of 64 (split
            // over the apply workers): refused streams would not be ingested.
            .args(["--max-sources-per-address", &(16 * PUBLISHERS).to_string()])
            .args(extra)
            // Extra `serve` flags for a comparison run, e.g. E2E_SERVE_ARGS="--snapshot-dir /tmp/s".
            .args(std::env::var("E2E_SERVE_ARGS").unwrap_or_default().split_whitespace())
            .env("RUST_LOG", std::env::var("E2E_LOG").unwrap_or_else(|_| "warn".into()))
            .logging()
            .start()
            .expect("kvindex serve");
        let zmq = serving.zmq();
        Server { grpc: serving.grpc, http: serving.http, zmq, process: serving.process }
    }

    fn get(&self, path: &str) -> String {
        let mut s = TcpStream::connect(&self.http).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        r.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
    }

    fn metric(&self, name: &str, labels: &str) -> f64 {
        self.get("/metrics")
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
            + 0.0 // an empty f64 sum is -0.0
    }
}

/// One publisher: conversations of CHUNKS chained stores, then their removal; paced so that
/// all publishers together aim at `rate` block ops/s. Returns block ops sent.
async fn publish(id: usize, endpoint: String, rate: f64, until: Instant, sent: Arc<AtomicU64>, seqs: Arc<AtomicU64>) {
    let pace = Pace { rate, until, remove: true, stop: Arc::new(AtomicBool::new(false)) };
    publish_with(id, endpoint, pace, sent, seqs).await
}

/// How the publishers run: together at `rate` block ops/s until `until`, or until `stop`;
/// `remove = false`: conversations are never evicted (fills the index).
struct Pace {
    rate: f64,
    until: Instant,
    remove: bool,
    stop: Arc<AtomicBool>,
}

/// One publisher as [`publish`]'s, at `pace`.
async fn publish_with(id: usize, endpoint: String, pace: Pace, sent: Arc<AtomicU64>, seqs: Arc<AtomicU64>) {
    let Pace { rate, until, remove, stop } = pace;
    let mut sock = PubSocket::new();
    sock.connect(&endpoint).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(1000)).await; // subscription handshake
    let topic = Bytes::from(format!("kv@10.9.{}.{}:8000@{MODEL}", id / 256, id % 256));
    let ops_per_conv = (CHUNKS * STORE_BLOCKS * 2) as f64;
    let batches_per_conv = (CHUNKS + 1) as f64;
    let per_pub_batches = rate / PUBLISHERS as f64 / ops_per_conv * batches_per_conv;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_pub_batches));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut seq: u64 = 0;
    let mut conv: u64 = 0;
    let mut tokens = vec![0u32; STORE_BLOCKS * BLOCK];
    'outer: loop {
        conv += 1;
        let mut hashes: Vec<u64> = Vec::with_capacity(CHUNKS * STORE_BLOCKS);
        for chunk in 0..CHUNKS + 1 {
            tick.tick().await;
            if Instant::now() >= until || stop.load(Ordering::Relaxed) {
                break 'outer;
            }
            if chunk == CHUNKS && !remove {
                continue;
            }
            let payload = if chunk < CHUNKS {
                let (payload, stored) = store_payload(id, conv, chunk, hashes.last().copied(), false, &mut tokens);
                hashes.extend(stored);
                payload
            } else {
                eviction_payload(hashes.iter().copied())
            };
            let msg: ZmqMessage =
                vec![topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload].try_into().unwrap();
            sock.send(msg).await.expect("send");
            seq += 1;
            sent.fetch_add(STORE_BLOCKS as u64 * if chunk < CHUNKS { 1 } else { CHUNKS as u64 }, Ordering::Relaxed);
        }
    }
    seqs.fetch_add(seq, Ordering::Relaxed);
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

struct IngestResult {
    target: f64,
    applied_per_s: f64,
    /// Seconds from the first send until everything was applied (the phase, plus the drain of
    /// what the server was behind by): applied / this is what the server kept up with.
    drained_s: f64,
    sent: u64,
    applied: u64,
    gaps: f64,
    dropped: f64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn ingest_phase(rate: f64, secs: f64) -> IngestResult {
    let server = Server::start(&["--queue-capacity", "65536"]);
    let sent = Arc::new(AtomicU64::new(0));
    let seqs = Arc::new(AtomicU64::new(0));
    let start = Instant::now() + Duration::from_millis(1200);
    let until = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for id in 0..PUBLISHERS {
        tasks.push(tokio::spawn(publish(id, server.zmq.clone(), rate, until, sent.clone(), seqs.clone())));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let sent = sent.load(Ordering::Relaxed);
    // Drain: wait until the server has applied everything it will apply.
    let mut applied = 0.0;
    let mut last_change = Instant::now();
    while last_change.elapsed() < Duration::from_millis(500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let a = server.metric("kvindex_blocks_total", "");
        if a != applied {
            applied = a;
            last_change = Instant::now();
        }
        if applied as u64 >= sent {
            break;
        }
    }
    let wall = Instant::now().duration_since(start).as_secs_f64().max(secs);
    IngestResult {
        target: rate,
        applied_per_s: applied / secs.min(wall),
        drained_s: wall - last_change.elapsed().as_secs_f64(),
        sent,
        applied: applied as u64,
        gaps: server.metric("kvindex_gaps_total", ""),
        dropped: server.metric("kvindex_queue_dropped_total", ""),
        p50_ms: server_quantile(&server, "kvindex_event_to_visible_seconds", 0.5),
        p99_ms: server_quantile(&server, "kvindex_event_to_visible_seconds", 0.99),
    }
}

/// A quantile of a server histogram (upper bound of the bucket holding it), in ms.
fn server_quantile(server: &Server, name: &str, q: f64) -> f64 {
    bucket_quantile(&server_buckets(server, name), q)
}

/// A server histogram's cumulative buckets: (upper bound, count), in bound order.
fn server_buckets(server: &Server, name: &str) -> Vec<(f64, f64)> {
    let body = server.get("/metrics");
    let prefix = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = body
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    buckets
}

/// What a histogram counted between two reads of its buckets.
fn bucket_delta(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after.iter().map(|&(le, n)| (le, n - before.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1))).collect()
}

/// The upper bound (ms) of the bucket holding quantile `q` of cumulative `buckets`; `q = 1`:
/// the bucket of the largest value.
fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map_or(0.0, |b| b.1);
    buckets.iter().find(|b| b.1 >= q * total && b.1 > 0.0).map_or(f64::NAN, |b| b.0 * 1e3)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Fills the index to `entries` resident (block, pod) entries over the wire; returns
/// (entries, RSS before, RSS after, the core's approx_bytes, seconds).
async fn rss_phase(entries: u64) -> (u64, u64, u64, f64, f64) {
    let server = Server::start(&["--max-entries", "100000000"]);
    let pid = server.process.pid();
    let before = rss_kib(pid);
    let sent = Arc::new(AtomicU64::new(0));
    let seqs = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let until = Instant::now() + Duration::from_secs(600);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for id in 0..PUBLISHERS {
        let pace = Pace { rate: 1_000_000.0, until, remove: false, stop: stop.clone() };
        tasks.push(tokio::spawn(publish_with(id, server.zmq.clone(), pace, sent.clone(), seqs.clone())));
    }
    let mut n = 0.0;
    // Bounded: on a starved box gaps clear pods (no replay here) and the fill may never get there.
    while (n as u64) < entries && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        n = server.metric("kvindex_index_entries", "");
    }
    // Read at the fill, before the publishers stop: their disconnects clear their pods.
    let secs = start.elapsed().as_secs_f64();
    // Measured now (the `kvindex_index_bytes` gauge is refreshed every 5 s).
    let debug: serde_json::Value = serde_json::from_str(&server.get("/debug/sources")).unwrap_or_default();
    let (rss, bytes) = (rss_kib(pid), debug["index"]["approx_bytes"].as_f64().unwrap_or(f64::NAN));
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    (n as u64, before, rss, bytes, secs)
}

/// What the pods of the warm-restart phase do: publish at their pace while `live`, then up to
/// `extra` batches each (those the restarted server must replay).
#[derive(Default)]
struct RestartControl {
    live: AtomicBool,
    /// Each new conversation evicts the pod's oldest one.
    churn: AtomicBool,
    extra: AtomicU64,
    /// Batches published by all pods.
    published: AtomicU64,
    /// Each pod's pace: one batch every this many µs.
    batch_every_us: AtomicU64,
    /// Engine hashes as one hash configuration fleet-wide (else per pod).
    one_hash: AtomicBool,
}

impl RestartControl {
    /// Paces the pods at `rate` block ops/s in all, counting a store batch's blocks (an
    /// eviction batch carries a whole conversation's, so churn offers more than `rate`).
    fn set_rate(&self, rate: f64) {
        let every = PUBLISHERS as f64 * STORE_BLOCKS as f64 / rate;
        self.batch_every_us.store((every * 1e6) as u64, Ordering::Relaxed);
    }
}

/// A pod's published batches still in its replay buffer, by seq.
type ReplayBuffer = Arc<std::sync::Mutex<std::collections::VecDeque<(u64, Bytes)>>>;

/// Batches each restart pod keeps for replay, as vLLM's `buffer_steps` does.
const RESTART_BUFFER: usize = 4096;

/// One pod of the warm-restart phase: a PUB and a replay ROUTER bound on loopback, as a vLLM
/// engine binds them. Returns their endpoints; the pod runs until the runtime ends.
async fn restart_pod(id: usize, ctl: Arc<RestartControl>) -> (String, String) {
    let mut sock = PubSocket::new();
    let pub_ep = sock.bind("tcp://127.0.0.1:0").await.expect("bind PUB").to_string();
    let mut router = RouterSocket::new();
    let replay_ep = router.bind("tcp://127.0.0.1:0").await.expect("bind ROUTER").to_string();
    let buffer: ReplayBuffer = Arc::default();
    let kept = buffer.clone();
    tokio::spawn(async move {
        while let Ok(request) = router.recv().await {
            let frames = request.into_vec();
            let (Some(identity), Some(start)) = (frames.first(), frames.get(2)) else { continue };
            let Ok(start) = <[u8; 8]>::try_from(&start[..]).map(u64::from_be_bytes) else { continue };
            let replies: Vec<(u64, Bytes)> =
                kept.lock().unwrap().iter().filter(|(s, _)| *s >= start).cloned().collect();
            for (seq, payload) in replies {
                let frames = vec![identity.clone(), Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
                let _ = router.send(ZmqMessage::try_from(frames).unwrap()).await;
            }
            let end = vec![identity.clone(), Bytes::new(), Bytes::from_static(&[0xff; 8]), Bytes::new()];
            let _ = router.send(ZmqMessage::try_from(end).unwrap()).await;
        }
    });
    let topic = Bytes::from(format!("kv@{}@{MODEL}", restart_pod_id(id)));
    tokio::spawn(async move {
        let one_hash = ctl.one_hash.load(Ordering::Relaxed);
        let mut every = ctl.batch_every_us.load(Ordering::Relaxed);
        let mut tick = tokio::time::interval(Duration::from_micros(every));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut seq, mut extra, mut stores) = (0u64, 0u64, 0u64);
        let mut tokens = vec![0u32; STORE_BLOCKS * BLOCK];
        let (mut conversation, mut resident, mut evict) =
            (Vec::new(), std::collections::VecDeque::new(), None::<Vec<u64>>);
        loop {
            tick.tick().await;
            if every != ctl.batch_every_us.load(Ordering::Relaxed) {
                every = ctl.batch_every_us.load(Ordering::Relaxed);
                tick = tokio::time::interval(Duration::from_micros(every));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            }
            if !ctl.live.load(Ordering::Relaxed) {
                if extra >= ctl.extra.load(Ordering::Relaxed) {
                    continue;
                }
                extra += 1;
            }
            let payload = if let Some(evicted) = evict.take() {
                // Tail blocks first, as vLLM frees a request's blocks.
                eviction_payload(evicted.iter().rev().copied())
            } else {
                // Never-evicted conversations of CHUNKS chained stores, as the fill phase's.
                let (conv, chunk) = (stores / CHUNKS as u64, stores as usize % CHUNKS);
                stores += 1;
                let (payload, stored) =
                    store_payload(id, conv, chunk, conversation.last().copied(), one_hash, &mut tokens);
                conversation.extend(stored);
                payload
            };
            if conversation.len() == CHUNKS * STORE_BLOCKS {
                resident.push_back(std::mem::take(&mut conversation));
                // Churn: each new conversation evicts the oldest, so the index stays as full.
                if ctl.churn.load(Ordering::Relaxed) {
                    evict = resident.pop_front();
                }
            }
            {
                let mut kept = buffer.lock().unwrap();
                if kept.len() == RESTART_BUFFER {
                    kept.pop_front();
                }
                kept.push_back((seq, payload.clone()));
            }
            let frames = vec![topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
            let _ = sock.send(ZmqMessage::try_from(frames).unwrap()).await;
            seq += 1;
            ctl.published.fetch_add(1, Ordering::Relaxed);
        }
    });
    (pub_ep, replay_ep)
}

/// Publisher `id`'s store `chunk` of conversation `conv` (`parent`: the last block of the
/// conversation's previous store): fills `tokens`, returns the payload and the block hashes.
/// `one_hash`: hashes as one hash configuration fleet-wide, else per publisher.
fn store_payload(
    id: usize,
    conv: u64,
    chunk: usize,
    parent: Option<u64>,
    one_hash: bool,
    tokens: &mut [u32],
) -> (Bytes, Vec<u64>) {
    for (j, t) in tokens.iter_mut().enumerate() {
        *t = ((id as u64 * 1_000_003 + conv * 7919 + (chunk * STORE_BLOCKS * BLOCK + j) as u64) % 151_000) as u32;
    }
    let hashes: Vec<u64> = if one_hash {
        // A block's hash follows from its parent's and its tokens, so publishers that cache the
        // same tokens name them alike.
        let mut h = parent.unwrap_or(0x9e37_79b9_7f4a_7c15);
        tokens
            .chunks(BLOCK)
            .map(|block| {
                for &t in block {
                    h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
                }
                h
            })
            .collect()
    } else {
        // Per publisher: publishers that cache the same tokens name them differently (another
        // hash seed), so most of a pod's blocks are exceptions to the fleet's.
        (0..STORE_BLOCKS)
            .map(|b| ((id as u64) << 48) ^ (conv << 16) ^ (chunk * STORE_BLOCKS + b) as u64 ^ 0x9e37_79b9_7f4a_7c15)
            .collect()
    };
    let ev = Stored {
        ty: "BlockStored",
        block_hashes: hashes.clone(),
        parent_block_hash: parent,
        token_ids: tokens,
        block_size: BLOCK as u32,
        lora_id: None,
        medium: "GPU",
        lora_name: None,
    };
    (Bytes::from(rmp_serde::to_vec_named(&(now_ts(), [ev], 0i64)).unwrap()), hashes)
}

/// One batch removing `hashes`, one `BlockRemoved` event per block.
fn eviction_payload(hashes: impl Iterator<Item = u64>) -> Bytes {
    let evs: Vec<Removed> = hashes.map(|h| Removed { ty: "BlockRemoved", block_hashes: [h], medium: "GPU" }).collect();
    Bytes::from(rmp_serde::to_vec_named(&(now_ts(), evs, 0i64)).unwrap())
}

fn restart_pod_id(id: usize) -> String {
    format!("10.8.{}.{}:8000", id / 256, id % 256)
}

struct RestartResult {
    filled: u64,
    fill_s: f64,
    stop_s: f64,
    listening_s: f64,
    ready_s: f64,
    load_s: f64,
    entries_after: u64,
    expected_after: u64,
    imported: f64,
    replayed: f64,
}

/// Waits until `f` holds, polling every 10 ms; false at the deadline.
async fn poll_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// The warm-restart phase (see the module comment).
/// `kvindex serve` (with `serve_extra` flags) over 64 dialled pods ([`restart_pod`]), filled
/// over the wire to `entries`. Returns the server, the pods' control, the serve arguments and
/// the fill's seconds; the pods are still publishing.
async fn fill_dialled(
    entries: u64,
    rate: f64,
    serve_extra: &[String],
) -> (Server, Arc<RestartControl>, Vec<String>, f64) {
    let ctl = Arc::new(RestartControl::default());
    ctl.set_rate(rate);
    ctl.one_hash.store(std::env::var_os("E2E_ONE_HASH").is_some(), Ordering::Relaxed);
    let mut args: Vec<String> = ["--max-entries", "100000000"].map(String::from).to_vec();
    args.extend_from_slice(serve_extra);
    for id in 0..PUBLISHERS {
        let (pub_ep, replay_ep) = restart_pod(id, ctl.clone()).await;
        args.push("--pod".into());
        args.push(format!("{},{MODEL},{pub_ep},{replay_ep}", restart_pod_id(id)));
    }
    let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(poll_until(60, || server.get("/readyz").starts_with("ready")).await, "first start never ready");
    let start = Instant::now();
    ctl.live.store(true, Ordering::Relaxed);
    let mut filled = 0;
    assert!(
        poll_until(600, || {
            filled = server.metric("kvindex_index_entries", "") as u64;
            filled >= entries
        })
        .await,
        "the fill never reached {entries} entries (at {filled})"
    );
    (server, ctl, args, start.elapsed().as_secs_f64())
}

/// The warm-restart phase (see the module comment).
async fn restart_phase(entries: u64, extra: u64, rate: f64) -> RestartResult {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--snapshot-interval", "3600", "--snapshot-dir", dir.path().to_str().unwrap()].map(String::from);
    let (server, ctl, args, fill_s) = fill_dialled(entries, rate, &flags).await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ctl.live.store(false, Ordering::Relaxed);
    // Everything published is applied: the snapshot's cursors are the pods' last seqs.
    let published = || ctl.published.load(Ordering::Relaxed) as f64;
    assert!(
        poll_until(60, || server.metric("kvindex_events_total", "") >= published()).await,
        "the server never applied every published batch (gaps: {})",
        server.metric("kvindex_gaps_total", "")
    );
    tokio::time::sleep(Duration::from_millis(500)).await; // the entries gauge's tick
    let filled = server.metric("kvindex_index_entries", "") as u64;
    let stopping = Instant::now();
    let mut server = server;
    assert!(Command::new("kill").args(["-TERM", &server.process.pid().to_string()]).status().unwrap().success());
    assert!(server.process.wait().unwrap().success(), "kvindex serve failed its graceful stop");
    let stop_s = stopping.elapsed().as_secs_f64();
    let before = ctl.published.load(Ordering::Relaxed);
    ctl.extra.store(extra, Ordering::Relaxed);
    let target = before + extra * PUBLISHERS as u64;
    assert!(poll_until(60, || ctl.published.load(Ordering::Relaxed) >= target).await);

    let spawned = Instant::now();
    let server = Server::start(&args);
    let listening_s = spawned.elapsed().as_secs_f64();
    assert!(poll_until(120, || server.get("/readyz").starts_with("ready")).await, "the restart never got ready");
    let ready_s = spawned.elapsed().as_secs_f64();
    // The entries gauge is refreshed on the apply workers' 100 ms tick.
    tokio::time::sleep(Duration::from_millis(500)).await;
    RestartResult {
        filled,
        fill_s,
        stop_s,
        listening_s,
        ready_s,
        load_s: server.metric("kvindex_snapshot_load_seconds_sum", ""),
        entries_after: server.metric("kvindex_index_entries", "") as u64,
        expected_after: ctl.published.load(Ordering::Relaxed) * STORE_BLOCKS as u64,
        imported: server.metric("kvindex_snapshot_restored_pods_total", "outcome=\"imported\""),
        replayed: server.metric("kvindex_replays_total", "outcome=\"filled\""),
    }
}

/// CPU seconds process `pid` has used (user + system, every thread), from `/proc/<pid>/stat`.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (in parentheses, may hold spaces); utime and stime are the
    // 12th and 13th of them, in ticks of 1/100 s.
    let f: Vec<f64> =
        stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

struct SteadyResult {
    fill_s: f64,
    ops_per_s: f64,
    cpu_per_mop: f64,
    entries: u64,
    gaps: f64,
    clears: f64,
    snapshots: f64,
    snapshot_s: f64,
    /// Socket receive → applied over the window, ms (bucket upper bounds): p50, p99, p99.9, max.
    visible_ms: [f64; 4],
    /// Server RSS (MiB) when the window starts, and its peak over the window (sampled every
    /// 50 ms): with snapshots on, the peak is the one a snapshot adds to churn's own.
    rss_mib: (f64, f64),
}

/// Steady ingest into a full index: 64 dialled pods fill it to `entries`, then every new
/// conversation evicts the pod's oldest (every pod moves, so each snapshot rewrites every
/// record: the worst case). Applied block ops/s and the server's CPU per million ops over
/// `secs`, with `serve_extra` (snapshot flags, or none).
async fn steady_phase(entries: u64, secs: f64, rate: f64, serve_extra: &[String]) -> SteadyResult {
    let (server, ctl, _, fill_s) = fill_dialled(entries, 500_000.0, serve_extra).await;
    // A store and its share of an eviction: 16 + 128 / 8 block ops per store batch.
    ctl.set_rate(rate / 2.0);
    ctl.churn.store(true, Ordering::Relaxed);
    // A conversation's worth of stores, so that evictions are flowing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = server.process.pid();
    let read = |s: &Server| {
        (
            s.metric("kvindex_blocks_total", ""),
            cpu_s(pid),
            s.metric("kvindex_snapshot_writes_total", "outcome=\"ok\""),
            s.metric("kvindex_snapshot_seconds_sum", ""),
            s.metric("kvindex_gaps_total", ""),
            s.metric("kvindex_clears_total", ""),
        )
    };
    const VISIBLE: &str = "kvindex_receive_to_visible_seconds";
    let visible0 = server_buckets(&server, VISIBLE);
    let (ops0, cpu0, snaps0, snap_s0, gaps0, clears0) = read(&server);
    let t = Instant::now();
    let rss0 = rss_kib(pid);
    let mut rss_peak = rss0;
    while t.elapsed().as_secs_f64() < secs {
        tokio::time::sleep(Duration::from_millis(50)).await;
        rss_peak = rss_peak.max(rss_kib(pid));
    }
    let (ops1, cpu1, snaps1, snap_s1, gaps1, clears1) = read(&server);
    let visible = bucket_delta(&visible0, &server_buckets(&server, VISIBLE));
    let elapsed = t.elapsed().as_secs_f64();
    ctl.live.store(false, Ordering::Relaxed);
    SteadyResult {
        fill_s,
        ops_per_s: (ops1 - ops0) / elapsed,
        cpu_per_mop: (cpu1 - cpu0) / ((ops1 - ops0) / 1e6),
        entries: server.metric("kvindex_index_entries", "") as u64,
        gaps: gaps1 - gaps0,
        clears: clears1 - clears0,
        snapshots: snaps1 - snaps0,
        snapshot_s: snap_s1 - snap_s0,
        visible_ms: [0.5, 0.99, 0.999, 1.0].map(|q| bucket_quantile(&visible, q)),
        rss_mib: (rss0 as f64 / 1024.0, rss_peak as f64 / 1024.0),
    }
}

fn main() {
    if std::env::var_os(score::ECHO_ENV).is_some() {
        return score::serve_echo();
    }
    // `cargo bench` passes `--bench`; nothing to parse.
    let rates: Vec<f64> = std::env::var("E2E_RATES")
        .unwrap_or_else(|_| "250000,500000,1000000,2000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let secs: f64 = std::env::var("E2E_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(4.0);
    let score_rps: Vec<f64> = std::env::var("E2E_SCORE_RPS")
        .unwrap_or_else(|_| "1000,5000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let score_ingest: f64 = std::env::var("E2E_SCORE_INGEST").ok().and_then(|s| s.parse().ok()).unwrap_or(500_000.0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!("e2e_ingest: {PUBLISHERS} publishers, {STORE_BLOCKS}-block stores, conversations of {CHUNKS} stores then removal, {secs}s per phase");
    println!("| target block ops/s | applied block ops/s | sent | applied | loss | gaps | queue drops | event→visible p50 ≤ | p99 ≤ | all applied after | applied / that |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for rate in rates {
        let r = rt.block_on(ingest_phase(rate, secs));
        let loss = r.sent.saturating_sub(r.applied);
        println!(
            "| {:.0} | {:.0} | {} | {} | {} | {} | {} | {:.2} ms | {:.2} ms | {:.2} s | {:.0} |",
            r.target,
            r.applied_per_s,
            r.sent,
            r.applied,
            loss,
            r.gaps,
            r.dropped,
            r.p50_ms,
            r.p99_ms,
            r.drained_s,
            r.applied as f64 / r.drained_s.max(1e-9)
        );
    }
    let rss_entries: u64 = std::env::var("E2E_RSS_ENTRIES").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000_000);
    if rss_entries > 0 {
        let (n, before, after, approx, secs) = rt.block_on(rss_phase(rss_entries));
        println!();
        println!(
            "Index filled over the wire to {n} resident entries in {secs:.1} s: server RSS {:.0} MiB (before {:.0} MiB, delta {:.1} B/entry); core approx_bytes {:.0} MiB ({:.1} B/entry)",
            after as f64 / 1024.0,
            before as f64 / 1024.0,
            (after.saturating_sub(before)) as f64 * 1024.0 / n as f64,
            approx / 1048576.0,
            approx / n as f64
        );
    }
    let restart_entries: u64 = std::env::var("E2E_RESTART_ENTRIES").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if restart_entries > 0 {
        let extra: u64 = std::env::var("E2E_RESTART_REPLAY").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
        let r = rt.block_on(restart_phase(restart_entries, extra, 500_000.0));
        println!();
        println!(
            "Warm restart: {PUBLISHERS} dialled pods filled to {} entries in {:.1} s; graceful stop (final snapshot) {:.2} s; {extra} batches per pod published while down. Restart: listening after {:.2} s, /readyz after {:.2} s (snapshot load {:.2} s); {} entries back ({} blocks published, all distinct), {} pods imported, {} replays filled",
            r.filled, r.fill_s, r.stop_s, r.listening_s, r.ready_s, r.load_s, r.entries_after, r.expected_after, r.imported, r.replayed
        );
    }
    let bootstrap_entries: u64 = std::env::var("E2E_BOOTSTRAP_ENTRIES").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if bootstrap_entries > 0 {
        let probe: f64 = std::env::var("E2E_BOOTSTRAP_PROBE_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(60.0);
        let r = rt.block_on(bootstrap::bootstrap_phase(bootstrap_entries, probe));
        println!();
        println!(
            "New replica beside a sibling of {PUBLISHERS} dialled pods filled to {} entries in {:.1} s (pods publishing on at ~2 batches/s each):",
            r.filled, r.fill_s
        );
        println!(
            "| start | spawn → /readyz | entries when ready | hit in its first {probe:.0} s vs the sibling (prompts) |"
        );
        println!("|---|---:|---:|---:|");
        for (what, s) in [
            ("cold", &r.cold),
            ("--bootstrap-from the sibling", &r.bootstrap),
            ("the sibling from its local snapshot", &r.local),
        ] {
            let hit = s.hit.map_or("—".to_string(), |h| format!("{h:.3} ({})", s.probes));
            println!("| {what} | {:.2} s | {} | {hit} |", s.ready_s, s.entries);
        }
        println!("bootstrap received {:.0} MiB", r.bootstrap_bytes / 1048576.0);
    }
    let steady_entries: u64 = std::env::var("E2E_STEADY_ENTRIES").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if steady_entries > 0 {
        let secs: f64 = std::env::var("E2E_STEADY_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(150.0);
        let rate: f64 = std::env::var("E2E_STEADY_RATE").ok().and_then(|v| v.parse().ok()).unwrap_or(250_000.0);
        // E2E_STEADY_SNAPSHOTS: an interval in seconds (snapshots into a fresh directory), or
        // unset for none. E2E_STEADY_ROUNDS=n with it: n rounds each of snapshots off and on,
        // interleaved (off, on, off, on, ...), same binary, each on a fresh server, then the
        // medians and the ratio of CPU per million ops (the fair comparison on a shared box).
        let every = std::env::var("E2E_STEADY_SNAPSHOTS").ok();
        let rounds: usize = std::env::var("E2E_STEADY_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        let modes: Vec<Option<&str>> = match (&every, rounds) {
            (Some(every), n) if n > 0 => (0..n).flat_map(|_| [None, Some(every.as_str())]).collect(),
            (every, _) => vec![every.as_deref()],
        };
        let mut results: Vec<(bool, SteadyResult)> = Vec::new();
        for mode in modes {
            let dir = tempfile::tempdir().unwrap();
            let flags: Vec<String> = match mode {
                Some(every) => ["--snapshot-interval", every, "--snapshot-dir", dir.path().to_str().unwrap()]
                    .map(String::from)
                    .to_vec(),
                None => Vec::new(),
            };
            let r = rt.block_on(steady_phase(steady_entries, secs, rate, &flags));
            println!();
            println!(
                "Steady churn at {} entries ({PUBLISHERS} dialled pods, offered {rate:.0} block ops/s, filled in {:.1} s), snapshots {}: {:.0} applied block ops/s over {secs:.0} s, server {:.2} CPU s per million ops; {} snapshots in the window ({:.2} s in them), {} gaps, {} pod clears; receive→visible p50 ≤ {:.2} ms, p99 ≤ {:.2} ms, p99.9 ≤ {:.2} ms, max ≤ {:.2} ms; RSS {:.0} MiB at the start, peak {:.0} MiB (+{:.0})",
                r.entries,
                r.fill_s,
                flags.get(1).map_or("off".to_string(), |s| format!("every {s} s")),
                r.ops_per_s,
                r.cpu_per_mop,
                r.snapshots,
                r.snapshot_s,
                r.gaps,
                r.clears,
                r.visible_ms[0],
                r.visible_ms[1],
                r.visible_ms[2],
                r.visible_ms[3],
                r.rss_mib.0,
                r.rss_mib.1,
                r.rss_mib.1 - r.rss_mib.0
            );
            results.push((mode.is_some(), r));
        }
        if results.iter().any(|r| r.0) && results.iter().any(|r| !r.0) {
            let median = |on: bool, f: &dyn Fn(&SteadyResult) -> f64| {
                let mut v: Vec<f64> = results.iter().filter(|r| r.0 == on).map(|r| f(&r.1)).collect();
                v.sort_by(f64::total_cmp);
                let n = v.len();
                if !n.is_multiple_of(2) {
                    v[n / 2]
                } else {
                    (v[n / 2 - 1] + v[n / 2]) / 2.0
                }
            };
            let cpu = |r: &SteadyResult| r.cpu_per_mop;
            let ops = |r: &SteadyResult| r.ops_per_s;
            let rss = |r: &SteadyResult| r.rss_mib.1 - r.rss_mib.0;
            println!();
            println!("| steady churn, medians of {} rounds each | snapshots off | on | on / off |", results.len() / 2);
            println!("|---|---:|---:|---:|");
            println!(
                "| server CPU s per million ops | {:.2} | {:.2} | {:.3} |",
                median(false, &cpu),
                median(true, &cpu),
                median(true, &cpu) / median(false, &cpu)
            );
            println!(
                "| applied block ops/s | {:.0} | {:.0} | {:.3} |",
                median(false, &ops),
                median(true, &ops),
                median(true, &ops) / median(false, &ops)
            );
            println!(
                "| RSS peak over the window − at its start, MiB | {:.0} | {:.0} | |",
                median(false, &rss),
                median(true, &rss)
            );
        }
    }
    overload::run(&rt);
    let reserve_rate: f64 = std::env::var("E2E_RESERVE_RATE").ok().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    if reserve_rate > 0.0 {
        let score: f64 = std::env::var("E2E_RESERVE_SCORE_RPS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000.0);
        let secs: f64 = std::env::var("E2E_RESERVE_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(10.0);
        reserve::run(reserve_rate, score, secs);
    }
    score::run(&score_rps, score_ingest, secs);
}
