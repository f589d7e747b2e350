//! ScoreTokens' round trip, layer by layer (harness = false): where the time between a router's
//! call and the indexer's answer goes when the index itself is not in it.
//!
//! Each row is one client against one server in a process of its own (this executable again,
//! `WIRE_SERVE=<server>`), with the router's request: an `E2E`-sized prompt of `WIRE_IDS` token
//! ids (default 8,800, ~26 kB of packed varints) and a reply of the real one's shape (4 pods,
//! ~150 bytes). Two ways of asking, one request at a time each:
//! - **paced**: one request every `WIRE_PACE_US` (default 5,000 µs), `WIRE_PACED` of them
//!   (default 1,000): the router's turn, which finds both processes idle (parked) every time;
//! - **closed**: `WIRE_CLOSED` (default 2,000) back to back: the same work with every thread
//!   already awake.
//!
//! Beside p50 / p99, each row counts the context switches of both processes per paced request
//! (voluntary + involuntary, every thread; less load-dependent than the latencies: a thread that
//! sleeps and is woken costs one, and on a virtual machine's idle vCPU that wake is the
//! expensive part) and both processes' CPU per request.
//!
//! The layers (servers × clients):
//! - `tcp`: plain TCP, a blocking thread each side, the same byte counts: the machine's floor;
//! - `echo`: the trivial tonic echo (the same request decoded, a fixed reply), served as
//!   `kvindex serve` serves (TCP_NODELAY), on a multi-thread runtime (`echo`), a current-thread
//!   one (`echo-ct`), or with a maximum frame size that takes the whole request in one DATA frame
//!   (`…-frame`), or decoding ScoreTokens as `kvindex serve` does (`…-fast`: the packed ids in
//!   one pass, `kvindex_proto::score_route`); `kvindex` (with `WIRE_KVINDEX=<binary>`): a real `kvindex serve`, empty index;
//! - clients: `tonic` (the router's until 2026-12-07: one `Channel`, TCP_NODELAY, a `ScoreQuery`;
//!   tonic's buffer task between the call and the connection), `tonic-whole` (the router's now:
//!   the same, each request's body handed over whole, `score_query::WholeRequests`), `h2` (one hyper HTTP/2 connection driven
//!   directly, no buffer task), each on a multi-thread runtime (`-mt`, the router's) or a
//!   current-thread one (`-ct`); `tiny` rows send 16 ids instead.
//!
//! `WIRE_ROWS` = comma list of row names to run (default: all), `WIRE_ROUNDS` (default 1)
//! repeats the list, interleaved, and prints each figure's median over the rounds.
//!
//! ```sh
//! cargo bench -p kvindex-server --bench wire
//! WIRE_KVINDEX=$CARGO_TARGET_DIR/release/kvindex WIRE_ROUNDS=3 cargo bench -p kvindex-server --bench wire
//! ```

use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tonic::codegen::{http, Service};

use kvindex_proto::kvindex::v1::indexer_server::IndexerServer;
use kvindex_proto::kvindex::v1::ScoreTokensRequest;
use kvindex_proto::score_query::{self, ScoreQuery, WholeRequests};
use kvindex_proto::score_route::IndexerRoutes;
use kvindex_testkit::serve::Serve;

#[path = "support/echo.rs"]
mod echo;

