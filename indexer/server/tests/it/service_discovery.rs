//! Kubernetes pod discovery end to end: the `kvindex` binary (`serve --discovery kubernetes`)
//! watching a fake API server on loopback, and an independent pyzmq/msgspec publisher as the
//! pod's engine. A pod that becomes Ready is dialled and its blocks are scored; NotReady clears
//! it (score 0) at once; Ready again re-dials it; deletion unregisters it. The discovered pod
//! is an operator pod: the registration API cannot remove it, and an API registration of the
//! same id is taken over. In central mode (engines dial
//! us) discovery supplies the replay endpoint a gap is replayed from, and NotReady clears.

use crate::support::*;
use kvindex_discovery::fake_api::{pod, FakeApiServer};
use serde_json::json;

const MODEL: &str = "m";

/// `kvindex serve` with discovery on the fake API server's namespace `llm`, `extra` flags, and
/// the model from the environment (`KVINDEX_DISCOVERY_MODEL`).
fn start(api: &FakeApiServer, extra: &[&str]) -> ServeProcess {
    let token = admin_token_file();
    let url = api.url();
    let mut args = vec!["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--block-size", "16"];
    args.extend(["--admin-token-file", token.to_str().unwrap(), "--discovery", "kubernetes"]);
    args.extend(["--discovery-api-server", &url, "--discovery-namespace", "llm"]);
    args.extend_from_slice(extra);
    kvindex_serve().args(&args).env("KVINDEX_DISCOVERY_MODEL", MODEL).start().expect("kvindex serve")
}

#[test]
fn service_discovered_pod_is_scored_while_ready_and_cleared_when_not() {
    let Some(py) = python() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let api = runtime.block_on(FakeApiServer::start("llm"));
    let (pub_port, http_port) = (free_port(), free_port());
    let (pub_port_s, http_port_s) = (pub_port.to_string(), http_port.to_string());
    let ports = ["--discovery-pub-port", &pub_port_s, "--discovery-http-port", &http_port_s];
    let server = start(&api, &[&ports[..], &["--discovery-replay-port", "0"]].concat());
    let pod_id = format!("127.0.0.1:{http_port}");
    wait_until("ready after the first (empty) list", 30, || (server.get("/readyz").0 == 200).then_some(()));

    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let endpoint = format!("tcp://127.0.0.1:{pub_port}");
    let topic = format!("kv@{pod_id}@{MODEL}");
    peer.cmd(json!({"op": "pub_start", "name": "e", "pod": pod_id, "bind": endpoint, "topic": topic}));

    // An API registration of the same pod id (pointing elsewhere) is taken over by discovery.
    let elsewhere = format!("tcp://127.0.0.1:{}", free_port());
    let body = json!({"pod": pod_id, "model": MODEL, "endpoint": elsewhere}).to_string();
    assert_eq!(server.http("POST", "/pods", Some(&body)).0, 200);
    // Running but not Ready: not dialled.
    api.apply(pod("vllm-0", "Running", false, Some("127.0.0.1"), &[]));
    api.apply(pod("vllm-0", "Running", true, Some("127.0.0.1"), &[]));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["e"]}))["subscribed"], true, "the pod is dialled");
    for k in 0..2 {
        peer.cmd(json!({"op": "store", "name": "e", "chain": format!("c{k}"), "tokens": chain(k, 4)}));
    }
    peer.wait_exact(&server, &["e"], MODEL, "EXACT", 30);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), &pod_id), (4, "EXACT".to_string()));
    let registered = server.sources()["registered_pods"].clone();
    assert_eq!(registered[0]["origin"], "discovery", "{registered}");
    assert_eq!(registered[0]["endpoint"], endpoint.as_str());
    assert_eq!(server.metric("kvindex_discovery_pods", &[]), 1.0);
    let (status, _) = server.http("DELETE", &format!("/pods/{pod_id}"), None);
    assert_eq!(status, 409, "a discovered pod is the operator's");

    // NotReady: cleared, with nothing published.
    api.apply(pod("vllm-0", "Running", false, Some("127.0.0.1"), &[]));
    wait_until("cleared on NotReady", 20, || {
        (0..2).all(|k| peer.score_pod(MODEL, &chain(k, 4), &pod_id).0 == 0).then_some(())
    });
    assert!(server.sources()["registered_pods"].as_array().unwrap().is_empty());

    // Ready again: dialled again; new blocks are scored, the old ones stay gone.
    api.apply(pod("vllm-0", "Running", true, Some("127.0.0.1"), &[]));
    wait_until("re-registered", 20, || (!server.sources()["registered_pods"].as_array()?.is_empty()).then_some(()));
    // Until the new connection has subscribed, the publisher drops what it sends: resend.
    wait_until("scored again", 20, || {
        peer.cmd(json!({"op": "store", "name": "e", "chain": "c5", "tokens": chain(5, 4)}));
        (peer.score_pod(MODEL, &chain(5, 4), &pod_id).0 == 4).then_some(())
    });
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), &pod_id).0, 0, "blocks from before the NotReady stay gone");

    // Deleted: unregistered and cleared.
    api.delete("vllm-0");
    wait_until("cleared on delete", 20, || (peer.score_pod(MODEL, &chain(5, 4), &pod_id).0 == 0).then_some(()));
    assert_eq!(server.metric("kvindex_discovery_pods", &[]), 0.0);
    assert!(server.metric("kvindex_discovery_changes_total", &["op=\"remove\""]) >= 2.0);
}

