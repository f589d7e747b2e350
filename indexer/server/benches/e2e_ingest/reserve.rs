//! Phase 8 of the e2e bench (`E2E_RESERVE_RATE` picks/s, default off): what the shared
//! in-flight load costs the indexer. ScoreTokens for phase 2's prompt (8k tokens, 4 holder
//! pods) at `E2E_RESERVE_SCORE_RPS` (default 1000), open loop, as a router asks (one
//! connection, `ScoreQuery`), in cells with reservations flowing at that many picks/s and cells
//! without, alternating (`E2E_SCORE_ROUNDS` rounds, default 3, of `E2E_RESERVE_SECS`, default
//! 10). A pick is what a router sends after it: one RecordRoute carrying one reservation (no
//! token ids: the credit is RecordRoute's older cost, not this one), its prefill part released
//! `PREFILL_MS` later and the request `REQUEST_MS` later, in ReleaseRoute batches of whatever
//! came due (at most 1,024 a call), as the router's release task sends them. Same binary, same
//! server, same prompt: the difference between the cells is the reservations. Reports the
//! ScoreTokens latency (client and server histogram), the server's cores, and its CPU per
//! reservation ((cores with − cores without) / reservations taken per second).

use std::collections::VecDeque;

use kvindex_proto::kvindex::v1::{RecordRouteRequest, Release, ReleasePart, ReleaseRouteRequest, Reservation};

use super::score::{connect_holders, hold_prompt, measure, Client};
use super::*;

/// The prefill part ends at the first response byte, the request at its end.
const PREFILL_MS: u64 = 100;
const REQUEST_MS: u64 = 1000;
const TOKEN: &str = "e2e-bench-admin-token-0123456789";

fn authorized<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    request
}

