//! The index only improves placements, so losing it must never fail a request: with the
//! indexer hung (SIGSTOP: connections open, no answers) or dead, every request still gets its
//! answer, placed by load, within the score deadline; a hung indexer costs a few deadlines
//! (three in a row take it out of rotation), not one per request; it is taken back once it answers; with two indexers the live one answers.

use std::time::{Duration, Instant};

use crate::support::*;
use serde_json::json;

const DEADLINE_MS: u64 = 20;

fn prompt(n: u32) -> serde_json::Value {
    json!({"model": "sim/model", "prompt": (0..48).map(|i| 1000 * n + i).collect::<Vec<u32>>(), "max_tokens": 2})
}

/// Asks where a prompt would go (`/route`, which reports the score stage's time), then sends
/// it through the proxy, which must succeed. Returns both score outcomes and the stage's time.
async fn send(router: &str, n: u32) -> ([String; 2], Duration) {
    let explained = post(router, "/route/v1/completions", &prompt(n)).await;
    assert_eq!(explained.status, 200, "{:?}", explained.body);
    let decision = explained.json();
    let score_us = decision["timings"]["score_us"].as_u64().unwrap();
    let explained_outcome = match decision["score"]["outcome"].as_str() {
        Some("scored") => "ok".to_string(),
        _ => decision["score"]["reason"].as_str().unwrap().to_string(),
    };
    let started = Instant::now();
    let reply = post(router, "/v1/completions", &prompt(n)).await;
    assert_eq!(reply.status, 200, "no client errors: {:?}", reply.body);
    assert!(started.elapsed() < Duration::from_secs(5), "the request did not wait for the indexer");
    ([explained_outcome, reply.header("x-kvindex-score").unwrap().to_string()], Duration::from_micros(score_us))
}

/// Within the deadline, with room for a loaded 2-core box (a hang would be unbounded).
fn within_deadline(took: Duration, deadline_ms: u64) -> bool {
    took < Duration::from_millis(deadline_ms + 1_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_or_dead_indexer_fails_open_within_the_deadline() {
    let bins = bins();
    let mut stack = Stack::start(&bins, 2, &["--model", "sim/model", "--time-scale", "100"]).await;
    let mut args = stack.router_args();
    args.extend(["--score-deadline-ms", &DEADLINE_MS.to_string(), "--indexer-retry-after-ms", "200"].map(String::from));
    let router = router(&bins, &args);
    let mut n = 0;
    wait_for("the indexer to answer", DEADLINE, || {
        n += 1;
        let router = router.http.clone();
        async move { (send(&router, n).await.0[1] == "ok").then_some(()) }
    })
    .await;

    stack.kv.process.stop().unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..8 {
        n += 1;
        let (outcome, took) = send(&router.http, n).await;
        assert!(within_deadline(took, DEADLINE_MS), "score stage took {took:?} with the indexer hung");
        outcomes.extend(outcome);
    }
    assert!(outcomes.iter().all(|o| o == "timeout" || o == "indexer_down"), "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| *o == "timeout").count(), 3, "three deadlines, then skipped: {outcomes:?}");
    assert!(outcomes[3..].iter().all(|o| o == "indexer_down"), "{outcomes:?}");
    assert!(metric(&router.http, "kvindex_router_fail_open_total", &["reason=\"indexer_down\""]).await >= 13.0);

    stack.kv.process.signal("CONT").unwrap();
    wait_for("the indexer to be taken back", DEADLINE, || {
        n += 1;
        let router = router.http.clone();
        async move { (send(&router, n).await.0[1] == "ok").then_some(()) }
    })
    .await;

    stack.kv.process.kill();
    for _ in 0..5 {
        n += 1;
        let (outcome, took) = send(&router.http, n).await;
        assert!(within_deadline(took, DEADLINE_MS), "score stage took {took:?} with the indexer dead");
        assert!(outcome.iter().all(|o| o != "ok"), "{outcome:?}");
    }
    drop(stack);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_indexers_the_live_one_answers_when_the_first_hangs() {
    let bins = bins();
    let stack = Stack::start(&bins, 2, &["--model", "sim/model", "--time-scale", "100"]).await;
    let spare = KvindexService::start(&bins.kvindex, BLOCK).expect("second kvindex serve");
    let mut args = stack.router_args();
    args.splice(1..2, [stack.kv.grpc_addr.clone(), spare.grpc_addr.clone()]);
    // The hedge asks the spare after half the deadline; a debug build on a loaded box needs
    // the other half to answer.
    const FAILOVER_DEADLINE_MS: u64 = 200;
    args.extend(["--score-deadline-ms", &FAILOVER_DEADLINE_MS.to_string()].map(String::from));
    let router = router(&bins, &args);
    let mut n = 0;
    wait_for("the first indexer to answer", DEADLINE, || {
        n += 1;
        let router = router.http.clone();
        async move { (send(&router, n).await.0[1] == "ok").then_some(()) }
    })
    .await;
    stack.kv.process.stop().unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        n += 1;
        let (outcome, took) = send(&router.http, n).await;
        assert!(within_deadline(took, FAILOVER_DEADLINE_MS), "{took:?}");
        outcomes.extend(outcome);
    }
    assert!(outcomes.iter().all(|o| o == "ok"), "the second indexer answered every time: {outcomes:?}");
    let spare_label = format!("endpoint=\"{}\"", spare.grpc_addr);
    assert!(
        metric(&router.http, "kvindex_router_score_attempts_total", &[&spare_label, "outcome=\"ok\""]).await >= 12.0
    );
    stack.kv.process.signal("CONT").unwrap();
}
