//! What the router's integration tests share: the real binaries (`kvindex serve` through the
//! testkit's launcher, `kvindex-sim` and `kvindex-router` through the loadtest crate's), an HTTP
//! client that keeps headers and streamed chunks, and scripted fake pods for the behaviours a
//! simulator cannot be asked for (a recorded stream replayed byte for byte, a pod that hangs,
//! dies before answering, or dies mid-stream), and a real Envoy running the configs `deploy/`
//! ships.
#![allow(dead_code, unused_imports)]

pub mod envoy;
pub mod ext_proc;
pub mod fake_pod;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
pub use kvindex_loadtest::kvindex_service::{sim_next_seq, KvindexService};
pub use kvindex_loadtest::process::{required_binary, ChildProcess, RouterProcess, SimFleet, SimPod};
pub use kvindex_testkit::serve::{Serve, Serving};
use serde_json::Value;

pub const DEADLINE: Duration = Duration::from_secs(30);
pub const BLOCK: usize = 16;

/// The three binaries the router's tests run (the other two are built on demand when a test
/// of this crate runs alone).
pub struct Bins {
    pub kvindex: PathBuf,
    pub sim: PathBuf,
    pub router: PathBuf,
}

pub fn bins() -> Bins {
    Bins {
        kvindex: required_binary("kvindex", "KVINDEX_BIN"),
        sim: required_binary("kvindex-sim", "KVINDEX_SIM_BIN"),
        router: PathBuf::from(env!("CARGO_BIN_EXE_kvindex-router")),
    }
}

/// The deepseek tokenizer fixture (129k vocabulary, chat template), or `None` (skipped, failed
/// under CI).
pub fn deepseek_dir() -> Option<PathBuf> {
    kvindex_testkit::env::deepseek_tokenizer()
}

/// `kvindex serve` and a `kvindex-sim` fleet dialing it, every pod registered with its replay
/// endpoint.
pub struct Stack {
    pub kv: KvindexService,
    pub sim: SimFleet,
}

impl Stack {
    pub async fn start(bins: &Bins, pods: usize, sim_args: &[&str]) -> Stack {
        let kv = KvindexService::start(&bins.kvindex, BLOCK).expect("kvindex serve");
        let mut args = vec!["--zmq-connect", &kv.zmq_endpoint, "--http-base-port", "0", "--replay-base-port", "0"];
        args.extend_from_slice(sim_args);
        let sim = SimFleet::start(&bins.sim, pods, &args).expect("kvindex-sim");
        for pod in &sim.pods {
            let model = sim_args.windows(2).find(|w| w[0] == "--model").map_or("sim/model", |w| w[1]);
            kv.register_pod(&pod.pod_id, model, pod.replay.as_deref()).await.expect("register pod");
        }
        Stack { kv, sim }
    }

    /// Waits until the indexer applied everything every pod published so far.
    pub async fn settle(&self) {
        for pod in &self.sim.pods {
            let next = sim_next_seq(&pod.http).await.expect("sim stats");
            self.kv.wait_applied(&pod.pod_id, next, DEADLINE).await.expect("indexer caught up");
        }
    }

    /// `--indexer … --pod …` for a router in front of this stack, with the indexer's admin
    /// token (RecordRoute needs it).
    pub fn router_args(&self) -> Vec<String> {
        let mut args = vec!["--indexer".to_string(), self.kv.grpc_addr.clone()];
        args.push("--indexer-admin-token-file".into());
        args.push(self.kv.admin_token_file().to_string_lossy().into_owned());
        for pod in &self.sim.pods {
            args.push("--pod".into());
            args.push(pod.router_spec());
        }
        args
    }

    pub fn pod(&self, id: &str) -> &SimPod {
        self.sim.pods.iter().find(|p| p.pod_id == id).expect("known pod")
    }
}

pub fn router(bins: &Bins, args: &[String]) -> RouterProcess {
    RouterProcess::start(&bins.router, args).expect("kvindex-router")
}

/// An HTTP response read to the end.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `x-kvindex-pod` header.
    pub fn pod(&self) -> &str {
        self.header("x-kvindex-pod").unwrap_or_else(|| panic!("no x-kvindex-pod: {} {:?}", self.status, self.body))
    }

    pub fn cached_tokens(&self) -> u64 {
        self.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens")
    }

    pub fn prompt_tokens(&self) -> u64 {
        self.json()["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens")
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A request; `body` = `None` sends a GET.
pub async fn request(addr: &str, method: &str, path: &str, body: Option<Bytes>, headers: &[(&str, &str)]) -> Reply {
    let mut builder = hyper::Request::builder().method(method).uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    if body.is_some() {
        builder = builder.header("content-type", "application/json");
    }
    let request = builder.body(Full::new(body.unwrap_or_default())).expect("request");
    let response = client().request(request).await.unwrap_or_else(|e| panic!("{method} {addr}{path}: {e:?}"));
    let (head, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply { status: head.status.as_u16(), headers: head.headers, body }
}

/// A POST of `size` bytes sent chunked (no `Content-Length`, so only whoever buffers the body
/// finds it too large), 1 MiB a chunk; the reply is read even when it comes before the body is
/// all sent, as an over-limit answer does.
pub async fn post_chunked(addr: &str, path: &str, size: usize) -> Reply {
    const CHUNK: usize = 1 << 20;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("{addr}: {e}"));
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
    // Ends with an error when the peer answers and closes mid-body: expected here.
    tokio::spawn(connection);
    let chunks = (0..size.div_ceil(CHUNK)).map(move |i| {
        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from(vec![
            b'x';
            CHUNK.min(size - i * CHUNK)
        ])))
    });
    let request = hyper::Request::post(path)
        .header("host", addr)
        .header("content-type", "application/json")
        .body(http_body_util::StreamBody::new(tokio_stream::iter(chunks)))
        .expect("request");
    let response = sender.send_request(request).await.unwrap_or_else(|e| panic!("chunked POST {addr}{path}: {e:?}"));
    let (head, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply { status: head.status.as_u16(), headers: head.headers, body }
}

pub async fn post(addr: &str, path: &str, body: &Value) -> Reply {
    request(addr, "POST", path, Some(Bytes::from(body.to_string())), &[]).await
}

pub async fn get(addr: &str, path: &str) -> Reply {
    request(addr, "GET", path, None, &[]).await
}

/// Polls a condition until it returns `Some`, failing the test at the deadline.
#[allow(unused_imports)] // not every test binary that includes this module waits
pub use kvindex_testkit::wait::until_async as wait_for;

/// The router's view of one pod (`/debug/pods`).
pub async fn router_pod(router: &str, id: &str) -> Value {
    let pods = get(router, "/debug/pods").await.json();
    pods["pods"].as_array().and_then(|p| p.iter().find(|p| p["id"] == id).cloned()).unwrap_or(Value::Null)
}

/// Waits until every listed pod has been scraped by the router.
pub async fn wait_scraped(router: &str, ids: &[String]) {
    for id in ids {
        wait_for("the router to scrape the pod", DEADLINE, || async move {
            router_pod(router, id).await["load"]["scrape_age_ms"].as_u64().map(|_| ())
        })
        .await;
    }
}

/// A metric's value summed over label sets whose text contains every `labels` fragment.
pub async fn metric(addr: &str, name: &str, labels: &[&str]) -> f64 {
    kvindex_testkit::prometheus::sum(&String::from_utf8_lossy(&get(addr, "/metrics").await.body), name, labels)
}
