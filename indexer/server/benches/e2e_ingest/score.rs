//! Phase 2: ScoreTokens over gRPC for an 8k-token prompt (512 blocks, held by 4 pods; another
//! length with `E2E_SCORE_TOKENS`) at a target request rate, open loop, while 64 publishers
//! ingest (none with `E2E_SCORE_INGEST=0`), and the floor beside it in the same
//! invocation: a trivial gRPC echo (tonic, served as `kvindex serve` serves: its frame size, its
//! decoder of the ids; in a process of its own) that decodes the same request and answers a
//! fixed reply of the real one's shape, looking
//! nothing up. What the echo costs is the transport and the scheduling on this machine, which no
//! change to the index can remove.
//!
//! Each target is asked by each client, in rounds (`E2E_SCORE_ROUNDS`, default 3), so slow
//! drift of the machine's load spreads over every cell; the table gives each cell's median over
//! the rounds:
//! - `before`: the generated client on 8 HTTP/2 connections in turn, each call a copy of the
//!   request (this bench's client until 2026-12);
//! - `router`: as `kvindex-router` calls: one connection (tonic's default settings, TCP_NODELAY),
//!   a [`ScoreQuery`] sharing the token ids, its body handed over whole ([`WholeRequests`]);
//! - `router×4`: the same over 4 connections in turn (whether a pool of connections helps).
//!
//! The last column is the CPU the serving process used during the cell (the kvindex server's
//! includes applying the ingest), in cores: beside the machine's 2, it says whether the offered
//! load fits at all.
//!
//! Requests are sent by a pacing thread at exact intervals (tokio's timer would release them in
//! bursts each millisecond), each as a task of its own, as a router's requests are; latency runs
//! from the spawn to the answer. The publishers run on a runtime of their own.

use kvindex_proto::score_query::{self, ScoreQuery, WholeRequests};
use kvindex_proto::score_route::IndexerRoutes;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use tonic::transport::Channel;

use super::*;

/// Set in the environment of the child process that serves the echo.
pub const ECHO_ENV: &str = "E2E_ECHO_SERVER";

/// How many token ids the prompt has: `E2E_SCORE_TOKENS`, default 8192 (512 blocks); a multiple
/// of the block size (rounded down).
fn prompt_tokens() -> usize {
    let tokens = std::env::var("E2E_SCORE_TOKENS").ok().and_then(|v| v.parse().ok()).unwrap_or(8192usize);
    (tokens / BLOCK).max(1) * BLOCK
}

/// The child process's whole life: serves the echo on a loopback port, printed as
/// `ECHO_LISTENING <addr>`, until killed.
pub fn serve_echo() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("ECHO_LISTENING {}", listener.local_addr().unwrap());
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        // As `kvindex serve` serves ScoreTokens: its frame size and its decoder of the ids.
        tonic::transport::Server::builder()
            .max_frame_size(kvindex_server::read::grpc::MAX_FRAME_BYTES)
            .add_service(IndexerRoutes::new(echo::Echo {
                reply: echo::reply((prompt_tokens() / BLOCK) as u32, BLOCK as u32),
            }))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
}

/// The echo server, as a child process.
struct EchoServer {
    child: Child,
    addr: String,
}

impl EchoServer {
    fn start() -> EchoServer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(ECHO_ENV, "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the echo server");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("ECHO_LISTENING ").expect("echo server address").to_string();
        EchoServer { child, addr }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Client {
    Before,
    Router,
    RouterPool,
}

impl Client {
    const ALL: [Client; 3] = [Client::Before, Client::Router, Client::RouterPool];

    fn label(self) -> &'static str {
        match self {
            Client::Before => "before (8 conns, generated)",
            Client::Router => "router (1 conn, ScoreQuery)",
            Client::RouterPool => "router×4 (4 conns)",
        }
    }

    fn connections(self) -> usize {
        match self {
            Client::Before => 8,
            Client::Router => 1,
            Client::RouterPool => 4,
        }
    }
}

/// One request as `client` sends it; `Ok` if the answer names the 4 holders, else why not.
async fn ask(client: Client, channel: Channel, prompt: &Arc<Vec<u32>>) -> Result<(), String> {
    let answer = match client {
        Client::Before => {
            let request =
                ScoreTokensRequest { model: MODEL.into(), token_ids: (**prompt).clone(), ..Default::default() };
            IndexerClient::new(channel).score_tokens(request).await
        }
        Client::Router | Client::RouterPool => {
            let rest = ScoreTokensRequest { model: MODEL.into(), ..Default::default() };
            let query = tonic::Request::new(ScoreQuery::new(rest, prompt.clone()));
            score_query::score_tokens(WholeRequests(channel), query).await
        }
    };
    match answer {
        Ok(r) if r.get_ref().scores.len() >= 4 => Ok(()),
        Ok(r) => Err(format!("{} scores", r.get_ref().scores.len())),
        Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
    }
}

