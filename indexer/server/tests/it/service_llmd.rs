//! llm-d's prompt-based scoring contract, `indexer.v1.IndexerService/GetPodScores`, end to end:
//! the real `kvindex serve` tokenizes the prompt with a real 129k-vocab tokenizer (the
//! tokenizer-svc fixtures) and scores it against blocks published by independent pyzmq/msgspec
//! engines.

use std::path::PathBuf;

use crate::support::*;
use kvindex_proto::indexer::v1::indexer_service_client::IndexerServiceClient;
use kvindex_proto::indexer::v1::GetPodScoresRequest;
use kvindex_tokenizer::{RegistryConfig, TokenizerRegistry};
use serde_json::json;

/// The DeepSeek tokenizer directory laid out by `scripts/setup.sh`.
fn deepseek_dir() -> Option<PathBuf> {
    kvindex_testkit::env::deepseek_tokenizer()
}

const PROMPT: &str = "You are a careful assistant for the operations team. Answer in short sentences, cite the \
    runbook section you used, and never guess a number you cannot check. The fleet runs vLLM with prefix \
    caching on eight pods behind an inference gateway; the indexer tells the gateway which pod already holds \
    the longest prefix of each prompt, so that requests land where their KV cache is warm. Question: why did \
    the p99 time to first token double after yesterday's deploy, and which dashboard shows it best?";

async fn scores(
    client: &mut IndexerServiceClient<tonic::transport::Channel>,
    model: &str,
    pods: &[&str],
) -> Result<Vec<(String, f64)>, tonic::Status> {
    let req = GetPodScoresRequest {
        prompt: PROMPT.to_string(),
        model_name: model.to_string(),
        pod_identifiers: pods.iter().map(|p| p.to_string()).collect(),
    };
    let mut out: Vec<(String, f64)> =
        client.get_pod_scores(req).await?.into_inner().scores.into_iter().map(|s| (s.pod, s.score)).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[test]
fn service_llmd_get_pod_scores_tokenizes_then_scores() {
    let Some(py) = python() else { return };
    let Some(dir) = deepseek_dir() else { return };
    let spec = format!("deepseek={}", dir.display());
    let server = Server::start(&["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16", "--tokenizer-model", &spec]);
    // What the engine would have tokenized for this completion prompt (BOS included).
    let mut config = RegistryConfig::default();
    config.add_model_spec(&spec).unwrap();
    let tokens = TokenizerRegistry::new(config).render_completion("deepseek", PROMPT).unwrap();
    assert!(tokens.len() >= 64, "prompt is {} tokens", tokens.len());

    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    for (name, pod) in [("a", "10.0.0.1:8000"), ("b", "10.0.0.2:8000")] {
        peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(), "topic": format!("kv@{pod}@deepseek")}));
    }
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a", "b"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "p", "tokens": &tokens[..64]}));
    peer.cmd(json!({"op": "store", "name": "b", "chain": "p", "tokens": &tokens[..32], "medium": "CPU"}));
    peer.wait_exact(&server, &["a", "b"], "deepseek", "EXACT", 20);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = IndexerServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
        // llm-d's convention: tier-weighted matched blocks (CPU 0.8), not normalized.
        assert_eq!(
            scores(&mut client, "deepseek", &[]).await.unwrap(),
            [("10.0.0.1:8000".to_string(), 4.0), ("10.0.0.2:8000".to_string(), 1.6)]
        );
        let filtered = scores(&mut client, "deepseek", &["10.0.0.2:8000", "10.9.9.9:8000"]).await.unwrap();
        assert_eq!(filtered, [("10.0.0.2:8000".to_string(), 1.6), ("10.9.9.9:8000".to_string(), 0.0)]);
        let err = scores(&mut client, "no-such-model", &[]).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        let err = scores(&mut client, "", &[]).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    });
    assert!(server.metric("kvindex_get_pod_scores_requests_total", &["outcome=\"ok\""]) >= 2.0);
    assert!(server.metric("kvindex_get_pod_scores_requests_total", &["outcome=\"error\""]) >= 2.0);
}

#[test]
fn service_llmd_without_a_tokenizer_says_how_to_configure_one() {
    let server = Server::start(&["--zmq-bind", "tcp://127.0.0.1:0"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = IndexerServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
        let err = scores(&mut client, "m", &[]).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.message().contains("--tokenizer-model"), "{}", err.message());
    });
}

/// `kvindex-tokenizer` (built on demand when this crate's tests run alone).
fn tokenizer_binary() -> Option<PathBuf> {
    Some(kvindex_testkit::binaries::required_binary("kvindex-tokenizer", "KVINDEX_TOKENIZER_BIN"))
}

/// Kills the tokenizer service when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn service_llmd_get_pod_scores_through_a_remote_tokenizer_service() {
    let Some(py) = python() else { return };
    let Some(dir) = deepseek_dir() else { return };
    let Some(tokenizer) = tokenizer_binary() else { return };
    let port = free_port();
    let spec = format!("deepseek={}", dir.display());
    let _tok = Child(
        std::process::Command::new(tokenizer)
            .args(["serve", "--grpc-addr", &format!("127.0.0.1:{port}"), "--model", &spec])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn kvindex-tokenizer"),
    );
    let endpoint = format!("http://127.0.0.1:{port}");
    let server =
        Server::start(&["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16", "--tokenizer-endpoint", &endpoint]);
    let mut config = RegistryConfig::default();
    config.add_model_spec(&spec).unwrap();
    let tokens = TokenizerRegistry::new(config).render_completion("deepseek", PROMPT).unwrap();
    let mut peer = Peer::start(&py);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    peer.cmd(json!({"op": "pub_start", "name": "a", "pod": "10.0.0.1:8000", "connect": server.zmq(), "topic": "kv@10.0.0.1:8000@deepseek"}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["a"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "a", "chain": "p", "tokens": &tokens[..48]}));
    peer.wait_exact(&server, &["a"], "deepseek", "EXACT", 20);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = IndexerServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
        // The tokenizer service may still be loading: wait for its first answer, with a deadline.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let got = loop {
            match scores(&mut client, "deepseek", &[]).await {
                Ok(s) => break s,
                Err(e) if std::time::Instant::now() < deadline && e.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await
                }
                Err(e) => panic!("GetPodScores through the remote tokenizer: {e:?}"),
            }
        };
        assert_eq!(got, [("10.0.0.1:8000".to_string(), 3.0)]);
        let err = scores(&mut client, "no-such-model", &[]).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    });
}
