//! A multi-turn chat, tokenized by the router exactly as the pods tokenize it (the deepseek
//! tokenizer and chat template on both sides), sticks to the pod that holds its prefix, turn
//! after turn, as the pods' own `cached_tokens` confirm, until that pod's load, or its KV-cache
//! usage, makes another pod cheaper. With the default weights it stays through the few running
//! requests of ordinary traffic on small pods and big ones alike (the KV term scales with the
//! pod's capacity, which the router reads from `vllm:cache_config_info`), and leaves a pod
//! where requests queue.

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "deepseek-sim";

struct Chat {
    messages: Vec<Value>,
}

impl Chat {
    fn new(seed: usize) -> Chat {
        Chat::with_system(seed, 12)
    }

    /// A system prompt of about `repeats` × 16 tokens.
    fn with_system(seed: usize, repeats: usize) -> Chat {
        let system = format!(
            "You are assistant number {seed}. {}",
            "Answer briefly and precisely, citing the relevant section of the manual when you can. ".repeat(repeats)
        );
        Chat { messages: vec![json!({"role": "system", "content": system})] }
    }

    fn ask(&mut self, turn: usize) -> Value {
        self.messages.push(json!({"role": "user", "content": format!("Question {turn}: how do I configure feature {turn} of the router? Please explain the trade-offs.")}));
        json!({"model": MODEL, "messages": self.messages, "max_tokens": 6})
    }

    fn answered(&mut self, reply: &Reply) {
        let content = reply.json()["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string();
        self.messages.push(json!({"role": "assistant", "content": content}));
    }
}

async fn start(bins: &Bins, extra_sim: &[&str], extra_router: &[&str]) -> Option<(Stack, RouterProcess)> {
    let dir = deepseek_dir()?;
    let dir = dir.to_str().unwrap().to_string();
    let mut sim_args = vec!["--model", MODEL, "--tokenizer", &dir, "--decode-ms-per-token", "20"];
    sim_args.extend_from_slice(extra_sim);
    let stack = Stack::start(bins, 3, &sim_args).await;
    let mut args = stack.router_args();
    args.extend(["--tokenizer".to_string(), format!("{MODEL}={dir}"), "--scrape-interval-ms".into(), "20".into()]);
    // A generous deadline: these tests are about placement, not a debug build's latency.
    args.extend(["--score-deadline-ms".to_string(), "500".into()]);
    args.extend(extra_router.iter().map(|s| s.to_string()));
    let router = router(bins, &args);
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&router.http, &ids).await;
    Some((stack, router))
}

/// Plays `turns` turns; every turn after the first must land on the first turn's pod and hit
/// there. Returns that pod.
async fn sticky_turns(stack: &Stack, router: &str, chat: &mut Chat, turns: std::ops::Range<usize>) -> String {
    let mut home: Option<String> = None;
    for turn in turns {
        stack.settle().await;
        let reply = post(router, "/v1/chat/completions", &chat.ask(turn)).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        let pod = reply.pod().to_string();
        let matched: u64 = reply.header("x-kvindex-matched-blocks").unwrap().parse().unwrap();
        match &home {
            None => home = Some(pod),
            Some(home) => {
                assert_eq!(&pod, home, "turn {turn} left the pod holding its prefix");
                assert!(matched > 0, "turn {turn}: the index saw the earlier turns");
                let cached = reply.cached_tokens();
                assert_eq!(cached, matched * BLOCK as u64, "turn {turn}: the engine's own hit equals the prediction");
            }
        }
        chat.answered(&reply);
    }
    home.unwrap()
}