const SERVE_ENV: &str = "WIRE_SERVE";
const BLOCK: usize = 16;
const MODEL: &str = "m";
/// The plain-TCP server's reply: about the size of the echo's whole HTTP/2 answer.
const TCP_REPLY: usize = 200;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The child process's life: serves `kind` on a loopback port (printed `WIRE_LISTENING <addr>`)
/// until killed.
fn serve(kind: &str) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("WIRE_LISTENING {}", listener.local_addr().unwrap());
    std::io::stdout().flush().unwrap();
    if kind == "tcp" {
        // One blocking thread per connection: read a length-prefixed request, answer 200 bytes.
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            stream.set_nodelay(true).unwrap();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                let reply = [7u8; TCP_REPLY];
                loop {
                    let mut len = [0u8; 4];
                    if stream.read_exact(&mut len).is_err() {
                        return;
                    }
                    let len = u32::from_le_bytes(len) as usize;
                    if stream.read_exact(&mut buf[..len]).is_err() || stream.write_all(&reply).is_err() {
                        return;
                    }
                }
            });
        }
        return;
    }
    let runtime = if kind.starts_with("echo-ct") {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
    };
    // `kvindex serve`'s frame size.
    let frame = kind.contains("-frame").then_some(kvindex_server::read::grpc::MAX_FRAME_BYTES);
    let echo = echo::Echo { reply: echo::reply((env_usize("WIRE_IDS", 8_800) / BLOCK) as u32, BLOCK as u32) };
    runtime.block_on(async move {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut server = tonic::transport::Server::builder().max_frame_size(frame);
        let router = if kind.contains("-fast") {
            // ScoreTokens decoded as `kvindex serve` decodes it.
            server.add_service(IndexerRoutes::new(echo))
        } else {
            server.add_service(IndexerServer::new(echo))
        };
        router.serve_with_incoming(incoming).await.unwrap();
    });
}

/// A server under test: a child process, killed on drop.
enum Server {
    Child(Child, String),
    Kvindex(kvindex_testkit::serve::Serving),
}

impl Server {
    fn start(kind: &str) -> Server {
        if kind == "kvindex" {
            let binary = std::env::var("WIRE_KVINDEX").expect("WIRE_KVINDEX for the kvindex rows");
            let serving = Serve::new(binary).loopback().env("RUST_LOG", "error").start().expect("kvindex serve");
            return Server::Kvindex(serving);
        }
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(SERVE_ENV, kind)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("WIRE_LISTENING ").expect("the server's address").to_string();
        Server::Child(child, addr)
    }

