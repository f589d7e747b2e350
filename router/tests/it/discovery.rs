//! Kubernetes pod discovery makes the fleet: the `kvindex-router` binary watching a fake API
//! server on loopback routes to a pod once it is Running and Ready, one entry per DP rank,
//! follows it to a new IP, and drops it when NotReady or deleted (no pods: not ready).

use std::path::PathBuf;

use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use kvindex_discovery::fake_api::{pod, FakeApiServer};
use kvindex_discovery::settings::DP_SIZE_ANNOTATION;
use serde_json::json;

async fn ids(router: &str) -> Vec<String> {
    let pods = get(router, "/debug/pods").await.json();
    pods["pods"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap().to_string()).collect()
}

async fn wait_ids(router: &str, what: &str, expected: &[String]) {
    wait_for(what, DEADLINE, || async { (ids(router).await == expected).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_pods_are_the_fleet() {
    let engine = FakePod::start(Script::Echo("engine".into())).await;
    let port = engine.addr.rsplit_once(':').unwrap().1.to_string();
    let api = FakeApiServer::start("llm").await;
    api.apply(pod("vllm-0", "Running", true, Some("127.0.0.1"), &[]));
    let args = ["--discovery", "kubernetes", "--discovery-api-server", &api.url(), "--discovery-namespace", "llm"]
        .into_iter()
        .chain(["--discovery-http-port", &port])
        .map(String::from)
        .collect::<Vec<_>>();
    let router = RouterProcess::start(&PathBuf::from(env!("CARGO_BIN_EXE_kvindex-router")), &args).expect("router");
    let public = router.http.clone();
    wait_ids(&public, "the listed pod", std::slice::from_ref(&engine.addr)).await;
    let reply = post(&public, "/v1/completions", &json!({"model": "m", "prompt": [1, 2, 3]})).await;
    assert_eq!((reply.status, reply.json()["pod"].as_str()), (200, Some("engine")), "{:?}", reply.body);
    assert_eq!(get(&public, "/readyz").await.status, 200);

    // Two DP ranks: two pods, rank 1 on the next port.
    api.apply(pod("vllm-0", "Running", true, Some("127.0.0.1"), &[(DP_SIZE_ANNOTATION, "2")]));
    let rank1 = format!("127.0.0.1:{}", port.parse::<u16>().unwrap() + 1);
    wait_ids(&public, "two ranks", &[engine.addr.clone(), rank1]).await;

    api.apply(pod("vllm-0", "Running", false, Some("127.0.0.1"), &[]));
    wait_ids(&public, "NotReady removes the pod", &[]).await;
    assert_eq!(get(&public, "/readyz").await.status, 503, "no pods");

    api.apply(pod("vllm-0", "Running", true, Some("127.0.0.2"), &[]));
    wait_ids(&public, "the pod on its new IP", &[format!("127.0.0.2:{port}")]).await;
    api.delete("vllm-0");
    wait_ids(&public, "deletion removes the pod", &[]).await;
}
