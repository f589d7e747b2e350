//! A discovered pod's engine, end to end: `kvindex serve --discovery kubernetes` on the fake API
//! server, with each pod's HTTP port served by an independent Python http.server
//! (`tests/python/server_info_peer.py`): an SGLang pod answering `/server_info` (a shape from
//! `testdata/sglang-server-info/`) is registered as `sglang` with the descriptor's page size,
//! ranks and publisher ports; a vLLM pod (404) keeps the default engine; a pod that never answers
//! and one whose body never ends do not hold up the others and fall back to the default once
//! their probe gives up; annotations name the engine without any HTTP server.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::support::*;
use kvindex_discovery::fake_api::{pod, FakeApiServer};
use serde_json::{json, Value};

/// One pod's HTTP port, killed when dropped.
struct HttpPeer(Child);

impl HttpPeer {
    fn start(py: &std::path::Path, host: &str, port: u16, mode: &str, body: Option<&std::path::Path>) -> HttpPeer {
        let script = workspace().join("indexer/server/tests/python/server_info_peer.py");
        let mut command = Command::new(py);
        command.arg(script).arg(host).arg(port.to_string()).arg(mode);
        if let Some(body) = body {
            command.arg(body);
        }
        let mut child = command.stdout(Stdio::piped()).spawn().expect("start server_info_peer.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("read the peer's ready line");
        assert_eq!(line.trim(), "ready", "server_info_peer.py {mode} did not start");
        HttpPeer(child)
    }
}

impl Drop for HttpPeer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn registered(server: &ServeProcess, pod_id: &str) -> Option<Value> {
    server.sources()["registered_pods"].as_array()?.iter().find(|p| p["pod"] == pod_id).cloned()
}

fn probes(server: &ServeProcess, outcome: &str) -> f64 {
    server.metric("kvindex_discovery_engine_probes_total", &[&format!("outcome=\"{outcome}\"")])
}

#[test]
fn service_discovery_learns_each_pods_engine_from_server_info_or_annotations_and_never_stalls() {
    let Some(py) = python() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let api = runtime.block_on(FakeApiServer::start("llm"));
    let (http_port, pub_base, replay_base, flag_pub) = (free_port(), free_port(), free_port(), free_port());

    // SGLang 0.5.23's shape, its publisher on this test's ports: 2 ranks, pages of 16.
    let shape = workspace().join("testdata/sglang-server-info/0.5.23-dp-attention.json");
    let mut info: Value = serde_json::from_slice(&std::fs::read(shape).unwrap()).unwrap();
    info["kv_events"]["endpoint_port_base"] = json!(pub_base);
    info["kv_events"]["replay_endpoint_port_base"] = json!(replay_base);
    info["kv_events"]["dp_size"] = json!(2);
    info["kv_events"]["block_size"] = json!(16);
    let body = std::env::temp_dir().join(format!("kvindex-server-info-{}.json", std::process::id()));
    std::fs::write(&body, serde_json::to_vec(&info).unwrap()).unwrap();
    let _sglang = HttpPeer::start(&py, "127.0.0.1", http_port, "sglang", Some(&body));
    let _vllm = HttpPeer::start(&py, "127.0.0.2", http_port, "vllm", None);
    let _slow = HttpPeer::start(&py, "127.0.0.3", http_port, "slow", None);
    let _huge = HttpPeer::start(&py, "127.0.0.4", http_port, "huge", None);

    let token = admin_token_file();
    let (url, http_port_s, flag_pub_s) = (api.url(), http_port.to_string(), flag_pub.to_string());
    let server = kvindex_serve()
        .args([
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--block-size",
            "16",
            "--admin-token-file",
            token.to_str().unwrap(),
            "--discovery",
            "kubernetes",
            "--discovery-api-server",
            &url,
            "--discovery-namespace",
            "llm",
            "--discovery-http-port",
            &http_port_s,
            "--discovery-pub-port",
            &flag_pub_s,
            "--discovery-replay-port",
            "0",
            // Long enough that the stalled pod is still held while every other pod is registered.
            "--discovery-engine-probe-timeout-ms",
            "15000",
        ])
        .env("KVINDEX_DISCOVERY_MODEL", "m")
        .start()
        .expect("kvindex serve");
    wait_until("ready after the first (empty) list", 30, || (server.get("/readyz").0 == 200).then_some(()));

    // The stalled pod first: the pods after it are not held up behind it.
    api.apply(pod("slow-0", "Running", true, Some("127.0.0.3"), &[]));
    api.apply(pod("huge-0", "Running", true, Some("127.0.0.4"), &[]));
    api.apply(pod("sglang-0", "Running", true, Some("127.0.0.1"), &[]));
    api.apply(pod("vllm-0", "Running", true, Some("127.0.0.2"), &[]));
    // Annotated: no HTTP server at all, the annotations say.
    let annotated = [("kvindex.io/engine", "sglang"), ("kvindex.io/page-size", "4")];
    api.apply(pod("sglang-1", "Running", true, Some("127.0.0.5"), &annotated));
    api.apply(pod("trtllm-0", "Running", true, Some("127.0.0.6"), &[("kvindex.io/engine", "trtllm")]));

    let id = |ip: &str| format!("{ip}:{http_port}");
    let others = ["127.0.0.1", "127.0.0.2", "127.0.0.4", "127.0.0.5", "127.0.0.6"];
    wait_until("every pod but the stalled one registered", 60, || {
        others.iter().all(|ip| registered(&server, &id(ip)).is_some()).then_some(())
    });
    assert_eq!(registered(&server, &id("127.0.0.3")), None, "the stalled pod is still held, alone");

    let sglang = registered(&server, &id("127.0.0.1")).unwrap();
    assert_eq!((sglang["engine"].as_str(), sglang["page_size"].as_u64()), (Some("sglang"), Some(16)), "{sglang}");
    assert_eq!(sglang["dp_size"], 2, "{sglang}");
    assert_eq!(sglang["endpoint"], format!("tcp://127.0.0.1:{pub_base}").as_str(), "{sglang}");
    assert_eq!(sglang["replay_endpoint"], format!("tcp://127.0.0.1:{replay_base}").as_str(), "{sglang}");
    assert_eq!(sglang["origin"], "discovery");
    for ip in ["127.0.0.2", "127.0.0.4"] {
        let p = registered(&server, &id(ip)).unwrap();
        assert!(p["engine"].is_null() && p["page_size"].is_null(), "the default engine: {p}");
        assert_eq!(p["endpoint"], format!("tcp://{ip}:{flag_pub}").as_str(), "the configured ports: {p}");
    }
    let annotated = registered(&server, &id("127.0.0.5")).unwrap();
    assert_eq!((annotated["engine"].as_str(), annotated["page_size"].as_u64()), (Some("sglang"), Some(4)));
    assert_eq!(registered(&server, &id("127.0.0.6")).unwrap()["engine"], "trtllm");
    assert_eq!(probes(&server, "sglang"), 1.0);
    assert_eq!(probes(&server, "not_sglang"), 1.0);
    assert_eq!(probes(&server, "too_large"), 1.0, "a body that never ends is cut at the cap");
    assert_eq!(probes(&server, "unreachable"), 1.0, "the annotated SGLang pod has no HTTP server");

    // The stalled pod gives up at its timeout and goes on with the default engine.
    let slow = wait_until("the stalled pod registered after its probe timed out", 60, || {
        registered(&server, &id("127.0.0.3"))
    });
    assert!(slow["engine"].is_null(), "{slow}");
    assert_eq!(probes(&server, "timeout"), 1.0);

    // A restart (NotReady, then Ready) probes the pod again.
    api.apply(pod("sglang-0", "Running", false, Some("127.0.0.1"), &[]));
    wait_until("unregistered on NotReady", 20, || registered(&server, &id("127.0.0.1")).is_none().then_some(()));
    api.apply(pod("sglang-0", "Running", true, Some("127.0.0.1"), &[]));
    let again = wait_until("registered again", 30, || registered(&server, &id("127.0.0.1")));
    assert_eq!(again["engine"], "sglang");
    assert_eq!(probes(&server, "sglang"), 2.0);
    let _ = std::fs::remove_file(&body);
}