    fn addr(&self) -> &str {
        match self {
            Server::Child(_, addr) => addr,
            Server::Kvindex(serving) => &serving.grpc,
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Server::Child(child, _) => child.id(),
            Server::Kvindex(serving) => serving.process.pid(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Server::Child(child, _) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Context switches (voluntary + involuntary) and CPU seconds of every thread of `pid`.
fn switches_and_cpu(pid: u32) -> (u64, f64) {
    let (mut switches, mut cpu) = (0, 0.0);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return (0, 0.0) };
    for task in tasks.flatten() {
        let path = task.path();
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        for line in status.lines() {
            if let Some(n) =
                line.strip_prefix("voluntary_ctxt_switches:").or(line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += n.trim().parse::<u64>().unwrap_or(0);
            }
        }
        // schedstat: nanoseconds on the CPU, first field.
        let sched = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
        cpu += sched.split_whitespace().next().and_then(|n| n.parse::<f64>().ok()).unwrap_or(0.0) / 1e9;
    }
    (switches, cpu)
}

/// One HTTP/2 connection driven by hyper directly: the call hands its request to the
/// connection's task, no buffer task between.
#[derive(Clone)]
struct Direct(SendRequest<tonic::body::Body>);

impl Service<http::Request<tonic::body::Body>> for Direct {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        // tonic's Grpc leaves the path alone; hyper's HTTP/2 needs an absolute URI.
        let uri = format!("http://wire{}", request.uri().path_and_query().map_or("/", |p| p.as_str()));
        *request.uri_mut() = uri.parse().unwrap();
        Box::pin(self.0.send_request(request))
    }
}

#[derive(Clone)]
enum Transport {
    Tonic(tonic::transport::Channel),
    Whole(WholeRequests<tonic::transport::Channel>),
    Direct(Direct),
}

impl Transport {
    async fn connect(client: &str, addr: &str) -> Transport {
        if client.starts_with("h2") {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(connection);
            Transport::Direct(Direct(sender))
        } else {
            // The router's settings (router/src/place/indexer.rs).
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
            let channel =
                endpoint.connect_timeout(Duration::from_millis(500)).tcp_nodelay(true).connect().await.unwrap();
            if client.starts_with("tonic-whole") {
                Transport::Whole(WholeRequests(channel))
            } else {
                Transport::Tonic(channel)
            }
        }
    }

    async fn ask(&self, query: &ScoreQuery) -> usize {
        let request = tonic::Request::new(query.clone());
        let answer = match self {
            Transport::Tonic(channel) => score_query::score_tokens(channel.clone(), request).await,
            Transport::Whole(whole) => score_query::score_tokens(whole.clone(), request).await,
            Transport::Direct(direct) => score_query::score_tokens(direct.clone(), request).await,
        };
        answer.expect("ScoreTokens").into_inner().scores.len()
    }
}

/// Latencies (µs, in order sent) of `paced` requests one `pace` apart, then of `closed` back to
/// back; and the context switches and CPU seconds both processes spent on the paced ones.
type Latencies = (Vec<f64>, Vec<f64>, (u64, f64));

/// Context switches and CPU seconds of both processes (this one and `server`), summed.
fn both(server: u32) -> (u64, f64) {
    let (a, b) = (switches_and_cpu(std::process::id()), switches_and_cpu(server));
    (a.0 + b.0, a.1 + b.1)
}

fn since(before: (u64, f64), server: u32) -> (u64, f64) {
    let now = both(server);
    (now.0 - before.0, now.1 - before.1)
}

/// The plain-TCP client: a blocking socket on this thread.
fn tcp_client(addr: &str, server: u32, request: &[u8], paced: usize, closed: usize, pace: Duration) -> Latencies {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut framed = (request.len() as u32).to_le_bytes().to_vec();
    framed.extend_from_slice(request);
    let mut reply = [0u8; TCP_REPLY];
    let mut once = |stream: &mut TcpStream| {
        let start = Instant::now();
        stream.write_all(&framed).unwrap();
        stream.read_exact(&mut reply).unwrap();
        start.elapsed().as_secs_f64() * 1e6
    };
    for _ in 0..50 {
        once(&mut stream);
    }
    let before = both(server);
    let mut p = Vec::with_capacity(paced);
    let next = Instant::now();
    for n in 0..paced {
        sleep_until_std(next + pace * n as u32);
        p.push(once(&mut stream));
    }
    let spent = since(before, server);
    let c = (0..closed).map(|_| once(&mut stream)).collect();
    (p, c, spent)
}

fn sleep_until_std(at: Instant) {
    if let Some(wait) = at.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
}

/// The gRPC clients: the calls run in one task of the client's runtime (as a router's request
/// does), which sleeps on tokio's timer between paced calls.
fn grpc_client(
    client: &str,
    addr: &str,
    server: u32,
    query: ScoreQuery,
    paced: usize,
    closed: usize,
    pace: Duration,
) -> Latencies {
    let runtime = if client.ends_with("-ct") {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
    };
    let (client, addr) = (client.to_string(), addr.to_string());
    runtime.block_on(async move {
        tokio::spawn(async move {
            let transport = Transport::connect(&client, &addr).await;
            for _ in 0..50 {
                transport.ask(&query).await;
            }
            let before = both(server);
            let mut p = Vec::with_capacity(paced);
            let next = tokio::time::Instant::now();
            for n in 0..paced {
                tokio::time::sleep_until(next + pace * n as u32).await;
                let start = Instant::now();
                std::hint::black_box(transport.ask(&query).await);
                p.push(start.elapsed().as_secs_f64() * 1e6);
            }
            let spent = since(before, server);
            let mut c = Vec::with_capacity(closed);
            for _ in 0..closed {
                let start = Instant::now();
                std::hint::black_box(transport.ask(&query).await);
                c.push(start.elapsed().as_secs_f64() * 1e6);
            }
            (p, c, spent)
        })
        .await
        .unwrap()
    })
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// A row: its name, the server, the client, the ids per request.
struct Row {
    name: &'static str,
    server: &'static str,
    client: &'static str,
    ids: usize,
}

fn rows(ids: usize) -> Vec<Row> {
    let row = |name, server, client, ids| Row { name, server, client, ids };
    let mut rows = vec![
        row("tcp", "tcp", "tcp", ids),
        row("tonic-mt/echo", "echo", "tonic-mt", ids),
        row("tonic-mt/echo tiny", "echo", "tonic-mt", 16),
        row("tonic-mt/echo-frame", "echo-frame", "tonic-mt", ids),
        row("tonic-mt/echo-fast", "echo-fast", "tonic-mt", ids),
        row("tonic-mt/echo-fast-frame", "echo-fast-frame", "tonic-mt", ids),
        row("tonic-whole-mt/echo-fast-frame", "echo-fast-frame", "tonic-whole-mt", ids),
        row("tonic-whole-mt/echo-fast-frame tiny", "echo-fast-frame", "tonic-whole-mt", 16),
        row("tonic-whole-ct/echo-fast-frame", "echo-fast-frame", "tonic-whole-ct", ids),
        row("h2-mt/echo", "echo", "h2-mt", ids),
        row("tonic-ct/echo", "echo", "tonic-ct", ids),
        row("h2-ct/echo", "echo", "h2-ct", ids),
        row("tonic-mt/echo-ct", "echo-ct", "tonic-mt", ids),
        row("tonic-ct/echo-ct", "echo-ct", "tonic-ct", ids),
        row("h2-ct/echo-ct", "echo-ct", "h2-ct", ids),
        row("h2-ct/echo-ct tiny", "echo-ct", "h2-ct", 16),
    ];
    if std::env::var_os("WIRE_KVINDEX").is_some() {
        rows.push(row("tonic-mt/kvindex", "kvindex", "tonic-mt", ids));
        rows.push(row("tonic-whole-mt/kvindex", "kvindex", "tonic-whole-mt", ids));
    }
    if let Some(only) = std::env::var("WIRE_ROWS").ok().filter(|rows| !rows.is_empty()) {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        rows.retain(|r| only.contains(&r.name));
    }
    rows
}

/// One run of `row`: paced p50, p99, closed p50, p99 (µs), switches and CPU µs per paced request
/// (both processes).
fn run(row: &Row, paced: usize, closed: usize, pace: Duration) -> [f64; 6] {
    let server = Server::start(row.server);
    let rest = ScoreTokensRequest { model: MODEL.into(), ..Default::default() };
    let prompt: Arc<Vec<u32>> = Arc::new((0..row.ids as u32).map(|i| (i * 31 + 7) % 151_000).collect());
    let query = ScoreQuery::new(rest, prompt);
    let (p, c, (switches, cpu)) = if row.client == "tcp" {
        tcp_client(server.addr(), server.pid(), &query.encode_to_vec(), paced, closed, pace)
    } else {
        grpc_client(row.client, server.addr(), server.pid(), query, paced, closed, pace)
    };
    let n = paced.max(1) as f64;
    let (switches, cpu) = (switches as f64 / n, cpu / n * 1e6);
    [quantile(&p, 0.5), quantile(&p, 0.99), quantile(&c, 0.5), quantile(&c, 0.99), switches, cpu]
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    if let Ok(kind) = std::env::var(SERVE_ENV) {
        return serve(&kind);
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let ids = env_usize("WIRE_IDS", 8_800);
    let (paced, closed) = (env_usize("WIRE_PACED", 1_000), env_usize("WIRE_CLOSED", 2_000));
    let pace = Duration::from_micros(env_usize("WIRE_PACE_US", 5_000) as u64);
    let rounds = env_usize("WIRE_ROUNDS", 1).max(1);
    let rows = rows(ids);
    println!(
        "ScoreTokens' round trip by layer: {ids} ids; {paced} paced requests ({} µs apart) then {closed} back to back, one at a time; {rounds} round(s); load {}; {} cores",
        pace.as_micros(),
        load(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut figures: Vec<Vec<[f64; 6]>> = rows.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (row, figures) in rows.iter().zip(&mut figures) {
            figures.push(run(row, paced, closed, pace));
        }
        eprintln!("round {} done, load {}", round + 1, load());
    }
    println!("| row (client/server) | ids | paced p50 µs | paced p99 µs | closed p50 µs | closed p99 µs | paced: switches / req | paced: CPU µs / req |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (row, figures) in rows.iter().zip(&figures) {
        let m: Vec<f64> = (0..6).map(|i| median(&figures.iter().map(|f| f[i]).collect::<Vec<_>>())).collect();
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} |",
            row.name, row.ids, m[0], m[1], m[2], m[3], m[4], m[5]
        );
    }
    println!("load after: {}", load());
}
