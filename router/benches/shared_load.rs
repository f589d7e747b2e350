//! What the shared in-flight load costs the indexer: ScoreTokens latency while picks flow at
//! `PICKS_PER_S` (default 5000), and the indexer's CPU per pick, for four ways of recording them,
//! one after the other against the same `kvindex serve` (a release build, a process of its own,
//! its CPU read from /proc) with `PODS` `kvindex-sim` pods feeding it:
//!
//! - `score`: no picks recorded; the floor.
//! - `credit`: one RecordRoute (speculative credit) per pick: the router before reservations.
//! - `folded`: what the router sends now: the reservation in that same RecordRoute, and its two
//!   releases (prefill at `PREFILL_MS`, end at `END_MS`) in ReleaseRoute calls batched per
//!   indexer (what queued while the previous call was out, at most 1024).
//! - `separate`: the alternative: a second RecordRoute (reservation only) per pick, and one
//!   ReleaseRoute per release.
//! - `reserve`: the reservation alone (a RecordRoute without token ids, batched releases): what
//!   one reservation and its two releases cost the indexer.
//!
//! Each pick's prompt is `PROMPT_BLOCKS` blocks of its own (credited anew); ScoreTokens is asked
//! `SCORES_PER_S` times a second with a prompt of that size, one at a time, timed at the client.
//! The picks are sent as the router sends them: in the background, at most 1024 in flight.
//!
//! ```sh
//! source scripts/env.sh
//! cargo build --release -p kvindex-server --bin kvindex -p kvindex-loadtest --bin kvindex-sim
//! cargo bench -p kvindex-router --bench shared_load     # SECONDS=20 PICKS_PER_S=5000 ...
//! ```

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex_loadtest::kvindex_service::{http, sim_next_seq, KvindexService};
use kvindex_loadtest::process::{workspace_binary, SimFleet};
use kvindex_proto::kvindex::v1 as pb;
use pb::indexer_client::IndexerClient;
use serde_json::json;
use support::{env_usize, pct};
use tokio::sync::{mpsc, Semaphore};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

const MODEL: &str = "sim/model";
const BLOCK: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Score,
    Credit,
    Folded,
    Separate,
    Reserve,
}

struct Settings {
    seconds: u64,
    picks_per_s: usize,
    scores_per_s: usize,
    prompt_blocks: usize,
    prefill: Duration,
    end: Duration,
    pods: Vec<String>,
    /// The indexer's gRPC address.
    addr: String,
}

/// Clock ticks per second of /proc's CPU times (Linux reports USER_HZ, 100, whatever the
/// kernel's own tick).
const USER_HZ: f64 = 100.0;

/// Utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / USER_HZ
}

/// The prompt of pick `n`: blocks of its own.
fn prompt(n: u64, blocks: usize) -> Vec<u32> {
    (0..(blocks * BLOCK) as u32).map(|t| (n as u32).wrapping_mul(7919).wrapping_add(t) % 100_000 + 1).collect()
}

#[derive(Default)]
struct Counts {
    picks: AtomicU64,
    record_calls: AtomicU64,
    release_calls: AtomicU64,
    releases: AtomicU64,
    errors: AtomicU64,
    /// Failed calls by gRPC code.
    codes: parking_lot::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Counts {
    fn failed(&self, status: tonic::Status) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.codes.lock().entry(format!("{:?}", status.code())).or_default() += 1;
    }
}

/// The releases of one mode: batched (one task, what queued while the last call was out) or one
/// call each.
fn releaser(
    client: IndexerClient<Channel>,
    auth: AsciiMetadataValue,
    batched: bool,
    counts: Arc<Counts>,
) -> mpsc::UnboundedSender<pb::Release> {
    let (tx, mut rx) = mpsc::unbounded_channel::<pb::Release>();
    tokio::spawn(async move {
        let calls = Arc::new(Semaphore::new(1024));
        let mut batch = Vec::new();
        let max = if batched { 1024 } else { 1 };
        while rx.recv_many(&mut batch, max).await > 0 {
            let releases = std::mem::take(&mut batch);
            counts.releases.fetch_add(releases.len() as u64, Ordering::Relaxed);
            counts.release_calls.fetch_add(1, Ordering::Relaxed);
            let mut call = tonic::Request::new(pb::ReleaseRouteRequest { releases });
            call.metadata_mut().insert("authorization", auth.clone());
            let (mut client, counts) = (client.clone(), counts.clone());
            if batched {
                if let Err(status) = client.release_route(call).await {
                    counts.failed(status);
                }
            } else {
                let permit = calls.clone().acquire_owned().await.unwrap();
                tokio::spawn(async move {
                    if let Err(status) = client.release_route(call).await {
                        counts.failed(status);
                    }
                    drop(permit);
                });
            }
        }
    });
    tx
}

