//! Active-active replicas share nothing but the indexer, and break ties by rendezvous hashing,
//! so four routers taking turns on the same conversations place them as well as one router
//! does: the engines' own cached-token counts give the same hit rate within 2%.

use crate::support::*;
use serde_json::json;

const CONVERSATIONS: u32 = 12;
const TURNS: usize = 5;

/// Plays every conversation through `routers` (turn t of conversation c through router
/// (c + t) mod n), all conversations of a round at once, and returns cached / prompt tokens.
async fn hit_rate(stack: &Stack, routers: &[RouterProcess]) -> f64 {
    let shared: Vec<u32> = (0..64).map(|t| 100 + t).collect();
    let mut histories: Vec<Vec<u32>> = (0..CONVERSATIONS)
        .map(|c| shared.iter().copied().chain((0..200).map(|t| 10_000 * (c + 1) + t)).collect())
        .collect();
    let (mut cached, mut prompt) = (0u64, 0u64);
    for turn in 0..TURNS {
        stack.settle().await;
        let mut round = Vec::new();
        for (c, history) in histories.iter_mut().enumerate() {
            history.extend((0..40).map(|t| 500_000 + 1000 * turn as u32 + t));
            let body = json!({"model": "sim/model", "prompt": history, "max_tokens": 8, "return_token_ids": true});
            let router = routers[(c + turn) % routers.len()].http.clone();
            round.push(tokio::spawn(async move { post(&router, "/v1/completions", &body).await }));
        }
        for (c, task) in round.into_iter().enumerate() {
            let reply = task.await.expect("request task");
            assert_eq!(reply.status, 200, "{:?}", reply.body);
            cached += reply.cached_tokens();
            prompt += reply.prompt_tokens();
            let answer: Vec<u32> = serde_json::from_value(reply.json()["choices"][0]["token_ids"].clone()).unwrap();
            histories[c].extend(answer);
        }
    }
    cached as f64 / prompt as f64
}

async fn run(bins: &Bins, replicas: usize) -> f64 {
    let stack = Stack::start(bins, 4, &["--model", "sim/model", "--time-scale", "100"]).await;
    let mut args = stack.router_args();
    // A generous deadline: this test is about placement, not a debug build's latency under a burst.
    // RecordRoute off: its credit is recorded in the background, so whether a request of the
    // same concurrent round sees a sibling's credit is a race, which moved both runs by ±3%.
    // What this test measures is the shared exact index; sibling_burst.rs tests the credit.
    args.extend(
        ["--scrape-interval-ms", "20", "--score-deadline-ms", "500", "--speculative-ttl-ms", "0"].map(String::from),
    );
    let routers: Vec<RouterProcess> = (0..replicas).map(|_| router(bins, &args)).collect();
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    for router in &routers {
        wait_scraped(&router.http, &ids).await;
    }
    hit_rate(&stack, &routers).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_hit_as_well_as_one() {
    let bins = bins();
    let one = run(&bins, 1).await;
    let four = run(&bins, 4).await;
    eprintln!("hit rate: 1 replica {one:.4}, 4 replicas {four:.4}");
    assert!(one > 0.6, "the conversations hit their prefixes: {one}");
    assert!((one - four).abs() <= 0.02 * one, "1 replica {one:.4} vs 4 replicas {four:.4}");
}