/// Latencies (ms, sorted) and errors (by reason) of `secs` of requests at `rps` from `client`
/// to `addr`.
pub(super) fn measure(
    runtime: &tokio::runtime::Runtime,
    client: Client,
    addr: &str,
    prompt: &Arc<Vec<u32>>,
    rps: f64,
    secs: f64,
) -> (Vec<f64>, BTreeMap<String, u64>) {
    let channels: Vec<Channel> = runtime.block_on(async {
        let mut channels = Vec::new();
        for _ in 0..client.connections() {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
            let channel = match client {
                Client::Before => endpoint.connect().await.unwrap(),
                // The router's settings (router/src/place/indexer.rs).
                _ => endpoint.connect_timeout(Duration::from_millis(500)).tcp_nodelay(true).connect().await.unwrap(),
            };
            // Warm-up (connection, allocator), not measured.
            for _ in 0..20 {
                if let Err(e) = ask(client, channel.clone(), prompt).await {
                    panic!("{addr} does not answer: {e}");
                }
            }
            channels.push(channel);
        }
        channels
    });
    let latencies = Arc::new(parking_lot::Mutex::new(Vec::<f64>::new()));
    let errors = Arc::new(parking_lot::Mutex::new(BTreeMap::<String, u64>::new()));
    let period = Duration::from_secs_f64(1.0 / rps);
    let start = Instant::now();
    let total = (rps * secs) as u32;
    let mut handles = Vec::with_capacity(total as usize);
    for n in 0..total {
        let at = start + period * n;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let (channel, prompt) = (channels[n as usize % channels.len()].clone(), prompt.clone());
        let (latencies, errors) = (latencies.clone(), errors.clone());
        let sent = Instant::now();
        handles.push(runtime.spawn(async move {
            match ask(client, channel, &prompt).await {
                Ok(()) => latencies.lock().push(sent.elapsed().as_secs_f64() * 1e3),
                Err(why) => *errors.lock().entry(why).or_default() += 1,
            }
        }));
    }
    runtime.block_on(async {
        for handle in handles {
            let _ = handle.await;
        }
    });
    let mut v = latencies.lock().clone();
    v.sort_by(f64::total_cmp);
    let errors = errors.lock().clone();
    (v, errors)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

/// The whole phase at each rate in `rates`, ingesting `ingest_rate` block ops/s; prints its table.
pub fn run(rates: &[f64], ingest_rate: f64, secs: f64) {
    if rates.is_empty() {
        return;
    }
    let rounds = std::env::var("E2E_SCORE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3usize);
    let client_rt = tokio::runtime::Runtime::new().unwrap();
    let ingest_rt = tokio::runtime::Runtime::new().unwrap();
    // The holders publish once and then stay silent for the whole phase (minutes), while the
    // publishers load the apply queues: a silent source turns STALE after `--stale-after-ms`, and
    // the lag bound withholds sources whenever the ingest backlog passes it on this machine;
    // either would have the bench measure empty answers.
    let server = Server::start(&["--max-source-staleness-ms", "0", "--stale-after-ms", "86400000"]);
    let echo = EchoServer::start();
    // 4 pods hold the prompt (8k tokens, 512 blocks, unless E2E_SCORE_TOKENS says otherwise).
    let prompt: Arc<Vec<u32>> = Arc::new((0..prompt_tokens() as u32).map(|i| (i * 31 + 7) % 151_000).collect());
    let mut holders = ingest_rt.block_on(connect_holders(&server));
    let mut seq = 0u64;
    println!();
    println!(
        "ScoreTokens, {}-token prompt ({} blocks, 4 holder pods), open loop, {rounds} rounds of {secs} s per cell, ingesting {ingest_rate:.0} block ops/s; medians over the rounds (ms):",
        prompt.len(),
        prompt.len() / BLOCK
    );
    println!("| req/s | target | client | ok | errors | client p50 | client p99 | server p50 ≤ | server p99 ≤ | server CPU (cores) |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for &rps in rates {
        // Every round's cells run while the publishers ingest.
        let until = Instant::now() + Duration::from_secs(24 * 3600);
        let (sent, seqs, stop) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let publishers: Vec<_> = (0..if ingest_rate > 0.0 { PUBLISHERS } else { 0 })
            .map(|id| {
                let (zmq, sent, seqs, stop) = (server.zmq.clone(), sent.clone(), seqs.clone(), stop.clone());
                let pace = Pace { rate: ingest_rate, until, remove: true, stop };
                ingest_rt.spawn(publish_with(id, zmq, pace, sent, seqs))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1300));
        type Cell = (Vec<f64>, Vec<f64>, usize, BTreeMap<String, u64>, Vec<f64>, Vec<f64>, Vec<f64>);
        let mut cells: Vec<((&str, Client), Cell)> = Vec::new();
        for _ in 0..rounds {
            for target in ["kvindex", "echo"] {
                for client in Client::ALL {
                    let (addr, pid) = if target == "kvindex" {
                        (&server.grpc, server.process.pid())
                    } else {
                        (&echo.addr, echo.child.id())
                    };
                    // Each cell starts with the prompt held by all four (stored again: the ingest
                    // load on this machine has had silent holders withheld between cells).
                    ingest_rt.block_on(hold_prompt(&server, &mut holders, &prompt, seq));
                    seq += 1;
                    let before = server_buckets(&server, "kvindex_score_latency_seconds");
                    let (cpu_before, started) = (cpu_s(pid), Instant::now());
                    let (latencies, errors) = measure(&client_rt, client, addr, &prompt, rps, secs);
                    let cores = (cpu_s(pid) - cpu_before) / started.elapsed().as_secs_f64();
                    let during = bucket_delta(&before, &server_buckets(&server, "kvindex_score_latency_seconds"));
                    let i = match cells.iter().position(|(key, _)| *key == (target, client)) {
                        Some(i) => i,
                        None => {
                            cells.push(((target, client), Default::default()));
                            cells.len() - 1
                        }
                    };
                    let cell = &mut cells[i].1;
                    cell.0.push(quantile(&latencies, 0.5));
                    cell.1.push(quantile(&latencies, 0.99));
                    cell.2 += latencies.len();
                    cell.6.push(cores);
                    for (why, n) in errors {
                        *cell.3.entry(why).or_default() += n;
                    }
                    if target == "kvindex" {
                        cell.4.push(bucket_quantile(&during, 0.5));
                        cell.5.push(bucket_quantile(&during, 0.99));
                    }
                }
            }
        }
        let mut reasons = Vec::new();
        for ((target, client), (p50, p99, ok, errors, s50, s99, cores)) in cells {
            if !errors.is_empty() {
                reasons.push(format!("{target} / {}: {errors:?}", client.label()));
            }
            let errors: u64 = errors.values().sum();
            let server_column =
                |v: Vec<f64>| if v.is_empty() { "–".to_string() } else { format!("{:.3}", median(v)) };
            println!(
                "| {rps:.0} | {target} | {} | {ok} | {errors} | {:.3} | {:.3} | {} | {} | {:.2} |",
                client.label(),
                median(p50),
                median(p99),
                server_column(s50),
                server_column(s99),
                median(cores)
            );
        }
        for reason in reasons {
            println!("errors, {reason}");
        }
        stop.store(true, Ordering::Relaxed);
        ingest_rt.block_on(async {
            for p in publishers {
                let _ = p.await;
            }
        });
    }
}

/// The 4 holder pods' sockets, connected (kept open for the phase).
pub(super) async fn connect_holders(server: &Server) -> Vec<PubSocket> {
    let mut holders = Vec::new();
    for _ in 0..4 {
        let mut sock = PubSocket::new();
        sock.connect(&server.zmq).await.unwrap();
        holders.push(sock);
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    holders
}

/// Each of the 4 holder pods stores the whole prompt as one BlockStored (sequence
/// number `seq`); returns once ScoreTokens credits each all it may (every block but the one
/// holding the prompt's last token).
pub(super) async fn hold_prompt(server: &Server, holders: &mut [PubSocket], prompt: &[u32], seq: u64) {
    for (p, sock) in holders.iter_mut().enumerate() {
        let hashes: Vec<u64> =
            (0..(prompt.len() / BLOCK) as u64).map(|b| 0xabc0_0000 + ((p as u64) << 32) + b).collect();
        let ev = Stored {
            ty: "BlockStored",
            block_hashes: hashes,
            parent_block_hash: None,
            token_ids: prompt,
            block_size: BLOCK as u32,
            lora_id: None,
            medium: "GPU",
            lora_name: None,
        };
        let payload = rmp_serde::to_vec_named(&(now_ts(), [ev], 0i64)).unwrap();
        let topic = Bytes::from(format!("kv@holder-{p}:8000@{MODEL}"));
        let msg: ZmqMessage =
            vec![topic, Bytes::copy_from_slice(&seq.to_be_bytes()), Bytes::from(payload)].try_into().unwrap();
        sock.send(msg).await.unwrap();
    }
    let mut client = IndexerClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let req = ScoreTokensRequest { model: MODEL.into(), token_ids: prompt.to_vec(), ..Default::default() };
    loop {
        let r = client.score_tokens(req.clone()).await.unwrap().into_inner();
        // The engine computes at least the prompt's last token, so a pod holding all of it is
        // credited `(len - 1) / block` blocks (511 of 512 here), not every block.
        let servable = ((prompt.len() - 1) / BLOCK) as u32;
        if r.scores.len() == 4 && r.scores.iter().all(|s| s.matched_blocks == servable) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