/// Sends picks at the configured rate for the configured time; returns the ScoreTokens
/// latencies (ms) measured meanwhile.
async fn run(
    mode: Mode,
    s: &Settings,
    client: &IndexerClient<Channel>,
    auth: &AsciiMetadataValue,
) -> (Vec<f64>, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let releases = releaser(client.clone(), auth.clone(), mode != Mode::Separate, counts.clone());
    let in_flight = Arc::new(Semaphore::new(1024));
    let deadline = Instant::now() + Duration::from_secs(s.seconds);
    let picker = {
        let (client, auth, counts, pods) = (client.clone(), auth.clone(), counts.clone(), s.pods.clone());
        let (rate, blocks, prefill, end) = (s.picks_per_s, s.prompt_blocks, s.prefill, s.end);
        tokio::spawn(async move {
            if mode == Mode::Score {
                return;
            }
            let start = Instant::now();
            let mut n: u64 = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            while Instant::now() < deadline {
                tick.tick().await;
                let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                while n < due {
                    n += 1;
                    let Ok(permit) = in_flight.clone().try_acquire_owned() else { continue };
                    let pod = pods[n as usize % pods.len()].clone();
                    let reservation = pb::Reservation {
                        pod: pod.clone(),
                        request_id: n,
                        prefill_blocks: blocks as u32,
                        ttl_ms: 30_000,
                    };
                    let credit = pb::RecordRouteRequest {
                        pod,
                        model: MODEL.into(),
                        token_ids: prompt(n, blocks),
                        ttl_ms: 2_000,
                        reservations: if mode == Mode::Folded { vec![reservation.clone()] } else { Vec::new() },
                        ..Default::default()
                    };
                    let reserve_only = pb::RecordRouteRequest { reservations: vec![reservation], ..Default::default() };
                    let calls = match mode {
                        Mode::Separate => vec![credit, reserve_only],
                        Mode::Reserve => vec![reserve_only],
                        _ => vec![credit],
                    };
                    let (client, auth, counts, releases) =
                        (client.clone(), auth.clone(), counts.clone(), releases.clone());
                    counts.picks.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(async move {
                        for request in calls {
                            let mut call = tonic::Request::new(request);
                            call.metadata_mut().insert("authorization", auth.clone());
                            counts.record_calls.fetch_add(1, Ordering::Relaxed);
                            if let Err(status) = client.clone().record_route(call).await {
                                counts.failed(status);
                            }
                        }
                        drop(permit);
                        if mode != Mode::Credit {
                            tokio::time::sleep(prefill).await;
                            let _ = releases
                                .send(pb::Release { request_id: n, part: pb::ReleasePart::ReleasePrefill as i32 });
                            tokio::time::sleep(end.saturating_sub(prefill)).await;
                            let _ = releases
                                .send(pb::Release { request_id: n, part: pb::ReleasePart::ReleaseRequest as i32 });
                        }
                    });
                }
            }
        })
    };
    // The probe has a thread, a runtime and a connection of its own, so the picks' tasks do not
    // sit in front of it on the client side.
    let (addr, rate, blocks) = (s.addr.clone(), s.scores_per_s.max(1), s.prompt_blocks);
    let prober = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let mut client = IndexerClient::connect(format!("http://{addr}")).await.expect("indexer");
            let probe = pb::ScoreTokensRequest {
                model: MODEL.into(),
                token_ids: prompt(u64::MAX, blocks),
                ..Default::default()
            };
            let mut latencies = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while Instant::now() < deadline {
                tick.tick().await;
                let started = Instant::now();
                let answer = client.score_tokens(probe.clone()).await.expect("ScoreTokens");
                latencies.push(started.elapsed().as_secs_f64() * 1000.0);
                let reserving = matches!(mode, Mode::Folded | Mode::Separate | Mode::Reserve);
                assert!(!reserving || answer.into_inner().in_flight.is_some(), "reservations are on");
            }
            latencies
        })
    });
    let latencies = tokio::task::spawn_blocking(move || prober.join().expect("the probe")).await.unwrap();
    picker.await.unwrap();
    // Let the last releases go out before the next mode starts.
    tokio::time::sleep(s.end + Duration::from_millis(500)).await;
    (latencies, counts)
}

