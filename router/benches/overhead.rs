//! Router overhead per request, upstream excluded: tokenize + ScoreTokens + pick, through the
//! library's pipeline (`Router::route`), for ~8k-token chats with the real 129k-vocabulary
//! DeepSeek tokenizer and chat template, against a real `kvindex serve` whose index holds the
//! conversations (published by `kvindex-sim` pods that served them).
//!
//! Two cases: the first time a chat is seen (everything tokenized), and its next turn (the
//! whole history again plus one question, as OpenAI clients send it).
//!
//! ```sh
//! source scripts/env.sh
//! cargo build --release -p kvindex-server --bin kvindex -p kvindex-loadtest --bin kvindex-sim
//! cargo bench -p kvindex-router --bench overhead            # CHATS=24 TURNS=4 to change the sample
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvindex_loadtest::kvindex_service::{sim_next_seq, KvindexService};
use kvindex_loadtest::process::{workspace_binary, SimFleet};
use kvindex_router::config::PodSpec;
use kvindex_router::cost::{CostWeights, Policy};
use kvindex_router::fleet::{Fleet, Role, Source};
use kvindex_router::indexer::IndexerPool;
use kvindex_router::pipeline::{Router, RouterSettings};
use kvindex_router::tokenize::Tokenizers;
use kvindex_router::{Decision, Prompt, RouteRequest};
use kvindex_tokenizer::ChatRequest;
use serde_json::{json, Value};

const MODEL: &str = "deepseek";

const TOPICS: [&str; 5] = [
    "Explain how the scheduler admits a request when the KV cache is nearly full, and what preemption costs.",
    "Grüße aus München: naïve façades, Ελληνικά, русский, 中文, 日本語, 한국어, العربية and 🚀🧪 emoji in one line.",
    "Release 2026.11.29 shipped 1,234,567 tokens/s on 0xC0FFEE nodes at 99.95% availability, p99 41.7 ms.",
    "```rust\nfn score(blocks: &[u64]) -> usize {\n    blocks.iter().take_while(|b| **b != 0).count()\n}\n```",
    "A router that remembers only its own placements forgets what its siblings did; a shared index does not.",
];

/// A chat of about `target` tokens (rendered), unique to `seed` from its first line.
fn chat(seed: usize, target_chars: usize) -> Vec<Value> {
    let mut messages =
        vec![json!({"role": "system", "content": format!("Session {seed}: you are a precise assistant.")})];
    let mut chars = 0;
    let mut turn = 0;
    while chars < target_chars {
        let text: String =
            (0..6).map(|i| format!("({turn}.{i}) {}\n", TOPICS[(seed + turn + i) % TOPICS.len()])).collect();
        chars += text.len();
        messages.push(json!({"role": "user", "content": text}));
        messages.push(json!({"role": "assistant", "content": format!("Understood, point {turn} noted.")}));
        turn += 1;
    }
    messages.push(json!({"role": "user", "content": "Now summarise everything above."}));
    messages
}

fn request(messages: &[Value]) -> RouteRequest {
    let mut chat = ChatRequest::from_messages(messages.to_vec());
    chat.add_generation_prompt = true;
    RouteRequest { model: MODEL.into(), prompt: Prompt::Chat(chat), cache_salt: None, stream: false, subset: None }
}

#[derive(Default)]
struct Samples {
    total: Vec<u64>,
    tokenize: Vec<u64>,
    score: Vec<u64>,
    pick: Vec<u64>,
    tokens: Vec<usize>,
    matched: Vec<u32>,
}

impl Samples {
    fn add(&mut self, d: &Decision) {
        self.total.push(d.timings.total_us);
        self.tokenize.push(d.timings.tokenize_us);
        self.score.push(d.timings.score_us);
        self.pick.push(d.timings.pick_us);
        self.tokens.push(d.prompt_tokens.unwrap_or(0));
        self.matched.push(d.ranked.first().map_or(0, |c| c.matched_blocks));
    }

