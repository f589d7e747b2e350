//! Prefill this router sent a pod and has had no answer for is computed before whatever it
//! sends there next, so it counts in the cost as the wait it is (`queued_prefill_blocks`).
//! A burst of cold prompts sharing one cached prefix (a tenant's system prompt) spreads once
//! the holder's queued prefill outweighs what the prefix saves, while a follow-up turn whose
//! whole conversation is cached stays on its pod behind that queue. The pods are real
//! `kvindex-sim` engines prefilling 200 tokens a second, so nothing is answered while the test
//! looks. The control run (`--queued-prefill-weight 0`, the rule before) sends the burst to
//! the holder, so the test can fail.

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "sim/model";
/// The prefix every prompt shares: 8 blocks.
const SHARED: u32 = 128;

fn prompt(unique_seed: u32, unique_len: u32) -> Vec<u32> {
    (0..SHARED).map(|t| 10_000 + t).chain((0..unique_len).map(|t| 20_000 + 1_000 * unique_seed + t)).collect()
}

fn completion(prompt: &[u32], stream: bool) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": stream})
}

async fn queued(router: &str, pod: &str) -> u64 {
    router_pod(router, pod).await["load"]["queued_prefill_blocks"].as_u64().expect("queued_prefill_blocks")
}

async fn queued_total(router: &str, pods: &[String]) -> u64 {
    let mut total = 0;
    for pod in pods {
        total += queued(router, pod).await;
    }
    total
}

/// Where things went: the conversation's pod, the two cold siblings', and the router's
/// explanation for the follow-up while the first sibling was still being computed.
struct Outcome {
    home: String,
    siblings: [String; 2],
    follow_up_explained: Value,
    follow_up: String,
    /// The ranking the second sibling met (asked just before it was sent).
    second_explained: Value,
}

async fn play(bins: &Bins, router_flags: &[&str]) -> Outcome {
    let stack = Stack::start(bins, 3, &["--model", MODEL, "--prefill-tokens-per-s", "200"]).await;
    let mut args = stack.router_args();
    args.extend(["--scrape-interval-ms", "20", "--score-deadline-ms", "500"].map(String::from));
    args.extend(router_flags.iter().map(|s| s.to_string()));
    let router = router(bins, &args);
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&router.http, &ids).await;

    // A conversation's first turn: the shared prefix and 16 blocks of its own, now cached.
    let conversation = prompt(0, 256);
    let reply = post(&router.http, "/v1/completions", &completion(&conversation, false)).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let home = reply.pod().to_string();
    stack.settle().await;

    // Two cold prompts of 32 blocks sharing the 8-block prefix, one after the other.
    let send = |seed| {
        let (addr, body) = (router.http.clone(), completion(&prompt(seed, 384), true));
        tokio::spawn(async move { post(&addr, "/v1/completions", &body).await })
    };
    let first = send(1);
    wait_for("the first sibling to queue its prefill", DEADLINE, || async {
        (queued_total(&router.http, &ids).await >= 24).then_some(())
    })
    .await;
    assert_eq!(queued(&router.http, &home).await, 24, "the holder takes the first: 24 blocks to compute, not 32");
    let second_explained = post(&router.http, "/route/v1/completions", &completion(&prompt(2, 384), true)).await.json();
    let second = send(2);
    wait_for("the second sibling to queue its prefill", DEADLINE, || async {
        (queued_total(&router.http, &ids).await >= 48).then_some(())
    })
    .await;

    // The follow-up turn, one block more than the cached conversation.
    let mut follow_up = conversation.clone();
    follow_up.extend(30_000..30_016);
    let follow_up_explained = post(&router.http, "/route/v1/completions", &completion(&follow_up, false)).await.json();
    let reply = post(&router.http, "/v1/completions", &completion(&follow_up, false)).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let follow_up = reply.pod().to_string();

    let mut siblings = Vec::new();
    for task in [first, second] {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        siblings.push(reply.pod().to_string());
    }
    for id in &ids {
        assert_eq!(queued(&router.http, id).await, 0, "answered requests leave nothing queued on {id}");
    }
    Outcome {
        home,
        siblings: [siblings[0].clone(), siblings[1].clone()],
        follow_up_explained,
        follow_up,
        second_explained,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_prompts_sharing_a_cached_prefix_spread_once_its_pod_is_busy_computing_and_a_follow_up_stays() {
    let out = play(&bins(), &[]).await;
    assert_eq!(out.siblings[0], out.home, "an idle holder of the prefix is the cheapest");
    assert_ne!(
        out.siblings[1], out.home,
        "24 blocks to compute behind 24 queued (at half weight) cost more than 32 on an idle pod: {}",
        out.second_explained
    );
    let best = &out.follow_up_explained["ranked"][0];
    assert_eq!(best["pod"], out.home.as_str(), "{}", out.follow_up_explained);
    assert_eq!(best["cached_blocks"], 24);
    assert!(
        best["load"]["queued_prefill_blocks"].as_u64() >= Some(24),
        "the follow-up was placed while its pod still computed the first sibling: {}",
        out.follow_up_explained
    );
    assert_eq!(out.follow_up, out.home, "a follow-up's 24 cached blocks outweigh a 24-block queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_queued_prefill_term_the_burst_piles_onto_the_holder() {
    let out = play(&bins(), &["--queued-prefill-weight", "0"]).await;
    assert_eq!(out.siblings, [out.home.clone(), out.home.clone()]);
    assert_eq!(out.follow_up, out.home);
}