/// Opens `count` long streaming requests directly on a pod, each with a `prompt_len`-token
/// prompt, and keeps them running (the tasks are aborted when dropped).
fn occupy(pod: &SimPod, count: usize, prompt_len: u32, max_tokens: u32) -> Vec<tokio::task::JoinHandle<()>> {
    (0..count)
        .map(|i| {
            let http = pod.http.clone();
            tokio::spawn(async move {
                let prompt: Vec<u32> = (0..prompt_len).map(|t| 50_000 + 1000 * i as u32 + t).collect();
                let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": true});
                let reply = post(&http, "/v1/completions", &body).await;
                assert_eq!(reply.status, 200, "{:?}", reply.body);
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_sticks_to_its_pod_until_load_makes_another_cheaper() {
    let bins = bins();
    let Some((stack, router)) = start(&bins, &[], &["--decode-weight", "16"]).await else { return };
    let mut chat = Chat::new(1);
    let home = sticky_turns(&stack, &router.http, &mut chat, 0..4).await;

    // Load: enough requests running on the home pod that its cached prefix no longer pays.
    stack.settle().await;
    let explained = post(&router.http, "/route/v1/chat/completions", &chat.ask(4)).await.json();
    chat.messages.pop();
    let cached = explained["ranked"][0]["cached_blocks"].as_f64().unwrap();
    let busy = (cached / 16.0).ceil() as usize + 2;
    let background = occupy(stack.pod(&home), busy, 32, 3000);
    wait_for("the router to see the load", DEADLINE, || async {
        (router_pod(&router.http, &home).await["load"]["load"].as_f64() >= Some(busy as f64)).then_some(())
    })
    .await;
    let reply = post(&router.http, "/v1/chat/completions", &chat.ask(4)).await;
    assert_eq!(reply.status, 200);
    assert_ne!(reply.pod(), home, "{busy} running requests outweigh {cached} cached blocks");
    for task in background {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_leaves_a_pod_whose_kv_cache_is_nearly_full() {
    let bins = bins();
    // 300 blocks of 16 per pod; the cutoff at 30%; no KV term in the cost, so that only the
    // cutoff can move the conversation.
    let Some((stack, router)) =
        start(&bins, &["--kv-blocks", "300"], &["--kv-cutoff", "0.3", "--kv-weight", "0"]).await
    else {
        return;
    };
    let mut chat = Chat::new(2);
    let home = sticky_turns(&stack, &router.http, &mut chat, 0..3).await;

    // One running request holding ~120 blocks: load +1 (not enough to move by cost), KV 40%.
    let background = occupy(stack.pod(&home), 1, 1920, 2000);
    wait_for("the router to see the KV usage", DEADLINE, || async {
        (router_pod(&router.http, &home).await["load"]["kv_usage"].as_f64() >= Some(0.3)).then_some(())
    })
    .await;
    let explained = post(&router.http, "/route/v1/chat/completions", &chat.ask(3)).await.json();
    chat.messages.pop();
    let home_entry =
        explained["ranked"].as_array().unwrap().iter().find(|c| c["pod"] == home.as_str()).unwrap().clone();
    let others_cost = explained["ranked"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["pod"] != home.as_str())
        .map(|c| c["cost"].as_f64().unwrap());
    assert!(
        others_cost.fold(f64::INFINITY, f64::min) > home_entry["cost"].as_f64().unwrap(),
        "by cost alone it would stay: {explained}"
    );
    assert_eq!(home_entry["over_kv_cutoff"], true);
    let reply = post(&router.http, "/v1/chat/completions", &chat.ask(3)).await;
    assert_eq!(reply.status, 200);
    assert_ne!(reply.pod(), home, "the cutoff moves it off a nearly full pod");
    for task in background {
        task.abort();
    }
}

/// Load put on the home pod: `add` long requests more, and what the router must see there
/// before it is asked (`running`, `waiting`).
struct Load {
    add: usize,
    running: usize,
    waiting: usize,
}

/// Adds `load.add` long requests of 80 blocks each on the home pod and waits until the router
/// sees `load.running` and `load.waiting` there, then returns the router's explanation for the
/// next turn and the home pod's entry in it. (The busy pod publishes a block every few steps,
/// so the index cannot be waited on here: settle before.)
async fn explain_with_load(
    stack: &Stack,
    router: &str,
    chat: &mut Chat,
    home: &str,
    turn: usize,
    load: Load,
) -> (Vec<tokio::task::JoinHandle<()>>, Value, Value) {
    let Load { add, running, waiting } = load;
    let background = occupy(stack.pod(home), add, 1280, 3000);
    wait_for("the router to see the load", DEADLINE, || async {
        let load = router_pod(router, home).await["load"].clone();
        (load["running"].as_f64() >= Some(running as f64) && load["waiting"].as_f64() >= Some(waiting as f64))
            .then_some(())
    })
    .await;
    let explained = post(router, "/route/v1/chat/completions", &chat.ask(turn)).await.json();
    chat.messages.pop();
    let entry = explained["ranked"].as_array().unwrap().iter().find(|c| c["pod"] == home).unwrap().clone();
    (background, explained, entry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_stays_on_a_small_pod_running_a_few_requests_and_leaves_it_when_requests_queue() {
    let bins = bins();
    // The pods: 1,280 blocks of 16 tokens; at most 5 running, so extra requests queue.
    let Some((stack, router)) = start(&bins, &["--kv-blocks", "1280", "--max-num-seqs", "5"], &[]).await else {
        return;
    };
    // About 35 cached blocks by the fourth turn: more than the scaled load below, less than
    // the unscaled one.
    let mut chat = Chat::with_system(3, 30);
    let home = sticky_turns(&stack, &router.http, &mut chat, 0..3).await;
    stack.settle().await;

    // Four ordinary requests running there: a quarter of this small cache.
    let (background, explained, entry) =
        explain_with_load(&stack, &router.http, &mut chat, &home, 3, Load { add: 4, running: 4, waiting: 0 }).await;
    let (kv_usage, cached) = (entry["load"]["kv_usage"].as_f64().unwrap(), entry["cached_blocks"].as_f64().unwrap());
    assert!(kv_usage >= 0.25, "{entry}");
    // The point of the scaling: unscaled, the KV term alone would outweigh the cached prefix.
    assert!(256.0 * kv_usage > cached, "unscaled, {kv_usage} × 256 outweighs {cached} cached blocks: {explained}");
    let reply = post(&router.http, "/v1/chat/completions", &chat.ask(3)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.pod(), home, "4 running requests on a 1,280-block pod do not move the conversation: {explained}");
    assert_eq!(reply.cached_tokens(), cached as u64 * BLOCK as u64, "and it hits there");
    chat.answered(&reply);
    // Explained: the capacity read from the pod's /metrics, the weight scaled by it.
    assert_eq!(entry["load"]["kv_tokens"], 1280 * 16, "{entry}");
    let kv_weight = entry["kv_weight"].as_f64().unwrap();
    assert!((kv_weight - 256.0 * 1280.0 / 10_000.0).abs() < 1e-6, "{entry}");
    assert!((entry["kv_cost"].as_f64().unwrap() - kv_weight * kv_usage).abs() < 1e-6, "{entry}");

    // Three more: five running (the pod's limit) and two waiting. That is overload.
    let (more, explained, entry) =
        explain_with_load(&stack, &router.http, &mut chat, &home, 4, Load { add: 3, running: 5, waiting: 2 }).await;
    assert!(entry["load"]["waiting"].as_f64() >= Some(2.0), "{entry}");
    let reply = post(&router.http, "/v1/chat/completions", &chat.ask(4)).await;
    assert_eq!(reply.status, 200);
    assert_ne!(reply.pod(), home, "a pod with requests queued loses the conversation: {explained}");
    for task in background.into_iter().chain(more) {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_stays_on_a_big_pod_running_a_few_requests() {
    let bins = bins();
    let Some((stack, router)) = start(&bins, &["--kv-blocks", "20000"], &[]).await else { return };
    let mut chat = Chat::with_system(4, 30);
    let home = sticky_turns(&stack, &router.http, &mut chat, 0..3).await;
    stack.settle().await;
    let (background, explained, entry) =
        explain_with_load(&stack, &router.http, &mut chat, &home, 3, Load { add: 4, running: 4, waiting: 0 }).await;
    assert_eq!(entry["load"]["kv_tokens"], 20000 * 16, "{entry}");
    assert_eq!(entry["kv_weight"], 256.0, "a pod above the reference size pays the full weight: {entry}");
    let reply = post(&router.http, "/v1/chat/completions", &chat.ask(3)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.pod(), home, "{explained}");
    assert_eq!(reply.cached_tokens(), entry["cached_blocks"].as_u64().unwrap() * BLOCK as u64);
    for task in background {
        task.abort();
    }
}
