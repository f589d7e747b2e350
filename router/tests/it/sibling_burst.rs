//! Predict on route: the same new prefix reaching two router replicas before the engine has
//! published any `BlockStored` for it goes to the same pod, because the first replica's pick
//! is recorded in the indexer (RecordRoute) and the second sees it as `speculative_blocks`.
//!
//! Without the prediction the second replica, which has scraped the first pick's load off the
//! chosen pod, places the copy elsewhere and the prefix is computed twice: the control run
//! (`--speculative-ttl-ms 0`) shows that, so the test can fail. RecordRoute takes the indexer's
//! admin token: routers holding a wrong one are refused (counted on both sides) and predict
//! nothing.

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "sim/model";

/// How the routers of a burst authenticate RecordRoute.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Token {
    /// The indexer's admin token (what `Stack::router_args` gives).
    Right,
    /// Another token: the indexer refuses every RecordRoute.
    Wrong,
}

/// Starts 4 slow-prefilling pods and routers `a` and `b`, sends a new 256-token prompt through
/// `a`, waits until `b` has scraped the chosen pod busy, and returns (a's pod, b's decision).
async fn burst(bins: &Bins, speculative_ttl_ms: &str, token: Token) -> (String, Value) {
    // 40 prompt tokens per second: the burst's prefill takes ~6 s, so no BlockStored of it
    // can reach the indexer while the test looks.
    let stack = Stack::start(bins, 4, &["--model", MODEL, "--prefill-tokens-per-s", "40"]).await;
    // Every pod publishes once (a 16-token prompt of its own), so the indexer knows its source.
    for (i, pod) in stack.sim.pods.iter().enumerate() {
        let prompt: Vec<u32> = (0..16).map(|t| 900_000 + 100 * i as u32 + t).collect();
        let reply =
            post(&pod.http, "/v1/completions", &json!({"model": MODEL, "prompt": prompt, "max_tokens": 1})).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
    }
    stack.settle().await;

    let mut args = stack.router_args();
    let wrong = std::env::temp_dir().join(format!("kvindex-router-wrong-token-{}", std::process::id()));
    if token == Token::Wrong {
        std::fs::write(&wrong, "not-the-indexers-admin-token").unwrap();
        let at = args.iter().position(|a| a == "--indexer-admin-token-file").expect("router_args passes the token");
        args[at + 1] = wrong.to_string_lossy().into_owned();
    }
    args.extend(["--scrape-interval-ms", "20", "--score-deadline-ms", "500", "--speculative-ttl-ms"].map(String::from));
    args.push(speculative_ttl_ms.to_string());
    let (a, b) = (router(bins, &args), router(bins, &args));
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&a.http, &ids).await;
    wait_scraped(&b.http, &ids).await;

    let prompt: Vec<u32> = (0..256).map(|t| 7_000 + t).collect();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4});
    let first = {
        let (addr, body) = (a.http.clone(), body.clone());
        tokio::spawn(async move { post(&addr, "/v1/completions", &body).await })
    };
    // The pick, as `a` sees it (the request itself is still prefilling).
    let home = wait_for("router a to send the request", DEADLINE, || {
        let a = a.http.clone();
        let ids = ids.clone();
        async move {
            for id in &ids {
                if router_pod(&a, id).await["load"]["inflight"].as_u64() == Some(1) {
                    return Some(id.clone());
                }
            }
            None
        }
    })
    .await;
    wait_for("router b to scrape the busy pod", DEADLINE, || {
        let (b, home) = (b.http.clone(), home.clone());
        async move { (router_pod(&b, &home).await["load"]["running"].as_f64() >= Some(1.0)).then_some(()) }
    })
    .await;
    if speculative_ttl_ms != "0" {
        let outcome = if token == Token::Right { "ok" } else { "denied" };
        wait_for("router a's RecordRoute", DEADLINE, || {
            let a = a.http.clone();
            async move { (metric(&a, "kvindex_router_record_route_total", &[outcome]).await >= 1.0).then_some(()) }
        })
        .await;
    }
    if token == Token::Wrong {
        let refused = metric(&stack.kv.http_addr, "kvindex_record_route_requests_total", &["wrong_token"]).await;
        assert!(refused >= 1.0, "the indexer counts the refusal");
        let _ = std::fs::remove_file(&wrong);
    }
    let decision = post(&b.http, "/route/v1/completions", &body).await;
    assert_eq!(decision.status, 200, "{:?}", decision.body);
    drop(first);
    (home, decision.json())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sibling_burst_lands_on_the_pod_of_the_first_pick() {
    let bins = bins();
    let (home, decision) = burst(&bins, "5000", Token::Right).await;
    let best = &decision["ranked"][0];
    assert_eq!(best["pod"], home.as_str(), "router b follows router a's pick: {decision}");
    assert_eq!(best["matched_blocks"], 0, "nothing announced yet: the credit is speculative: {decision}");
    // The prompt is 16 whole blocks: the engine computes its last token, so it can reuse 15.
    assert_eq!(best["speculative_blocks"], 15, "every block of the prompt but the last is credited: {decision}");
    for other in decision["ranked"].as_array().unwrap().iter().skip(1) {
        assert_eq!(other["speculative_blocks"], 0, "only the picked pod is credited: {decision}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_record_route_the_sibling_goes_elsewhere() {
    let bins = bins();
    let (home, decision) = burst(&bins, "0", Token::Right).await;
    let best = &decision["ranked"][0];
    assert_ne!(best["pod"], home.as_str(), "the busy pod costs more when nothing is predicted: {decision}");
    assert_eq!(best["speculative_blocks"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_wrong_token_record_route_is_refused_and_predicts_nothing() {
    let bins = bins();
    let (home, decision) = burst(&bins, "5000", Token::Wrong).await;
    let best = &decision["ranked"][0];
    assert_ne!(best["pod"], home.as_str(), "nothing was credited, so the busy pod costs more: {decision}");
    for pod in decision["ranked"].as_array().unwrap() {
        assert_eq!(pod["speculative_blocks"], 0, "{decision}");
    }
}
