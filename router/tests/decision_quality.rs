//! The decision-quality metrics, through the real router in front of real `kvindex-sim` pods and
//! a real `kvindex serve`: whether each pick reused the best cached prefix on offer
//! (`kvindex_router_overlap_picks_total`), the cached blocks given up when load outweighed it
//! (`kvindex_router_overlap_given_up_blocks`, `kvindex_router_best_cached_blocks_total`), and the
//! engine's own `cached_tokens` against the router's prediction, read from JSON bodies and SSE
//! streams as they pass (`kvindex_router_cache_prediction_total`, `kvindex_router_engine_*`).

mod support;

use serde_json::{json, Value};
use support::*;

const MODEL: &str = "sim/model";

/// `blocks` full blocks and one token more, all distinct to `seed`.
fn prompt(seed: u32, blocks: usize) -> Vec<u32> {
    (0..blocks * BLOCK + 1).map(|t| seed * 100_000 + t as u32).collect()
}

/// `base`'s first `blocks` blocks followed by `extra` new tokens.
fn extend(base: &[u32], blocks: usize, extra: usize, seed: u32) -> Vec<u32> {
    let mut p = base[..blocks * BLOCK].to_vec();
    p.extend((0..extra).map(|t| 90_000_000 + seed * 1000 + t as u32));
    p
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Quality {
    best: f64,
    below_best: f64,
    no_overlap: f64,
    unscored: f64,
    best_blocks: f64,
    given_up_count: f64,
    given_up_sum: f64,
    given_up_zero: f64,
    exact: f64,
    over: f64,
    under: f64,
    unreported: f64,
    engine_cached: f64,
    engine_prompt: f64,
    predicted: f64,
}

impl Quality {
    /// A pick of the pod with the most cached blocks on offer (`blocks`), none given up.
    fn best_pick(&mut self, blocks: f64) {
        self.best += 1.0;
        self.best_blocks += blocks;
        self.given_up_count += 1.0;
        self.given_up_zero += 1.0;
    }

    /// The engine reported its usage for a `prompt_len`-token prompt and hit exactly the
    /// `cached` tokens the router predicted.
    fn exactly_predicted(&mut self, cached: f64, prompt_len: usize) {
        self.exact += 1.0;
        self.engine_cached += cached;
        self.predicted += cached;
        self.engine_prompt += prompt_len as f64;
    }
}

async fn quality(router: &str) -> Quality {
    let picks = "kvindex_router_overlap_picks_total";
    let prediction = "kvindex_router_cache_prediction_total";
    let given_up = "kvindex_router_overlap_given_up_blocks";
    Quality {
        best: metric(router, picks, &["outcome=\"best\""]).await,
        below_best: metric(router, picks, &["outcome=\"below_best\""]).await,
        no_overlap: metric(router, picks, &["outcome=\"no_overlap\""]).await,
        unscored: metric(router, picks, &["outcome=\"unscored\""]).await,
        best_blocks: metric(router, "kvindex_router_best_cached_blocks_total", &[]).await,
        given_up_count: metric(router, &format!("{given_up}_count"), &[]).await,
        given_up_sum: metric(router, &format!("{given_up}_sum"), &[]).await,
        given_up_zero: metric(router, &format!("{given_up}_bucket"), &["le=\"0\""]).await,
        exact: metric(router, prediction, &["outcome=\"exact\""]).await,
        over: metric(router, prediction, &["outcome=\"over\""]).await,
        under: metric(router, prediction, &["outcome=\"under\""]).await,
        unreported: metric(router, prediction, &["outcome=\"unreported\""]).await,
        engine_cached: metric(router, "kvindex_router_engine_cached_tokens_total", &[]).await,
        engine_prompt: metric(router, "kvindex_router_engine_prompt_tokens_total", &[]).await,
        predicted: metric(router, "kvindex_router_predicted_cached_tokens_total", &[]).await,
    }
}

/// Waits until the metrics equal `expected` (a response's usage is counted when the router
/// reads the end of its body, which may come just after the client has all its bytes).
async fn expect(router: &str, expected: Quality, what: &str) {
    let mut last = Quality::default();
    let found = tokio::time::timeout(DEADLINE, async {
        loop {
            last = quality(router).await;
            if last == expected {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(found.is_ok(), "{what}:\n expected {expected:?}\n      got {last:?}");
}

async fn complete(router: &str, prompt: &[u32], stream: Option<bool>) -> Reply {
    let mut body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4});
    if let Some(include_usage) = stream {
        body["stream"] = Value::Bool(true);
        body["stream_options"] = json!({"include_usage": include_usage});
    }
    let reply = post(router, "/v1/completions", &body).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_overlap_picks_blocks_given_up_and_achieved_against_predicted_reuse_are_counted() {
    let bins = bins();
    // At most two running per pod, so a few long requests make a pod queue.
    let mut stack = Stack::start(&bins, 3, &["--model", MODEL, "--max-num-seqs", "2"]).await;
    let mut args = stack.router_args();
    args.extend(["--scrape-interval-ms", "20", "--score-deadline-ms", "500"].map(String::from));
    let router = router(&bins, &args);
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&router.http, &ids).await;
    let r = router.http.as_str();
    let mut want = Quality::default();

    // A prompt no pod has seen: nothing to reuse, nothing predicted, nothing cached.
    let a = prompt(1, 8);
    let first = complete(r, &a, None).await;
    let home = first.pod().to_string();
    want.no_overlap += 1.0;
    want.exactly_predicted(0.0, a.len());
    expect(r, want, "a cold prompt").await;

    // Its follow-up on the pod holding its 8 blocks: a best pick, the engine hits what was
    // predicted.
    stack.settle().await;
    let b = extend(&a, 8, 40, 1);
    let reply = complete(r, &b, None).await;
    assert_eq!(reply.pod(), home);
    assert_eq!(reply.cached_tokens(), 128);
    want.best_pick(8.0);
    want.exactly_predicted(128.0, b.len());
    expect(r, want, "a follow-up on its pod").await;

    // Streamed, with usage in the last chunk: read from the SSE as it passes.
    stack.settle().await;
    let c = extend(&a, 8, 50, 2);
    assert_eq!(complete(r, &c, Some(true)).await.pod(), home);
    want.best_pick(8.0);
    want.exactly_predicted(128.0, c.len());
    expect(r, want, "a streamed follow-up with usage").await;

    // Streamed without usage: the pick counts, the prediction cannot be checked.
    stack.settle().await;
    let d = extend(&a, 8, 60, 3);
    assert_eq!(complete(r, &d, Some(false)).await.pod(), home);
    want.best_pick(8.0);
    want.unreported += 1.0;
    expect(r, want, "a streamed follow-up without usage").await;

    // The home pod queues (2 running, 2 waiting): load outweighs 8 cached blocks, the pick goes
    // elsewhere and gives them up, and the engine there hits nothing, as predicted.
    let home_http = stack.pod(&home).http.clone();
    let background: Vec<_> = (0..4u32)
        .map(|i| {
            let http = home_http.clone();
            tokio::spawn(async move {
                let body = json!({"model": MODEL, "prompt": prompt(50 + i, 4), "max_tokens": 3000, "stream": true});
                post(&http, "/v1/completions", &body).await;
            })
        })
        .collect();
    wait_for("the router to see the queue", DEADLINE, || async {
        (router_pod(r, &home).await["load"]["waiting"].as_f64() >= Some(2.0)).then_some(())
    })
    .await;
    // (No settle here: the busy pod publishes a block every few steps; A's blocks were applied.)
    let e = extend(&a, 8, 70, 4);
    let moved = complete(r, &e, None).await;
    assert_ne!(moved.pod(), home, "a queue outweighs 8 cached blocks");
    assert_eq!(moved.cached_tokens(), 0);
    want.below_best += 1.0;
    want.best_blocks += 8.0;
    want.given_up_count += 1.0;
    want.given_up_sum += 8.0;
    want.exactly_predicted(0.0, e.len());
    expect(r, want, "a pick away from a queueing pod").await;
    for task in background {
        task.abort();
    }

    // The indexer gone: placed by load, overlaps unknown.
    stack.kv.process.kill();
    let f = extend(&a, 8, 80, 5);
    complete(r, &f, Some(false)).await;
    want.unscored += 1.0;
    want.unreported += 1.0;
    // Throughout, `over` and `under` stayed 0: the engine reused exactly what was predicted.
    expect(r, want, "a fail-open pick").await;
}

/// A pod whose engine stores blocks of 64 tokens behind an indexer of blocks of 16: the engine
/// reuses whole blocks of 64 only, and never the prompt's last token, so the router predicts
/// exactly that (an indexer that credited the blocks of 16 inside an engine block predicted
/// 112 where the engine hit 64: `over`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictions_on_a_pod_with_larger_engine_blocks_are_whole_engine_blocks() {
    const ENGINE_BLOCK: usize = 64;
    let bins = bins();
    let stack = Stack::start(&bins, 1, &["--model", MODEL, "--block-size", "64"]).await;
    let mut args = stack.router_args();
    args.extend(["--scrape-interval-ms", "20", "--score-deadline-ms", "500"].map(String::from));
    let router = router(&bins, &args);
    let ids: Vec<String> = stack.sim.pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&router.http, &ids).await;
    let r = router.http.as_str();
    let mut want = Quality::default();
    // Two engine blocks and a token.
    let a: Vec<u32> = (0..2 * ENGINE_BLOCK as u32 + 1).map(|t| 7_000_000 + t).collect();
    complete(r, &a, None).await;
    want.no_overlap += 1.0;
    want.exactly_predicted(0.0, a.len());
    expect(r, want, "a cold prompt").await;
    // (shared tokens, prompt length, what the engine reuses)
    let cases = [(112, 150, 64), (128, 140, 128), (128, 128, 64), (70, 70, 64), (63, 200, 0)];
    for (i, (shared, len, engine)) in cases.into_iter().enumerate() {
        stack.settle().await;
        let mut p = a[..shared].to_vec();
        p.extend((0..(len - shared) as u32).map(|t| 8_000_000 + 1000 * i as u32 + t));
        let reply = complete(r, &p, None).await;
        assert_eq!(reply.cached_tokens(), engine as u64, "{shared} shared of {len}");
        let blocks = (engine / BLOCK) as f64;
        if engine > 0 {
            want.best_pick(blocks);
        } else {
            want.no_overlap += 1.0;
        }
        want.exactly_predicted(engine as f64, len);
        expect(r, want, &format!("{shared} tokens shared of {len}: predicted what the engine reused")).await;
    }
}
