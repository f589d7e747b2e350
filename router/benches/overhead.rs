//! Router overhead per request, upstream excluded: tokenize + ScoreTokens + pick, through the
//! library's pipeline (`Router::route`), for ~8k-token chats with the real 129k-vocabulary
//! DeepSeek tokenizer and chat template, against a real `kvindex serve` whose index holds the
//! conversations (published by `kvindex-sim` pods that served them).
//!
//! Two cases: the first time a chat is seen (everything tokenized), and its next turn (the
//! whole history again plus one question, as OpenAI clients send it). The tokenize stage is
//! split in two: `render` (the chat template alone, timed again right after the route on the
//! same messages) and `encode` (tokenize − render: the incremental tokenization and the hop off
//! the async workers).
//!
//! ```sh
//! source scripts/env.sh
//! cargo build --release -p kvindex-server --bin kvindex -p kvindex-loadtest --bin kvindex-sim
//! cargo bench -p kvindex-router --bench overhead            # CHATS=24 TURNS=4 to change the sample
//! ```
//!
//! Instructions per route, whatever else the machine runs (callgrind counts only the routes,
//! every thread of this process; `COUNT=first-seen` counts the first-seen routes instead):
//!
//! ```sh
//! CHATS=2 TURNS=3 valgrind --tool=callgrind --instr-atstart=no $CARGO_TARGET_DIR/release/deps/overhead-<hash>
//! ```

mod support;

use std::time::{Duration, Instant};

use kvindex_router::{Decision, Prompt, RouteRequest, Router};
use kvindex_testkit::callgrind;
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
    render: Vec<u64>,
    encode: Vec<u64>,
    score: Vec<u64>,
    pick: Vec<u64>,
    tokens: Vec<usize>,
    matched: Vec<u32>,
}

impl Samples {
    fn add(&mut self, (d, render_us): &(Decision, u64)) {
        self.total.push(d.timings.total_us);
        self.tokenize.push(d.timings.tokenize_us);
        self.render.push(*render_us);
        self.encode.push(d.timings.tokenize_us.saturating_sub(*render_us));
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
            "{name:<10} n={:<4} tokens≈{tokens:<5} matched≈{matched:<4} total p50 {:.3} ms p99 {:.3} ms | tokenize p50 {:.3} p99 {:.3} (render p50 {:.3} p99 {:.3}, encode p50 {:.3} p99 {:.3}) | score p50 {:.3} p99 {:.3} | pick p50 {:.3} p99 {:.3}",
            self.total.len(),
            pct(&mut self.total, 0.5),
            pct(&mut self.total, 0.99),
            pct(&mut self.tokenize, 0.5),
            pct(&mut self.tokenize, 0.99),
            pct(&mut self.render, 0.5),
            pct(&mut self.render, 0.99),
            pct(&mut self.encode, 0.5),
            pct(&mut self.encode, 0.99),
            pct(&mut self.score, 0.5),
            pct(&mut self.score, 0.99),
            pct(&mut self.pick, 0.5),
            pct(&mut self.pick, 0.99),
        );
    }
}

/// Under callgrind, which routes are counted: `next-turn` (default) or `first-seen`.
fn counted_case() -> String {
    std::env::var("COUNT").unwrap_or_else(|_| "next-turn".into())
}

/// One route, counted by callgrind when `counted` (and the bench runs under it), and the
/// microseconds its chat template takes to render alone (timed right after, uncounted).
async fn route(router: &Router, messages: &[Value], counted: bool) -> (Decision, u64) {
    let request = request(messages);
    if counted {
        callgrind::start();
    }
    let decision = router.route(&request).await.expect("route");
    if counted {
        callgrind::stop();
    }
    let Prompt::Chat(chat) = &request.prompt else { unreachable!("the bench sends chats") };
    let registry = router.tokenizers().registry().expect("the in-process tokenizer");
    let started = Instant::now();
    registry.render_chat_text(MODEL, chat).expect("render");
    (decision, started.elapsed().as_micros() as u64)
}

fn main() {
    let Some((dir, kvindex, sim)) = support::locate() else { return };
    let (chats, turns) = (env_usize("CHATS", 24), env_usize("TURNS", 4));
    // Under valgrind everything runs ~50x slower: a 5 ms deadline would fail every score open.
    let valgrind = callgrind::running();
    let deadline = Duration::from_millis(if valgrind { 60_000 } else { 5 });
    let case = counted_case();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let world = World::start(&dir, &kvindex, &sim, deadline).await;
        let router = &world.router;
        let (mut first_seen, mut next_turn) = (Samples::default(), Samples::default());
        // Warm-up: a few untimed routes.
        for seed in 0..3 {
            let _ = router.route(&request(&chat(10_000 + seed, 27_000))).await;
        }
        for seed in 0..chats {
            let mut messages = chat(seed, 27_000);
            first_seen.add(&route(router, &messages, case == "first-seen").await);
            for turn in 0..turns {
                // The pod serves the turn, so the index learns the conversation.
                world.serve_turn(seed, &mut messages, turn).await;
                next_turn.add(&route(router, &messages, case == "next-turn").await);
            }
        }
        if valgrind {
            let n = if case == "first-seen" { chats } else { chats * turns };
            callgrind::dump(&format!("{case} routes: {n}"));
            println!("callgrind: counted {n} {case} routes (divide the totals by {n})");
        }
        println!("router overhead (tokenize + ScoreTokens + pick), DeepSeek 129k tokenizer, kvindex serve on loopback");
        first_seen.print("first-seen");
        next_turn.print("next-turn");
    });
}
