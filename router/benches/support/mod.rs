//! What the router benches share: a real `kvindex serve` on loopback, two `kvindex-sim` pods
//! feeding it (DeepSeek tokenizer), a library `Router` over both, long chats, and serving a turn
//! so the index learns it. One place, so the overhead and ext_proc benches measure the same world.

#![allow(dead_code)] // each bench uses its own part

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvindex_loadtest::kvindex_service::{http, sim_next_seq, KvindexService};
use kvindex_loadtest::process::{workspace_binary, SimFleet};
use kvindex_router::place::cost::{CostWeights, Policy};
use kvindex_router::place::indexer::IndexerPool;
use kvindex_router::place::tokenize::Tokenizers;
use kvindex_router::place::{Router, RouterSettings};
use kvindex_router::pods::fleet::{Fleet, Source};
use kvindex_router::pods::spec::PodSpec;
use kvindex_router::pods::spec::Role;
use serde_json::{json, Value};

pub const MODEL: &str = "deepseek";

const TOPICS: [&str; 5] = [
    "Explain how the scheduler admits a request when the KV cache is nearly full, and what preemption costs.",
    "Grüße aus München: naïve façades, Ελληνικά, русский, 中文, 日本語, 한국어, العربية and 🚀🧪 emoji in one line.",
    "Release 2026.11.29 shipped 1,234,567 tokens/s on 0xC0FFEE nodes at 99.95% availability, p99 41.7 ms.",
    "```rust\nfn score(blocks: &[u64]) -> usize {\n    blocks.iter().take_while(|b| **b != 0).count()\n}\n```",
    "A router that remembers only its own placements forgets what its siblings did; a shared index does not.",
];

/// A chat of about `target_chars` characters (~8k tokens at 27k), unique to `seed` from its first line.
pub fn chat(seed: usize, target_chars: usize) -> Vec<Value> {
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

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The `p` quantile (nearest rank) of `v`, sorting it.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The tokenizer directory and the `kvindex` and `kvindex-sim` binaries, or why not (printed;
/// the bench then does nothing, as `cargo bench` without the fixtures should).
pub fn locate() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let Some(fixtures) = std::env::var_os("KVINDEX_FIXTURES") else {
        eprintln!("KVINDEX_FIXTURES is not set: `source scripts/env.sh` after scripts/setup.sh");
        return None;
    };
    match (workspace_binary("kvindex", "KVINDEX_BIN"), workspace_binary("kvindex-sim", "KVINDEX_SIM_BIN")) {
        (Ok(k), Ok(s)) => Some((PathBuf::from(fixtures).join("models/deepseek"), k, s)),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("{e}");
            None
        }
    }
}

/// `kvindex serve`, two sim pods publishing to it, and a library router over them.
pub struct World {
    pub service: KvindexService,
    pub sims: SimFleet,
    pub router: Arc<Router>,
}

impl World {
    /// `score_deadline`: the router's ScoreTokens deadline (the proxy's default is 5 ms).
    pub async fn start(
        tokenizer_dir: &std::path::Path,
        kvindex: &std::path::Path,
        sim: &std::path::Path,
        score_deadline: Duration,
    ) -> World {
        let service = KvindexService::start(kvindex, 16).expect("kvindex serve");
        let dir_arg = tokenizer_dir.to_str().unwrap();
        let args = [
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
            "--zmq-connect",
            &service.zmq_endpoint,
            "--replay-base-port",
            "0",
        ];
        let sims = SimFleet::start(sim, 2, &args).expect("kvindex-sim");
        let fleet = Arc::new(Fleet::new(Duration::from_secs(2)));
        for pod in &sims.pods {
            service.register_pod(&pod.pod_id, MODEL, pod.replay.as_deref()).await.expect("register");
            let spec = PodSpec::new(pod.pod_id.clone(), format!("http://{}", pod.http), Role::Both);
            fleet.upsert(&spec, Source::Static).unwrap();
        }
        let settings = RouterSettings {
            weights: CostWeights::default(),
            policy: Policy::Cost,
            load_band: 1.0,
            block_size: 16,
            max_prompt_tokens: 262_144,
            max_messages: 4096,
            speculative_ttl: Duration::ZERO,
            record_route_timeout: Duration::from_millis(250),
            indexer_admin_token: None,
            reservation_ttl: Duration::ZERO,
            models: [MODEL.to_string()].into(),
            loras: Default::default(),
            allow_client_chat_template: false,
        };
        let tokenizers = Tokenizers::new(&[(MODEL.to_string(), tokenizer_dir.to_path_buf())], None).unwrap();
        tokenizers.preload().await.unwrap();
        let indexer = IndexerPool::new(
            std::slice::from_ref(&service.grpc_addr),
            score_deadline,
            score_deadline / 2,
            Duration::from_secs(1),
        )
        .unwrap();
        indexer.warm_up();
        let router = Arc::new(Router::new(settings, tokenizers, indexer, fleet));
        World { service, sims, router }
    }

    /// Pod `pod` serves the chat's next turn; returns once the index has applied what it stored,
    /// with the assistant's answer and the next user message appended.
    pub async fn serve_turn(&self, pod: usize, messages: &mut Vec<Value>, turn: usize) {
        let pod = &self.sims.pods[pod % self.sims.pods.len()];
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": 8}).to_string();
        let (status, text) = http(&pod.http, "POST", "/v1/chat/completions", Some(&body)).await.expect("serve");
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        let next = sim_next_seq(&pod.http).await.unwrap();
        self.service.wait_applied(&pod.pod_id, next, Duration::from_secs(30)).await.expect("applied");
        messages.push(json!({"role": "assistant", "content": answer["choices"][0]["message"]["content"]}));
        messages.push(json!({"role": "user", "content": format!("Follow-up {turn}: and the trade-offs?")}));
    }
}