    fn print(&mut self, name: &str) {
        let pct = |v: &mut Vec<u64>, p: f64| {
            v.sort_unstable();
            v[((v.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
        };
        let tokens = self.tokens.iter().sum::<usize>() / self.tokens.len().max(1);
        let matched = self.matched.iter().map(|&m| m as usize).sum::<usize>() / self.matched.len().max(1);
        println!(
            "{name:<10} n={:<4} tokens≈{tokens:<5} matched≈{matched:<4} total p50 {:.3} ms p99 {:.3} ms | tokenize p50 {:.3} p99 {:.3} | score p50 {:.3} p99 {:.3} | pick p50 {:.3} p99 {:.3}",
            self.total.len(),
            pct(&mut self.total, 0.5),
            pct(&mut self.total, 0.99),
            pct(&mut self.tokenize, 0.5),
            pct(&mut self.tokenize, 0.99),
            pct(&mut self.score, 0.5),
            pct(&mut self.score, 0.99),
            pct(&mut self.pick, 0.5),
            pct(&mut self.pick, 0.99),
        );
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let Some(fixtures) = std::env::var_os("KVINDEX_FIXTURES") else {
        eprintln!("KVINDEX_FIXTURES is not set: `source scripts/env.sh` after scripts/setup.sh");
        return;
    };
    let dir = PathBuf::from(fixtures).join("models/deepseek");
    let (kvindex, sim) =
        match (workspace_binary("kvindex", "KVINDEX_BIN"), workspace_binary("kvindex-sim", "KVINDEX_SIM_BIN")) {
            (Ok(k), Ok(s)) => (k, s),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("{e}");
                return;
            }
        };
    let (chats, turns) = (env_usize("CHATS", 24), env_usize("TURNS", 4));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let service = KvindexService::start(&kvindex, 16).expect("kvindex serve");
        let dir_arg = dir.to_str().unwrap();
        let fleet_args = [
            "--model",
            MODEL,
            "--tokenizer",
            dir_arg,
            "--kv-blocks",
            "60000",
            "--time-scale",
            "1000",
            "--http-base-port",
            "0",
        ];
        let mut args = fleet_args.to_vec();
        args.extend(["--zmq-connect", &service.zmq_endpoint, "--replay-base-port", "0"]);
        let sims = SimFleet::start(&sim, 2, &args).expect("kvindex-sim");
        for pod in &sims.pods {
            service.register_pod(&pod.pod_id, MODEL, pod.replay.as_deref()).await.expect("register");
        }
        let fleet = Arc::new(Fleet::new(Duration::from_secs(2)));
        for pod in &sims.pods {
            let spec = PodSpec { id: pod.pod_id.clone(), url: format!("http://{}", pod.http), role: Role::Both };
            fleet.upsert(&spec, Source::Static).unwrap();
        }
        let settings = RouterSettings {
            weights: CostWeights::default(),
            policy: Policy::Cost,
            load_band: 1.0,
            block_size: 16,
            max_prompt_tokens: 262_144,
            speculative_ttl: Duration::ZERO,
            record_route_timeout: Duration::from_millis(250),
            models: [MODEL.to_string()].into(),
            loras: Default::default(),
        };
        let tokenizers = Tokenizers::new(&[(MODEL.to_string(), dir.clone())], None).unwrap();
        tokenizers.preload().await.unwrap();
        let deadline = Duration::from_millis(5);
        let indexer =
            IndexerPool::new(std::slice::from_ref(&service.grpc_addr), deadline, deadline / 2, Duration::from_secs(1))
                .unwrap();
        indexer.warm_up();
        let router = Router::new(settings, tokenizers, indexer, fleet);
        let client = kvindex_loadtest::kvindex_service::http;

        let (mut first_seen, mut next_turn) = (Samples::default(), Samples::default());
        // Warm-up: a few untimed routes.
        for seed in 0..3 {
            let _ = router.route(&request(&chat(10_000 + seed, 27_000))).await;
        }
        for seed in 0..chats {
            let mut messages = chat(seed, 27_000);
            let decision = router.route(&request(&messages)).await.expect("route");
            first_seen.add(&decision);
            for turn in 0..turns {
                // The pod serves the turn, so the index learns the conversation.
                let pod = &sims.pods[seed % sims.pods.len()];
                let body = json!({"model": MODEL, "messages": messages, "max_tokens": 8}).to_string();
                let (status, text) =
                    client(&pod.http, "POST", "/v1/chat/completions", Some(&body)).await.expect("serve");
                assert_eq!(status, 200, "{text}");
                let answer: Value = serde_json::from_str(&text).unwrap();
                let next = sim_next_seq(&pod.http).await.unwrap();
                service.wait_applied(&pod.pod_id, next, Duration::from_secs(30)).await.expect("applied");
                messages.insert(
                    messages.len(),
                    json!({"role": "assistant", "content": answer["choices"][0]["message"]["content"]}),
                );
                messages.push(json!({"role": "user", "content": format!("Follow-up {turn}: and the trade-offs?")}));
                let decision = router.route(&request(&messages)).await.expect("route");
                next_turn.add(&decision);
            }
        }
        println!("router overhead (tokenize + ScoreTokens + pick), DeepSeek 129k tokenizer, kvindex serve on loopback");
        first_seen.print("first-seen");
        next_turn.print("next-turn");
    });
}
