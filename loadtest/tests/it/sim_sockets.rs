//! The `kvindex-sim` binary on real 127.0.0.1 sockets: its PUB stream (SUB), its replay ROUTER
//! (DEALER), its OpenAI API and metrics, and the fault knobs. Every wait has a deadline.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{http, post_json};
use bytes::Bytes;
use kvindex::wire::{decode_batch, parse_live, parse_replay, Event, ReplayReply};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use serde_json::{json, Value};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const MODEL: &str = "sim/model";
const BLOCK: usize = 16;
const DEADLINE: Duration = Duration::from_secs(20);

/// A running `kvindex-sim`, killed on drop.
struct Sim {
    child: Child,
    pods: Vec<Value>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sim {
    fn http(&self, pod: usize) -> String {
        self.pods[pod]["http"].as_str().unwrap().to_string()
    }
    fn endpoint(&self, pod: usize, key: &str) -> String {
        self.pods[pod][key].as_str().unwrap().to_string()
    }
}

fn spawn_sim(pods: usize, extra: &[&str]) -> Sim {
    // Defaults for the tests, unless `extra` sets them.
    let mut defaults = vec![];
    for (flag, value) in [("--kv-blocks", "64"), ("--time-scale", "100"), ("--decode-ms-per-token", "1")] {
        if !extra.contains(&flag) {
            defaults.extend([flag, value]);
        }
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvindex-sim"))
        .args(["--pods", &pods.to_string(), "--model", MODEL, "--block-size", &BLOCK.to_string()])
        .args(["--http-base-port", "0", "--zmq-bind-base-port", "0", "--replay-base-port", "0"])
        .args(defaults)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kvindex-sim");
    let stdout = child.stdout.take().expect("stdout");
    // The binary prints one JSON line per pod once everything listens; a reader thread
    // lets the test give up at a deadline instead of blocking forever.
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut sim = Sim { child, pods: Vec::new() };
    while sim.pods.len() < pods {
        let line = received.recv_timeout(DEADLINE).expect("kvindex-sim did not report its pods");
        sim.pods.push(serde_json::from_str(&line).expect("pod line is JSON"));
    }
    sim
}

struct Message {
    topic: Vec<u8>,
    seq: u64,
    payload: Vec<u8>,
}

async fn recv_live(sub: &mut SubSocket, timeout: Duration) -> Option<Message> {
    let message = tokio::time::timeout(timeout, sub.recv()).await.ok()?.expect("SUB recv");
    let frames: Vec<Bytes> = message.into_vec();
    let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
    let raw = parse_live(&refs).expect("3-frame live message");
    Some(Message { topic: raw.topic.unwrap_or_default().to_vec(), seq: raw.seq, payload: raw.payload.to_vec() })
}

async fn complete(addr: &str, prompt: &[u32], max_tokens: usize) -> Value {
    let response = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "return_token_ids": true}),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.body);
    response.json()
}

/// Rank 0's publisher counters.
async fn publisher_stats(addr: &str) -> Value {
    http(addr, "GET", "/admin/stats", None).await.json()["ranks"][0]["publisher"].clone()
}

/// Subscribes and sends throw-away requests until the first message arrives (a PUB drops
/// what it sends before the subscription reaches it). Returns the first seq seen.
async fn subscribe(addr: &str, endpoint: &str) -> (SubSocket, Message) {
    let mut sub = SubSocket::new();
    sub.subscribe("kv@").await.unwrap();
    sub.connect(endpoint).await.unwrap();
    let deadline = std::time::Instant::now() + DEADLINE;
    for salt in 0u32.. {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for the first live message");
        let prompt: Vec<u32> = (0..20).map(|i| 900_000 + salt * 100 + i).collect();
        complete(addr, &prompt, 1).await;
        if let Some(first) = recv_live(&mut sub, Duration::from_millis(200)).await {
            return (sub, first);
        }
    }
    unreachable!("the loop only ends by returning or failing")
}

/// A DEALER replay from `start`: every reply until the end marker, as raw frames.
async fn replay(endpoint: &str, start: u64) -> Vec<Vec<Bytes>> {
    let mut dealer = DealerSocket::new();
    dealer.connect(endpoint).await.unwrap();
    let request = ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())]).unwrap();
    dealer.send(request).await.unwrap();
    let mut replies = Vec::new();
    loop {
        let message = tokio::time::timeout(DEADLINE, dealer.recv()).await.expect("replay reply in time").unwrap();
        let frames = message.into_vec();
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
        let end = matches!(parse_replay(&refs).expect("valid replay reply"), ReplayReply::End { .. });
        replies.push(frames);
        if end {
            return replies;
        }
    }
}

