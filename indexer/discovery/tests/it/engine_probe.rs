//! The engine probe against real sockets: scripted HTTP/1.1 peers on loopback (raw tokio TCP,
//! no HTTP library of ours on their side) answering `/server_info` and `/get_server_info` the
//! ways a pod can: SGLang (each path), vLLM (404), an error, a declared or an endless body over
//! the cap, HTML, silence. Then the watcher with probing on: a pod is told once, already as
//! SGLang; a pod deleted while its probe stalls is never told (nor removed); the first list is
//! passed on only once its probed pod is told.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex::wire::Engine;
use kvindex_discovery::engine_probe::{probe, ProbeOutcome, MAX_BODY_BYTES};
use kvindex_discovery::fake_api::{pod, FakeApiServer};
use kvindex_discovery::settings::ENGINE_ANNOTATION;
use kvindex_discovery::Settings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::watcher::Watching;

/// How a scripted peer answers one path.
#[derive(Clone, Copy)]
enum Answer {
    Json(&'static str),
    Status(u16),
    DeclaredHuge,
    Endless,
    Html,
    Silence,
}

fn shape(name: &str) -> &'static str {
    let path = format!("{}/../../testdata/sglang-server-info/{name}", env!("CARGO_MANIFEST_DIR"));
    Box::leak(std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).into_boxed_str())
}

/// Serves `answer(path)` on `ip`, port `port` (0: any); returns the address.
async fn peer(ip: &str, port: u16, answer: fn(&str) -> Answer) -> SocketAddr {
    counted_peer(ip, port, answer).await.0
}

/// [`peer`], with the count of connections it accepted.
async fn counted_peer(ip: &str, port: u16, answer: fn(&str) -> Answer) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((ip, port)).await.expect("bind a scripted peer");
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream, answer));
        }
    });
    (addr, accepted)
}

async fn serve(mut stream: TcpStream, answer: fn(&str) -> Answer) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&byte[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    let reply = |status: &str, body: &str| {
        format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
    };
    let text = match answer(&path) {
        Answer::Json(body) => reply("200 OK", body),
        Answer::Status(404) => reply("404 Not Found", "{\"detail\":\"Not Found\"}"),
        Answer::Status(code) => reply(&format!("{code} Error"), ""),
        Answer::Html => reply("200 OK", "<html><body>hello</body></html>"),
        Answer::DeclaredHuge => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{{", 2 * MAX_BODY_BYTES),
        Answer::Endless => {
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").await;
            let chunk = format!("{:x}\r\n{}\r\n", 65536, "x".repeat(65536));
            while stream.write_all(chunk.as_bytes()).await.is_ok() {}
            return;
        }
        Answer::Silence => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        }
    };
    let _ = stream.write_all(text.as_bytes()).await;
}

async fn probe_of(answer: fn(&str) -> Answer) -> ProbeOutcome {
    let addr = peer("127.0.0.1", 0, answer).await;
    probe(addr.ip(), addr.port(), Duration::from_secs(5)).await
}

#[tokio::test]
async fn a_probe_tells_sglang_from_vllm_and_bounds_every_other_answer() {
    let ProbeOutcome::Sglang(d) = probe_of(|_| Answer::Json(shape("0.5.23-dp-attention.json"))).await else {
        panic!("SGLang 0.5.23")
    };
    assert_eq!((d.version.as_deref(), d.page_size, d.dp_size), (Some("0.5.23"), Some(64), Some(4)));
    // An older release that only serves the deprecated path.
    let old = |path: &str| match path {
        "/get_server_info" => Answer::Json(shape("0.5.10.json")),
        _ => Answer::Status(404),
    };
    let ProbeOutcome::Sglang(d) = probe_of(old).await else { panic!("SGLang on /get_server_info") };
    assert_eq!(d.version.as_deref(), Some("0.5.10"));
    assert_eq!(probe_of(|_| Answer::Status(404)).await, ProbeOutcome::NotSglang, "vLLM");
    assert_eq!(probe_of(|_| Answer::Status(500)).await.label(), "bad_status");
    assert_eq!(probe_of(|_| Answer::Html).await.label(), "bad_body");
    assert_eq!(probe_of(|_| Answer::DeclaredHuge).await.label(), "too_large");
    assert_eq!(probe_of(|_| Answer::Endless).await.label(), "too_large");

    let addr = peer("127.0.0.1", 0, |_| Answer::Silence).await;
    let started = Instant::now();
    assert_eq!(probe(addr.ip(), addr.port(), Duration::from_millis(300)).await.label(), "timeout");
    assert!(started.elapsed() < Duration::from_secs(5), "the wall clock holds: {:?}", started.elapsed());

    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap(); // dropped: refused
    assert_eq!(probe(closed.ip(), closed.port(), Duration::from_secs(5)).await.label(), "unreachable");
}

#[tokio::test]
async fn the_watcher_tells_a_probed_pod_once_as_sglang_and_never_a_pod_gone_while_held() {
    let sglang = peer("127.0.0.1", 0, |_| Answer::Json(shape("0.5.19.json"))).await;
    let port = sglang.port();
    let (_, stalled_probes) = counted_peer("127.0.0.2", port, |_| Answer::Silence).await;
    let api = FakeApiServer::start("inference").await;
    api.apply(pod("sglang-0", "Running", true, Some("127.0.0.1"), &[]));
    let settings = Settings { http_port: port, engine_probe: Some(Duration::from_secs(30)), ..Settings::default() };
    let mut w = Watching::start(&api, settings).await;
    w.until("the first list", |w| w.syncs == 1).await;
    let id = format!("127.0.0.1:{port}");
    let told = w.held.get(&id).expect("the list is passed on with its probed pod told");
    assert_eq!((told.engine, told.page_size, told.dp_size), (Some(Engine::Sglang), Some(8), 2));
    assert_eq!((told.pub_port, told.replay_port, told.engine_version.as_deref()), (5557, Some(5570), Some("0.5.19")));

    // A pod whose probe stalls, deleted while held: never told, and so never removed (Watching
    // fails on a removal of a pod it does not hold).
    api.apply(pod("stalled-0", "Running", true, Some("127.0.0.2"), &[]));
    let deadline = Instant::now() + Duration::from_secs(20);
    while stalled_probes.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the stalled pod was never probed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    api.delete("stalled-0");
    api.apply(pod("vllm-0", "Running", true, Some("127.0.0.3"), &[(ENGINE_ANNOTATION, "vllm")]));
    w.until("the annotated vLLM pod, told at once", |w| w.held.len() == 2).await;
    let stalled = format!("127.0.0.2:{port}");
    assert!(!w.held.contains_key(&stalled), "{:?}", w.ids());
    assert_eq!(w.held[&format!("127.0.0.3:{port}")].engine, Some(Engine::Vllm));
    api.delete("sglang-0");
    w.until("the SGLang pod removed as told", |w| w.held.len() == 1).await;
}