/// Reservations at `rate` picks/s on the server at `grpc` until `stop`: each a RecordRoute,
/// released in two parts by a batching task. Counts the picks the server answered in `made`.
async fn flow(grpc: String, rate: f64, stop: Arc<AtomicBool>, made: Arc<AtomicU64>, failed: Arc<AtomicU64>) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap();
    // The parts still held, each queue in the order they come due (the order of the answers).
    type Due = (VecDeque<(Instant, u64)>, VecDeque<(Instant, u64)>);
    let due: Arc<parking_lot::Mutex<Due>> = Default::default();
    let releaser = {
        let (channel, due, stop) = (channel.clone(), due.clone(), stop.clone());
        tokio::spawn(async move {
            let mut client = IndexerClient::new(channel);
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            loop {
                tick.tick().await;
                let now = Instant::now();
                let mut batch = Vec::new();
                let empty = {
                    let mut due = due.lock();
                    let (prefill, request) = &mut *due;
                    for (queue, part) in
                        [(prefill, ReleasePart::ReleasePrefill), (request, ReleasePart::ReleaseRequest)]
                    {
                        while batch.len() < 1024 && queue.front().is_some_and(|(at, _)| *at <= now) {
                            let (_, id) = queue.pop_front().unwrap();
                            batch.push(Release { request_id: id, part: part as i32 });
                        }
                    }
                    due.0.is_empty() && due.1.is_empty()
                };
                if !batch.is_empty() {
                    let _ = client.release_route(authorized(ReleaseRouteRequest { releases: batch })).await;
                }
                if stop.load(Ordering::Relaxed) && empty {
                    return;
                }
            }
        })
    };
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let (started, mut sent) = (Instant::now(), 0u64);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let owed = (started.elapsed().as_secs_f64() * rate) as u64;
        while sent < owed {
            sent += 1;
            let id = sent;
            let request = RecordRouteRequest {
                reservations: vec![Reservation {
                    pod: format!("holder-{}:8000", id % 4),
                    request_id: id,
                    prefill_blocks: 8,
                    ttl_ms: 0,
                }],
                ..Default::default()
            };
            let (mut client, made, failed, due) =
                (IndexerClient::new(channel.clone()), made.clone(), failed.clone(), due.clone());
            tokio::spawn(async move {
                match client.record_route(authorized(request)).await {
                    Ok(r) if r.get_ref().reserved == 1 => {
                        made.fetch_add(1, Ordering::Relaxed);
                        // The router releases from its own clock, after the pick's answer.
                        let now = Instant::now();
                        let mut due = due.lock();
                        due.0.push_back((now + Duration::from_millis(PREFILL_MS), id));
                        due.1.push_back((now + Duration::from_millis(REQUEST_MS), id));
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    }
    let _ = releaser.await;
}

pub fn run(rate: f64, score_rps: f64, secs: f64) {
    let rounds = std::env::var("E2E_SCORE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3usize);
    let client_rt = tokio::runtime::Runtime::new().unwrap();
    let flow_rt = tokio::runtime::Runtime::new().unwrap();
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), TOKEN).unwrap();
    let server = Server::start(&[
        "--max-source-staleness-ms",
        "0",
        "--stale-after-ms",
        "86400000",
        "--admin-token-file",
        token.path().to_str().unwrap(),
        // The holders publish once and stay silent, and the `zeromq` crate's PUB answers no ZMTP
        // PING: at the default idle timeout (60 s) their connections would close mid-phase and
        // clear the pods, leaving the later cells to score an empty index.
        "--zmq-idle-timeout-ms",
        "86400000",
    ]);
    let pid = server.process.pid();
    let prompt: Arc<Vec<u32>> = Arc::new((0..8192u32).map(|i| (i * 31 + 7) % 151_000).collect());
    let mut holders = flow_rt.block_on(connect_holders(&server));
    flow_rt.block_on(hold_prompt(&server, &mut holders, &prompt, 0));
    println!();
    println!(
        "ScoreTokens, 8k-token prompt (4 holder pods), {score_rps:.0} req/s open loop (router client), with reservations at {rate:.0} picks/s (RecordRoute each, prefill released after {PREFILL_MS} ms, request after {REQUEST_MS} ms, batched) and without, alternating, {rounds} rounds of {secs} s; medians over the rounds (ms):"
    );
    println!("| reservations | ScoreTokens ok | errors | client p50 | client p99 | server p50 ≤ | server p99 ≤ | server CPU (cores) | reservations taken/s | failed picks |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    // [off, on]: per round p50, p99, server p50, server p99, cores, taken/s; ok, errors, failed.
    let mut cells: [(Vec<[f64; 6]>, usize, u64, u64); 2] = Default::default();
    let mut per_reservation_us = Vec::new();
    for _ in 0..rounds {
        let mut cores_off = None;
        for on in [false, true] {
            let (stop, made, failed) =
                (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let flow = on.then(|| {
                let (grpc, stop, made, failed) = (server.grpc.clone(), stop.clone(), made.clone(), failed.clone());
                let handle = flow_rt.spawn(flow(grpc, rate, stop, made, failed));
                // The flow's steady state: reservations held and released at the rate.
                std::thread::sleep(Duration::from_millis(REQUEST_MS + 500));
                handle
            });
            let taken_before = server.metric("kvindex_reservations_total", "result=\"reserved\"");
            let before = server_buckets(&server, "kvindex_score_latency_seconds");
            let (cpu_before, started) = (cpu_s(pid), Instant::now());
            let (latencies, errors) = measure(&client_rt, Client::Router, &server.grpc, &prompt, score_rps, secs);
            let elapsed = started.elapsed().as_secs_f64();
            let cores = (cpu_s(pid) - cpu_before) / elapsed;
            let taken = (server.metric("kvindex_reservations_total", "result=\"reserved\"") - taken_before) / elapsed;
            let during = bucket_delta(&before, &server_buckets(&server, "kvindex_score_latency_seconds"));
            stop.store(true, Ordering::Relaxed);
            if let Some(handle) = flow {
                let _ = flow_rt.block_on(handle);
            }
            let cell = &mut cells[usize::from(on)];
            cell.0.push([
                quantile(&latencies, 0.5),
                quantile(&latencies, 0.99),
                bucket_quantile(&during, 0.5),
                bucket_quantile(&during, 0.99),
                cores,
                taken,
            ]);
            cell.1 += latencies.len();
            cell.2 += errors.values().sum::<u64>();
            cell.3 += failed.load(Ordering::Relaxed);
            match cores_off {
                None => cores_off = Some(cores),
                Some(off) if taken > 0.0 => per_reservation_us.push((cores - off) / taken * 1e6),
                Some(_) => {}
            }
        }
    }
    let med = |rows: &[[f64; 6]], i: usize| {
        let mut v: Vec<f64> = rows.iter().map(|r| r[i]).collect();
        v.sort_by(f64::total_cmp);
        quantile(&v, 0.5)
    };
    for (on, (rows, ok, errors, failed)) in cells.iter().enumerate() {
        println!(
            "| {} | {ok} | {errors} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {:.0} | {failed} |",
            if on == 1 { format!("{rate:.0} picks/s") } else { "none".to_string() },
            med(rows, 0),
            med(rows, 1),
            med(rows, 2),
            med(rows, 3),
            med(rows, 4),
            med(rows, 5)
        );
    }
    per_reservation_us.sort_by(f64::total_cmp);
    println!(
        "server CPU per reservation (RecordRoute + its two releases), (cores with − cores without) / taken per s, per round: {} µs; median {:.1} µs",
        per_reservation_us.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(" / "),
        quantile(&per_reservation_us, 0.5)
    );
}