fn implied_cached_tokens(index: &KvIndex, pod: &str, prompt: &[u32]) -> usize {
    let pods = [pod];
    let result = index.score(&ScoreQuery {
        model: MODEL,
        lora_name: None,
        cache_salt: None,
        token_ids: prompt,
        pods: Some(&pods),
    });
    let matched = result.matches.first().map_or(0, |m| m.matched_blocks as usize);
    matched.min((prompt.len() - 1) / BLOCK) * BLOCK
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_and_replay_streams_imply_the_reported_cached_tokens() {
    let sim = spawn_sim(2, &[]);
    let addr = sim.http(0);
    let pod_id = sim.pods[0]["pod_id"].as_str().unwrap().to_string();
    let topic = sim.pods[0]["topic"].as_str().unwrap().to_string();
    assert_eq!(topic, format!("kv@{pod_id}@{MODEL}"));
    let (mut sub, first) = subscribe(&addr, &sim.endpoint(0, "pub")).await;

    // What the SUB missed before it joined comes from replay (0.33 layout: topic frame).
    let index = KvIndex::new(KvIndexConfig { block_size: BLOCK, ..KvIndexConfig::default() });
    let replies = replay(&sim.endpoint(0, "replay"), 0).await;
    let end = replies.last().unwrap();
    assert_eq!(end, &vec![Bytes::new(), Bytes::new(), Bytes::copy_from_slice(&[0xff; 8]), Bytes::new()]);
    let mut next_seq = 0;
    for frames in &replies[..replies.len() - 1] {
        assert_eq!(frames.len(), 4);
        assert_eq!(frames[1].as_ref(), topic.as_bytes());
        let seq = u64::from_be_bytes(frames[2].as_ref().try_into().unwrap());
        assert_eq!(seq, next_seq, "replay is contiguous from 0");
        next_seq += 1;
        if seq < first.seq {
            index.apply(&pod_id, MODEL, &decode_batch(&frames[3]).unwrap());
        }
    }
    assert!(next_seq > first.seq, "replay covers the first live message");
    assert_eq!(first.topic, topic.as_bytes());
    index.apply(&pod_id, MODEL, &decode_batch(&first.payload).unwrap());
    let mut last_seq = first.seq;
    // Drain live messages already published (warm-up requests after the first one).
    let published = publisher_stats(&addr).await["next_seq"].as_u64().unwrap();
    while last_seq + 1 < published {
        let message = recv_live(&mut sub, DEADLINE).await.expect("live message");
        assert_eq!(message.seq, last_seq + 1, "no gaps without faults");
        index.apply(&pod_id, MODEL, &decode_batch(&message.payload).unwrap());
        last_seq = message.seq;
    }

    // A conversation: each turn's cached_tokens must equal what the stream implied before it.
    let mut conversation: Vec<u32> = (0..50).map(|i| 10_000 + i).collect();
    let mut hits = 0;
    for turn in 0..6u32 {
        let mut prompt = conversation.clone();
        prompt.extend((0..7 + turn).map(|i| 20_000 + 100 * turn + i));
        if prompt.len() % BLOCK == 0 {
            prompt.push(1);
        }
        let expected = implied_cached_tokens(&index, &pod_id, &prompt);
        let response = complete(&addr, &prompt, 9).await;
        let cached = response["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
        assert_eq!(cached, expected, "turn {turn}");
        assert_eq!(response["usage"]["prompt_tokens"], prompt.len());
        hits += usize::from(cached > 0);
        let outputs: Vec<u32> = serde_json::from_value(response["choices"][0]["token_ids"].clone()).unwrap();
        assert_eq!(outputs.len(), 9);
        prompt.extend(outputs);
        conversation = prompt;
        let published = publisher_stats(&addr).await["next_seq"].as_u64().unwrap();
        while last_seq + 1 < published {
            let message = recv_live(&mut sub, DEADLINE).await.expect("live message");
            assert_eq!(message.seq, last_seq + 1, "no gaps without faults");
            assert_eq!(message.topic, topic.as_bytes());
            index.apply(&pod_id, MODEL, &decode_batch(&message.payload).unwrap());
            last_seq = message.seq;
        }
    }
    assert!(hits >= 5, "later turns hit the conversation's blocks ({hits})");

    // Reset: AllBlocksCleared goes out with the next step's batch.
    let reset = http(&addr, "POST", "/reset_prefix_cache", None).await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    let message = recv_live(&mut sub, DEADLINE).await.expect("the clear batch");
    assert_eq!(message.seq, last_seq + 1);
    let batch = decode_batch(&message.payload).unwrap();
    assert!(matches!(batch.events.as_slice(), [Event::AllBlocksCleared { .. }]), "{batch:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_drop_restart_and_pause_with_the_0_23_layout() {
    let sim = spawn_sim(1, &["--wire", "0.23"]);
    let addr = sim.http(0);
    let (mut sub, first) = subscribe(&addr, &sim.endpoint(0, "pub")).await;
    let mut last_seq = first.seq;
    let published = publisher_stats(&addr).await["next_seq"].as_u64().unwrap();
    while last_seq + 1 < published {
        last_seq = recv_live(&mut sub, DEADLINE).await.expect("live message").seq;
    }

    // Drop 2 batches: the SUB sees a gap of exactly 2, replay fills it (no topic frame in 0.23).
    let dropped = post_json(&addr, "/admin/faults/drop", &json!({"batches": 2})).await;
    assert_eq!(dropped.status, 200);
    for turn in 0..3u32 {
        let prompt: Vec<u32> = (0..40).map(|i| 30_000 + 100 * turn + i).collect();
        complete(&addr, &prompt, 1).await; // one batch per request: its prompt's stores
    }
    let message = recv_live(&mut sub, DEADLINE).await.expect("the batch after the gap");
    assert_eq!(message.seq, last_seq + 3, "two batches dropped");
    let replies = replay(&sim.endpoint(0, "replay"), last_seq + 1).await;
    let seqs: Vec<u64> = replies
        .iter()
        .filter_map(|frames| {
            let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
            match parse_replay(&refs).unwrap() {
                ReplayReply::Message(raw) => {
                    assert!(raw.topic.is_none(), "0.23 replies carry no topic frame");
                    decode_batch(raw.payload).expect("replayed payload decodes");
                    Some(raw.seq)
                }
                ReplayReply::End { topic } => {
                    assert!(topic.is_none());
                    None
                }
            }
        })
        .collect();
    assert_eq!(seqs, vec![last_seq + 1, last_seq + 2, last_seq + 3]);
    assert_eq!(replies.last().unwrap().len(), 3, "0.23 end marker has 3 frames");
    assert_eq!(publisher_stats(&addr).await["dropped"], 2);

    // Restart: seq back to 0 and an empty replay window.
    let restarted = http(&addr, "POST", "/admin/faults/restart-publisher", None).await;
    assert_eq!(restarted.status, 200, "{}", restarted.body);
    assert_eq!(publisher_stats(&addr).await["next_seq"], 0);
    complete(&addr, &(0..40).map(|i| 40_000 + i).collect::<Vec<u32>>(), 1).await;
    let replies = replay(&sim.endpoint(0, "replay"), 0).await;
    assert_eq!(replies.len(), 2, "one batch since the restart, then the end marker");
    assert_eq!(replies[0][1].as_ref(), &0u64.to_be_bytes());

    // Pause holds batches; resume sends them in order.
    assert_eq!(http(&addr, "POST", "/admin/faults/pause", None).await.status, 200);
    complete(&addr, &(0..40).map(|i| 50_000 + i).collect::<Vec<u32>>(), 1).await;
    let stats = publisher_stats(&addr).await;
    assert_eq!((stats["held"].as_u64(), stats["next_seq"].as_u64()), (Some(1), Some(1)));
    assert_eq!(http(&addr, "POST", "/admin/faults/resume", None).await.status, 200);
    let stats = publisher_stats(&addr).await;
    assert_eq!(
        (stats["held"].as_u64(), stats["next_seq"].as_u64()),
        (Some(0), Some(2)),
        "held batches went out on resume"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_api_streaming_metrics_and_errors() {
    let sim = spawn_sim(1, &[]);
    let addr = sim.http(0);

    let models = http(&addr, "GET", "/v1/models", None).await.json();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(http(&addr, "GET", "/health", None).await.status, 200);

    // Text prompts are byte-tokenized; the same text twice hits its whole blocks.
    let text = "The quick brown fox jumps over the lazy dog, again and again and again.";
    let body = json!({"model": MODEL, "prompt": text, "max_tokens": 4});
    let first = post_json(&addr, "/v1/completions", &body).await.json();
    assert_eq!(first["usage"]["prompt_tokens"], text.len());
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(first["choices"][0]["text"].as_str().unwrap().len(), 4);
    let again = post_json(&addr, "/v1/completions", &body).await.json();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], (text.len() - 1) / BLOCK * BLOCK);

    // Streaming: one chunk per token, the usage chunk, then [DONE].
    let stream = json!({"model": MODEL, "prompt": text, "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}});
    let response = post_json(&addr, "/v1/completions", &stream).await;
    assert_eq!(response.status, 200);
    let data: Vec<&str> = response.body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(chunks.len(), 6, "{data:?}");
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 5);
    assert!(chunks[5]["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);

    // Chat streaming: a role chunk, content deltas, [DONE].
    let chat_stream =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": true});
    let response = post_json(&addr, "/v1/chat/completions", &chat_stream).await;
    let data: Vec<&str> = response.body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.len(), 4, "{data:?}");
    let first: Value = serde_json::from_str(data[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let last: Value = serde_json::from_str(data[2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(data[3], "[DONE]");

    // Chat, rendered with role tags.
    let chat = json!({"model": MODEL, "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 3});
    let reply = post_json(&addr, "/v1/chat/completions", &chat).await.json();
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["usage"]["prompt_tokens"], "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n".len());
    assert_eq!(reply["choices"][0]["message"]["content"].as_str().unwrap().len(), 3);

    // Metrics under vLLM's names.
    let metrics = http(&addr, "GET", "/metrics", None).await.body;
    for name in [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ] {
        assert!(metrics.contains(&format!("\n{name}{{")), "{name} missing:\n{metrics}");
    }
    assert!(metrics.contains("block_size=\"16\"") && metrics.contains("num_gpu_blocks=\"64\""), "{metrics}");

    // Bad requests: clear 4xx JSON errors.
    for (path, body, status) in [
        ("/v1/completions", "{not json", 400),
        ("/v1/completions", r#"{"prompt": []}"#, 400),
        ("/v1/completions", r#"{"prompt": [1, -2]}"#, 400),
        ("/v1/completions", r#"{"prompt": "x", "max_tokens": 0}"#, 400),
        ("/v1/completions", r#"{"model": "other", "prompt": "x"}"#, 404),
        ("/v1/completions", r#"{"prompt": [1, 2, 3], "max_tokens": 5000}"#, 400),
        ("/v1/chat/completions", r#"{"messages": []}"#, 400),
        ("/admin/faults/drop", r#"{"batches": "many"}"#, 400),
        ("/nowhere", "", 404),
    ] {
        let response = http(&addr, "POST", path, Some(body)).await;
        assert_eq!(response.status, status, "{path} {body}: {}", response.body);
        assert_eq!(response.json()["object"], "error", "{path} {body}");
    }
    let wrong_method = http(&addr, "GET", "/v1/completions", None).await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.json()["object"], "error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_dial_a_central_sub_with_zmq_connect() {
    // A central SUB binds (as `kvindex serve` does) and every pod's PUB dials it.
    let mut central = SubSocket::new();
    central.subscribe("kv@").await.unwrap();
    let endpoint = central.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvindex-sim"))
        .args([
            "--pods",
            "2",
            "--model",
            MODEL,
            "--kv-blocks",
            "64",
            "--http-base-port",
            "0",
            "--zmq-connect",
            &endpoint,
        ])
        .args(["--time-scale", "100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kvindex-sim");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut sim = Sim { child, pods: Vec::new() };
    while sim.pods.len() < 2 {
        sim.pods.push(serde_json::from_str(&received.recv_timeout(DEADLINE).expect("pod line")).unwrap());
    }
    assert!(sim.pods.iter().all(|p| p["pub"].is_null()), "dialing pods bind nothing");
    let mut topics_seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + DEADLINE;
    let mut salt = 0u32;
    while topics_seen.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "saw only {topics_seen:?}");
        for pod in 0..2 {
            salt += 1;
            complete(&sim.http(pod), &(0..20).map(|i| 70_000 + salt * 100 + i).collect::<Vec<u32>>(), 1).await;
        }
        while let Some(message) = recv_live(&mut central, Duration::from_millis(100)).await {
            decode_batch(&message.payload).expect("decodes");
            topics_seen.insert(String::from_utf8(message.topic).unwrap());
        }
    }
    let expected: std::collections::BTreeSet<String> =
        sim.pods.iter().map(|p| p["topic"].as_str().unwrap().to_string()).collect();
    assert_eq!(topics_seen, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_ttft_follows_the_timing_model() {
    // 16 000 uncached prompt tokens at 16 000 tokens/s is 1 simulated second; at time scale 1
    // the answer (one token) takes at least 1 s of wall time: the step sleeps until its
    // simulated end, so that lower bound holds on any machine.
    let sim = spawn_sim(1, &["--kv-blocks", "2000", "--time-scale", "1"]);
    let addr = sim.http(0);
    let prompt: Vec<u32> = (0..16_000).map(|i| 100_000 + i).collect();
    let started = std::time::Instant::now();
    let response = complete(&addr, &prompt, 1).await;
    let uncached = started.elapsed().as_secs_f64();
    assert_eq!(response["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // The upper bound leaves room for a busy machine.
    assert!((0.99..6.0).contains(&uncached), "uncached: {uncached:.3} s of wall time");
    // The same prompt again: 15 984 tokens cached, 16 computed: 1 ms of simulated time. Both
    // requests carry the same HTTP and JSON overhead, so the difference is the model's: a
    // loaded machine adds overhead to both, not to the difference.
    let started = std::time::Instant::now();
    let response = complete(&addr, &prompt, 1).await;
    let cached = started.elapsed().as_secs_f64();
    assert_eq!(response["usage"]["prompt_tokens_details"]["cached_tokens"], 15_984);
    assert!(uncached - cached > 0.6, "cached: {cached:.3} s vs uncached {uncached:.3} s of wall time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_stream_opens_with_the_engines_first_output_after_the_prefill() {
    // vLLM sends a chat stream's role chunk with the first output, so a router that reads the
    // first body byte as "prompt computed" (kvindex-router's queued prefill) reads it right.
    // 1,000 prompt tokens at 1,000 tokens/s, time scale 1: no byte of the body before 1 s.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sim = spawn_sim(1, &["--kv-blocks", "2000", "--time-scale", "1", "--prefill-tokens-per-s", "1000"]);
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(1000)}],
                      "max_tokens": 2, "stream": true})
    .to_string();
    let addr = sim.http(0);
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let started = std::time::Instant::now();
    socket.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    while !received.windows(5).any(|w| w == b"data:") {
        let n = tokio::time::timeout(DEADLINE, socket.read(&mut buf)).await.expect("the stream answers").unwrap();
        assert!(n > 0, "closed before any event: {}", String::from_utf8_lossy(&received));
        received.extend_from_slice(&buf[..n]);
    }
    let first_event = started.elapsed().as_secs_f64();
    assert!(first_event >= 0.99, "the first event came {first_event:.3} s in, before the prefill's 1 s");
    assert!(String::from_utf8_lossy(&received).contains(r#""role":"assistant""#), "the role opens the stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_parallel_ranks_publish_on_their_own_endpoints() {
    let sim = spawn_sim(1, &["--data-parallel-size", "2"]);
    let addr = sim.http(0);
    let topic = sim.pods[0]["topic"].as_str().unwrap().to_string();
    let ranks = sim.pods[0]["ranks"].as_array().unwrap().clone();
    assert_eq!(ranks.len(), 2);
    let mut subs = Vec::new();
    for rank in &ranks {
        let mut sub = SubSocket::new();
        sub.subscribe("kv@").await.unwrap();
        sub.connect(rank["pub"].as_str().unwrap()).await.unwrap();
        subs.push(sub);
    }
    // Requests alternate between idle ranks; wait until each rank's SUB saw a batch.
    let mut seen = [None::<Message>, None];
    let deadline = std::time::Instant::now() + DEADLINE;
    for salt in 0u32.. {
        assert!(
            std::time::Instant::now() < deadline,
            "not every rank published: {:?}",
            seen.iter().map(Option::is_some).collect::<Vec<_>>()
        );
        complete(&addr, &(0..20).map(|i| 80_000 + salt * 100 + i).collect::<Vec<u32>>(), 1).await;
        for (rank, sub) in subs.iter_mut().enumerate() {
            if seen[rank].is_none() {
                seen[rank] = recv_live(sub, Duration::from_millis(50)).await;
            }
        }
        if seen.iter().all(Option::is_some) {
            break;
        }
    }
    for (rank, message) in seen.iter().enumerate() {
        let message = message.as_ref().unwrap();
        assert_eq!(message.topic, topic.as_bytes(), "every rank publishes under the pod's topic");
        assert_eq!(decode_batch(&message.payload).unwrap().data_parallel_rank, Some(rank as i64));
    }
    let metrics = http(&addr, "GET", "/metrics", None).await.body;
    assert!(metrics.contains("vllm:num_requests_waiting{engine=\"1\""), "{metrics}");
    let stats = http(&addr, "GET", "/admin/stats", None).await.json();
    assert_eq!(stats["ranks"][1]["rank"], 1);
}
