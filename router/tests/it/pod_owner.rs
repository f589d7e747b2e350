//! One pod, one owner, end to end: a publisher at another address (127.0.0.2) that names a
//! `kvindex-sim` pod through DP naming (topic id `host:(port - 1)` with DP rank 1 is pod
//! `host:port`) used to credit that pod with blocks it never held, and the router sent every new
//! prompt to it, predicting cached tokens the pod then did not serve. Now the indexer refuses
//! the other stream, and no prediction exceeds what the pod's own `cached_tokens` says.
//!
//! Independent peers: the attacker is the server crate's pyzmq publisher
//! (`indexer/server/tests/python/kvpeer.py`, vLLM's frames), the pods are `kvindex-sim`
//! processes, the indexer and the router their own binaries.

use std::path::PathBuf;
use std::process::Command;

use crate::support::*;
use kvindex_testkit::json_peer::JsonPeer;
use serde_json::json;

const MODEL: &str = "sim/model";

/// The pyzmq publisher, or `None` (skipped, failed under CI) without the test venv.
fn publisher_peer() -> Option<JsonPeer> {
    let python = kvindex_testkit::env::python_with(&["zmq", "msgspec", "grpc", "grpc_tools"])?;
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut command = Command::new(python);
    command.arg(root.join("indexer/server/tests/python/kvpeer.py")).arg(root.join("proto/kvindex/v1/indexer.proto"));
    Some(JsonPeer::start(&mut command))
}

/// Prompt `n`: 48 tokens, three blocks of 16.
fn tokens(n: u32) -> Vec<u32> {
    (0..48).map(|i| 50_000 + 1000 * n + i).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_streams_blocks_never_steer_the_router_to_a_pod() {
    let Some(mut peer) = publisher_peer() else { return };
    let bins = bins();
    let stack = Stack::start(&bins, 2, &["--model", MODEL, "--time-scale", "100"]).await;
    let router = router(&bins, &stack.router_args());
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&router.http, &ids).await;
    let victim = &stack.sim.pods[0].pod_id;
    let (host, port) = victim.rsplit_once(':').unwrap();
    let topic = format!("kv@{host}:{}@{MODEL}", port.parse::<u16>().unwrap() - 1);
    let connect = format!("tcp://127.0.0.2:0;{}", stack.kv.zmq_endpoint.trim_start_matches("tcp://"));
    peer.cmd(
        json!({"op": "pub_start", "name": "evil", "pod": victim, "connect": connect, "topic": topic, "dp_rank": 1}),
    );
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["evil"]}))["subscribed"], true);
    let prompts = 20;
    for n in 0..prompts {
        peer.cmd(json!({"op": "store", "name": "evil", "chain": format!("p{n}"), "tokens": tokens(n)}));
    }
    // Every store refused (or, before, the last one credited to the victim).
    let (kv, last) = (stack.kv.http_addr.clone(), tokens(prompts - 1));
    wait_for("the other stream's stores handled", DEADLINE, || {
        let (kv, router, last) = (kv.clone(), router.http.clone(), last.clone());
        async move {
            let refused = metric(&kv, "kvindex_sources_refused_total", &["pod_owned"]).await;
            let body = json!({"model": MODEL, "prompt": last, "max_tokens": 2});
            let decision = post(&router, "/route/v1/completions", &body).await.json();
            let credited = decision["ranked"][0]["matched_blocks"].as_u64().unwrap_or(0) > 0;
            (refused >= f64::from(prompts) || credited).then_some(())
        }
    })
    .await;
    for n in 0..prompts {
        let reply =
            post(&router.http, "/v1/completions", &json!({"model": MODEL, "prompt": tokens(n), "max_tokens": 2})).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        let matched: u64 = reply.header("x-kvindex-matched-blocks").unwrap().parse().unwrap();
        assert!(
            matched * BLOCK as u64 <= reply.cached_tokens(),
            "prompt {n}: the router predicted {matched} cached blocks on {} (by another stream's blocks); the pod served {} cached tokens",
            reply.pod(),
            reply.cached_tokens()
        );
    }
    assert!(metric(&stack.kv.http_addr, "kvindex_sources_refused_total", &["pod_owned"]).await >= f64::from(prompts));
}