fn main() {
    let (Ok(kvindex), Ok(sim)) =
        (workspace_binary("kvindex", "KVINDEX_BIN"), workspace_binary("kvindex-sim", "KVINDEX_SIM_BIN"))
    else {
        eprintln!("build kvindex and kvindex-sim first (see the doc comment)");
        return;
    };
    let seconds = env_usize("SECONDS", 20) as u64;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let service = KvindexService::start(&kvindex, BLOCK).expect("kvindex serve");
        let args = ["--model", MODEL, "--zmq-connect", &service.zmq_endpoint, "--http-base-port", "0", "--replay-base-port", "0"];
        let sims = SimFleet::start(&sim, env_usize("PODS", 8), &args).expect("kvindex-sim");
        for (i, pod) in sims.pods.iter().enumerate() {
            service.register_pod(&pod.pod_id, MODEL, pod.replay.as_deref()).await.expect("register");
            // One block each, so the indexer has every pod's source (RecordRoute credits known pods).
            let body = json!({"model": MODEL, "prompt": (0..16).map(|t| 900_000 + 100 * i as u32 + t).collect::<Vec<u32>>(), "max_tokens": 1});
            let (status, text) = http(&pod.http, "POST", "/v1/completions", Some(&body.to_string())).await.unwrap();
            assert_eq!(status, 200, "{text}");
            let next = sim_next_seq(&pod.http).await.unwrap();
            service.wait_applied(&pod.pod_id, next, Duration::from_secs(30)).await.expect("applied");
        }
        // A request per pod every 2 s keeps every source publishing, so none goes STALE
        // (`stale_after_ms`) and every credit is computed in full.
        let http_addrs: Vec<String> = sims.pods.iter().map(|p| p.http.clone()).collect();
        let heartbeat = tokio::spawn(async move {
            for round in 0u32.. {
                for (i, addr) in http_addrs.iter().enumerate() {
                    let prompt: Vec<u32> = (0..16).map(|t| 800_000 + 1000 * (round % 500) + 10 * i as u32 + t).collect();
                    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}).to_string();
                    let _ = http(addr, "POST", "/v1/completions", Some(&body)).await;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
        let token = std::fs::read_to_string(service.admin_token_file()).unwrap();
        let auth: AsciiMetadataValue = format!("Bearer {}", token.trim()).parse().unwrap();
        let client = IndexerClient::connect(format!("http://{}", service.grpc_addr)).await.expect("indexer");
        let settings = Settings {
            seconds,
            picks_per_s: env_usize("PICKS_PER_S", 5000),
            scores_per_s: env_usize("SCORES_PER_S", 200),
            prompt_blocks: env_usize("PROMPT_BLOCKS", 32),
            prefill: Duration::from_millis(env_usize("PREFILL_MS", 50) as u64),
            end: Duration::from_millis(env_usize("END_MS", 500) as u64),
            pods: sims.pods.iter().map(|p| p.pod_id.clone()).collect(),
            addr: service.grpc_addr.clone(),
        };
        let pid = service.process.pid();
        println!(
            "shared in-flight load: {} picks/s for {seconds} s each, {} pods, {}-block prompts, ScoreTokens {}/s; kvindex serve pid {pid}",
            settings.picks_per_s,
            settings.pods.len(),
            settings.prompt_blocks,
            settings.scores_per_s
        );
        println!(
            "mode      picks/s  RecordRoute/s  ReleaseRoute/s  releases/call  errors  ScoreTokens p50 / p99 ms  indexer CPU %  CPU µs/pick over score"
        );
        // The indexer's CPU share with no picks (scores, housekeeping, the pods' streams).
        let mut floor = 0.0;
        for mode in [Mode::Score, Mode::Credit, Mode::Folded, Mode::Separate, Mode::Reserve] {
            let before = cpu_seconds(pid);
            let started = Instant::now();
            let (mut latencies, counts) = run(mode, &settings, &client, &auth).await;
            let wall = started.elapsed().as_secs_f64();
            let cpu = cpu_seconds(pid) - before;
            let picks = counts.picks.load(Ordering::Relaxed);
            let per = |v: &AtomicU64| v.load(Ordering::Relaxed) as f64 / seconds as f64;
            let release_calls = counts.release_calls.load(Ordering::Relaxed);
            println!(
                "{:<9} {:>7.0}  {:>13.0}  {:>14.0}  {:>13.1}  {:>6}  {:>10.3} / {:<10.3}  {:>13.1}  {:>22.1}",
                format!("{mode:?}").to_lowercase(),
                picks as f64 / seconds as f64,
                per(&counts.record_calls),
                per(&counts.release_calls),
                if release_calls > 0 { counts.releases.load(Ordering::Relaxed) as f64 / release_calls as f64 } else { 0.0 },
                counts.errors.load(Ordering::Relaxed),
                pct(&mut latencies, 0.5),
                pct(&mut latencies, 0.99),
                100.0 * cpu / wall,
                if picks > 0 { (cpu - floor * wall) * 1e6 / picks as f64 } else { 0.0 },
            );
            if mode == Mode::Score {
                floor = cpu / wall;
            }
            let codes = counts.codes.lock();
            if !codes.is_empty() {
                println!("          failed calls by code: {codes:?}");
            }
        }
        heartbeat.abort();
        let (_, metrics) = http(&service.http_addr, "GET", "/metrics", None).await.unwrap();
        for line in metrics.lines().filter(|l| l.starts_with("kvindex_reservation") || l.starts_with("kvindex_release_route")) {
            println!("  {line}");
        }
    });
}