#[test]
fn service_central_mode_replays_from_the_discovered_endpoint_and_clears_on_not_ready() {
    let Some(py) = python() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let api = runtime.block_on(FakeApiServer::start("llm"));
    let (replay_port, http_port) = (free_port(), free_port());
    let (replay_port_s, http_port_s) = (replay_port.to_string(), http_port.to_string());
    let server = start(
        &api,
        &[
            "--zmq-bind",
            "tcp://127.0.0.1:0",
            "--discovery-replay-port",
            &replay_port_s,
            "--discovery-http-port",
            &http_port_s,
        ],
    );
    let pod_id = format!("127.0.0.1:{http_port}");
    let replay = format!("tcp://127.0.0.1:{replay_port}");
    api.apply(pod("vllm-0", "Running", true, Some("127.0.0.1"), &[]));
    let registered = wait_until("the pod registered", 30, || {
        server.sources()["registered_pods"].as_array().and_then(|p| p.first().cloned())
    });
    assert_eq!(
        (registered["endpoint"].is_null(), registered["replay_endpoint"].as_str()),
        (true, Some(replay.as_str()))
    );

    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let topic = format!("kv@{pod_id}@{MODEL}");
    let zmq = server.zmq.clone().expect("central mode");
    peer.cmd(json!({"op": "pub_start", "name": "c", "pod": pod_id, "connect": zmq, "topic": topic, "replay": replay}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["c"]}))["subscribed"], true);
    // seq 0 is only in the engine's replay buffer: the indexer first sees seq 1 and replays.
    peer.cmd(json!({"op": "store", "name": "c", "chain": "c0", "tokens": chain(0, 4), "drop": true}));
    peer.cmd(json!({"op": "store", "name": "c", "chain": "c1", "tokens": chain(1, 4)}));
    peer.wait_exact(&server, &["c"], MODEL, "EXACT", 30);
    assert_eq!(peer.score_pod(MODEL, &chain(0, 4), &pod_id), (4, "EXACT".to_string()), "replayed");

    api.apply(pod("vllm-0", "Running", false, Some("127.0.0.1"), &[]));
    wait_until("cleared on NotReady", 20, || {
        (0..2).all(|k| peer.score_pod(MODEL, &chain(k, 4), &pod_id).0 == 0).then_some(())
    });
}

#[test]
fn service_a_pod_the_operator_configured_is_left_as_configured_by_discovery() {
    // Static > discovered: a Ready pod whose id `--pod` already names is not taken over (its
    // endpoint stays the configured one), and the refusal is counted.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let api = runtime.block_on(FakeApiServer::start("llm"));
    let http_port = free_port();
    let pod_id = format!("127.0.0.1:{http_port}");
    let configured = format!("tcp://127.0.0.1:{}", free_port());
    let flag = format!("{pod_id},{MODEL},{configured}");
    let http_port_s = http_port.to_string();
    let server = start(&api, &["--discovery-http-port", &http_port_s, "--discovery-replay-port", "0", "--pod", &flag]);
    wait_until("ready after the first (empty) list", 30, || (server.get("/readyz").0 == 200).then_some(()));

    api.apply(pod("vllm-0", "Running", true, Some("127.0.0.1"), &[]));
    let denied = ["api=\"discovery\"", "reason=\"operator_pod\""];
    wait_until("discovery saw the pod and left it", 20, || {
        (server.metric("kvindex_control_denied_total", &denied) >= 1.0).then_some(())
    });
    let registered = server.sources()["registered_pods"].clone();
    assert_eq!(registered.as_array().map(Vec::len), Some(1), "{registered}");
    assert_eq!(registered[0]["origin"], "config", "{registered}");
    assert_eq!(registered[0]["endpoint"], configured.as_str(), "{registered}");

    // Its deletion is not discovery's to act on either. Changes are applied in order, so once
    // a pod discovered after it is registered, the deletion has been dealt with.
    api.delete("vllm-0");
    api.apply(pod("vllm-1", "Running", true, Some("127.0.0.2"), &[]));
    let other = format!("127.0.0.2:{http_port}");
    let registered = wait_until("the next discovered pod registered", 20, || {
        let registered = server.sources()["registered_pods"].clone();
        registered.as_array()?.iter().any(|p| p["pod"] == other.as_str()).then_some(registered)
    });
    let configured_pod = registered.as_array().unwrap().iter().find(|p| p["pod"] == pod_id.as_str()).cloned();
    assert_eq!(configured_pod.map(|p| p["origin"].clone()), Some(json!("config")), "{registered}");
}
