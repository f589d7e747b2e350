//! Interop with the real service: `kvindex-sim` pods dial a central `kvindex serve`, and its
//! gRPC `ScoreTokens` answer before each turn must predict the `cached_tokens` the pod then
//! reports (whole blocks, at most `prompt_len − 1` tokens), for two pods holding different
//! conversations.
//!
//! Needs the `kvindex` binary of the same target directory (built by any workspace build, or
//! `cargo build -p kvindex-server --bin kvindex`), or `$KVINDEX_BIN`. Without it the test is skipped
//! with a message, except under `CI`, where it fails.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{http, kvindex_binary, post_json, post_json_as, wait_for, Process};
use kvindex_proto::kvindex::v1::indexer_client::IndexerClient;
use kvindex_proto::kvindex::v1::ScoreTokensRequest;
use kvindex_testkit::serve::Serve;
use serde_json::{json, Value};

const MODEL: &str = "sim/model";
const BLOCK: usize = 16;
const DEADLINE: Duration = Duration::from_secs(30);

/// Spawns a process and returns the first stdout lines that `take` accepts (until it says done).
fn spawn_reading(command: &mut Command, mut take: impl FnMut(&str) -> bool) -> Process {
    // Owned by `Process` at once, so a failing test still kills it.
    let mut process = Process(command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn"));
    let stdout = process.0.stdout.take().expect("stdout");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = received.recv_timeout(DEADLINE).expect("the process reported its addresses in time");
        if take(&line) {
            return process;
        }
    }
}

async fn sources(kvindex_http: &str) -> Vec<Value> {
    let body = http(kvindex_http, "GET", "/debug/sources", None).await.json();
    body["sources"].as_array().cloned().unwrap_or_default()
}

/// Waits until kvindex applied every batch the pod published so far.
async fn caught_up(kvindex_http: &str, sim_http: &str, pod_id: &str) {
    wait_for("kvindex to apply the pod's batches", DEADLINE, || async move {
        let stats = http(sim_http, "GET", "/admin/stats", None).await.json();
        let next = stats["ranks"][0]["publisher"]["next_seq"].as_u64()?;
        if next == 0 {
            return Some(());
        }
        let sources = sources(kvindex_http).await;
        let source = sources.iter().find(|s| s["pod"] == pod_id)?;
        (source["last_seq"].as_u64() == Some(next - 1) && source["state"] == "EXACT").then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvindex_serve_scores_predict_the_simulators_cached_tokens() {
    let Some(binary) = kvindex_binary() else {
        return;
    };
    // Pod registration is off unless kvindex serve is given a bearer token.
    let token = format!("kvindex-loadtest-test-token-{}", std::process::id());
    let token_file = std::env::temp_dir().join(format!("kvindex-loadtest-test-token-{}", std::process::id()));
    std::fs::write(&token_file, &token).expect("token file");
    let server = Serve::new(binary)
        .loopback()
        .args(["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16", "--admin-token-file"])
        .arg(&token_file)
        .start()
        .expect("kvindex serve");
    let (grpc, kv_http, zmq) = (server.grpc.clone(), server.http.clone(), server.zmq());
    let mut pods: Vec<Value> = Vec::new();
    let _sim = spawn_reading(
        Command::new(env!("CARGO_BIN_EXE_kvindex-sim"))
            .args(["--pods", "2", "--model", MODEL, "--kv-blocks", "256"])
            .args(["--http-base-port", "0", "--zmq-connect", &zmq, "--replay-base-port", "0", "--time-scale", "100"]),
        |line| {
            pods.push(serde_json::from_str(line).expect("pod line"));
            pods.len() == 2
        },
    );
    for pod in &pods {
        let body = json!({"pod": pod["pod_id"], "model": MODEL, "replay_endpoint": pod["replay"]});
        let registered = post_json_as(&kv_http, "/pods", &body, &token).await;
        assert_eq!(registered.status, 200, "{}", registered.body);
    }
    let mut client = IndexerClient::connect(format!("http://{grpc}")).await.expect("gRPC connect");

    // Two conversations, each pinned to its own pod.
    let mut conversations: Vec<Vec<u32>> =
        (0..2u32).map(|c| (0..70).map(|i| 1000 + 10_000 * c + i).collect()).collect();
    let mut hits = 0;
    for turn in 0..5u32 {
        for (index, pod) in pods.iter().enumerate() {
            let (pod_id, sim_http) = (pod["pod_id"].as_str().unwrap(), pod["http"].as_str().unwrap());
            let mut prompt = conversations[index].clone();
            prompt.extend((0..9 + turn).map(|i| 5000 + 100 * turn + i));
            if prompt.len() % BLOCK == 0 {
                prompt.push(3);
            }
            for other in &pods {
                caught_up(&kv_http, other["http"].as_str().unwrap(), other["pod_id"].as_str().unwrap()).await;
            }
            let scores = client
                .score_tokens(ScoreTokensRequest {
                    model: MODEL.into(),
                    token_ids: prompt.clone(),
                    ..Default::default()
                })
                .await
                .expect("ScoreTokens")
                .into_inner();
            let matched =
                |id: &str| scores.scores.iter().find(|s| s.pod == id).map_or(0, |s| s.matched_blocks as usize);
            let expected = matched(pod_id).min((prompt.len() - 1) / BLOCK) * BLOCK;
            let other_id = pods[1 - index]["pod_id"].as_str().unwrap();
            assert_eq!(matched(other_id), 0, "turn {turn}: the other pod never saw this conversation");
            let response = post_json(
                sim_http,
                "/v1/completions",
                &json!({"prompt": prompt, "max_tokens": 8, "return_token_ids": true}),
            )
            .await;
            assert_eq!(response.status, 200, "{}", response.body);
            let response = response.json();
            let cached = response["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
            assert_eq!(cached, expected, "turn {turn} on {pod_id}: ScoreTokens predicted {expected}");
            hits += usize::from(cached > 0);
            prompt.extend(serde_json::from_value::<Vec<u32>>(response["choices"][0]["token_ids"].clone()).unwrap());
            conversations[index] = prompt;
        }
    }
    assert!(hits >= 8, "later turns hit ({hits})");
    for source in sources(&kv_http).await {
        assert_eq!(source["malformed"], 0, "{source}");
    }
}
