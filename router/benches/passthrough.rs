//! Throughput per core of the proxy with streamed answers: a release `kvindex-router` process in
//! front of an upstream that answers every request with a 16-chunk SSE stream at once, scoring
//! each 1k-token prompt against a real `kvindex serve`. Closed loop with `CONCURRENCY` clients
//! for `BENCH_SECONDS`; the router's CPU time comes from /proc, so the figure is requests per second
//! per core of router CPU even though client, upstream, indexer and router share the machine.
//!
//! ```sh
//! cargo build --release -p kvindex-server --bin kvindex -p kvindex-router --bin kvindex-router
//! cargo bench -p kvindex-router --bench passthrough        # CONCURRENCY=32 BENCH_SECONDS=10
//! NO_INDEXER=1 cargo bench -p kvindex-router --bench passthrough   # the proxy alone, for comparison
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvindex_loadtest::kvindex_service::KvindexService;
use kvindex_loadtest::process::{workspace_binary, RouterProcess};

const CHUNKS: usize = 16;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0 // CLK_TCK is 100 on Linux
}

async fn upstream() -> String {
    let chunk = Bytes::from(format!(
        "data: {{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":0,\"model\":\"m\",\"choices\":[{{\"index\":0,\"text\":\"{}\",\"finish_reason\":null}}]}}\n\n",
        "x".repeat(24)
    ));
    let app = axum::Router::new()
        .route(
            "/v1/completions",
            axum::routing::post(move |_: Bytes| {
                let chunk = chunk.clone();
                async move {
                    let frames = (0..CHUNKS).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
                    let done = std::iter::once(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
                    let stream = tokio_stream::iter(frames.chain(done));
                    ([("content-type", "text/event-stream")], Body::from_stream(stream))
                }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(|| async {
                "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn main() {
    let (kvindex, router_bin) =
        match (workspace_binary("kvindex", "KVINDEX_BIN"), workspace_binary("kvindex-router", "KVINDEX_ROUTER_BIN")) {
            (Ok(k), Ok(r)) => (k, r),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("{e}");
                return;
            }
        };
    let concurrency = env_u64("CONCURRENCY", 32);
    let seconds = env_u64("BENCH_SECONDS", 10);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let service = KvindexService::start(&kvindex, 16).expect("kvindex serve");
        let pod = upstream().await;
        let mut args = vec!["--pod".to_string(), format!("{pod}=http://{pod}")];
        let scored = std::env::var_os("NO_INDEXER").is_none();
        if scored {
            args.extend(["--indexer".to_string(), service.grpc_addr.clone()]);
        }
        let router = RouterProcess::start(&router_bin, &args).expect("kvindex-router");
        let prompt: Vec<u32> = (0..1024).collect();
        let body = Bytes::from(serde_json::json!({"model": "m", "prompt": prompt, "stream": true}).to_string());
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let url: hyper::Uri = format!("http://{}/v1/completions", router.http).parse().unwrap();
        let send = {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            move || {
                let request = hyper::Request::post(url.clone()).body(Full::new(body.clone())).unwrap();
                let client = client.clone();
                async move {
                    let response = client.request(request).await.expect("request");
                    assert_eq!(response.status(), 200);
                    response.into_body().collect().await.expect("body").to_bytes().len()
                }
            }
        };
        for _ in 0..200 {
            send().await;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (done, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let cpu_before = cpu_seconds(router.process.pid());
        let started = Instant::now();
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (stop, done, bytes, send) = (stop.clone(), done.clone(), bytes.clone(), send.clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        let n = send().await;
                        latencies.push(t.elapsed());
                        done.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    latencies
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let mut latencies = Vec::new();
        for worker in workers {
            latencies.extend(worker.await.unwrap());
        }
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds(router.process.pid()) - cpu_before;
        latencies.sort_unstable();
        let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize].as_secs_f64() * 1000.0;
        let n = done.load(Ordering::Relaxed) as f64;
        println!(
            "streaming pass-through, {CHUNKS}+1 SSE chunks/answer, 1024-token prompts {}: {concurrency} clients, {elapsed:.1} s: \
             {:.0} req/s, {:.1} MB/s; client latency p50 {:.2} ms p99 {:.2} ms; router CPU {:.2} cores → {:.0} req/s per core",
            if scored { "scored by kvindex serve" } else { "not scored (no indexer)" },
            n / elapsed,
            bytes.load(Ordering::Relaxed) as f64 / elapsed / 1e6,
            pct(0.5),
            pct(0.99),
            cpu / elapsed,
            n / cpu.max(1e-9),
        );
    });
}
