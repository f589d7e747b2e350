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

mod support;

use std::time::Duration;

use kvindex_router::{Decision, Prompt, RouteRequest};
use kvindex_tokenizer::ChatRequest;
use serde_json::Value;
use support::{chat, env_usize, World, MODEL};

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

fn main() {
    let Some((dir, kvindex, sim)) = support::locate() else { return };
    let (chats, turns) = (env_usize("CHATS", 24), env_usize("TURNS", 4));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let world = World::start(&dir, &kvindex, &sim, Duration::from_millis(5)).await;
        let router = &world.router;
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
                world.serve_turn(seed, &mut messages, turn).await;
                let decision = router.route(&request(&messages)).await.expect("route");
                next_turn.add(&decision);
            }
        }
        println!("router overhead (tokenize + ScoreTokens + pick), DeepSeek 129k tokenizer, kvindex serve on loopback");
        first_seen.print("first-seen");
        next_turn.print("next-turn");
    });
}
