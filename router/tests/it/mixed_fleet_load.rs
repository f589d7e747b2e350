//! A mixed fleet (a vLLM pod and an SGLang pod, both `kvindex-sim`, each exposing its own
//! engine's `/metrics` names) is placed by each pod's real load: the router reads the SGLang
//! pod's `sglang:num_running_reqs` / `sglang:num_queue_reqs` as it reads vLLM's gauges, so the
//! SGLang pod is neither taken for idle nor for unreachable. No indexer: placement is by load
//! alone, so nothing but the scraped load decides. Their KV capacity is compared in tokens,
//! whatever each engine's block or page size.

use crate::support::*;
use kvindex_loadtest::process::SimFleet;
use serde_json::{json, Value};

const MODEL: &str = "sim/model";
/// Each pod's KV capacity; the SGLang pod reports it as `sglang:num_pages`.
const KV_BLOCKS: u64 = 512;

fn sim(bins: &Bins, engine: &str) -> SimFleet {
    sim_sized(bins, engine, 16, KV_BLOCKS)
}

/// One `kvindex-sim` pod of `engine` with `blocks` KV blocks (SGLang: pages) of `block_size`
/// tokens.
fn sim_sized(bins: &Bins, engine: &str, block_size: u64, blocks: u64) -> SimFleet {
    SimFleet::start(
        &bins.sim,
        1,
        &[
            "--model",
            MODEL,
            "--engine",
            engine,
            "--block-size",
            &block_size.to_string(),
            "--kv-blocks",
            &blocks.to_string(),
            "--http-base-port",
            "0",
            "--zmq-bind-base-port",
            "0",
        ],
    )
    .expect("kvindex-sim")
}

/// `count` long requests sent straight to a pod (not through the router): load the router
/// learns of only from the pod's `/metrics`.
fn load_directly(http: &str, count: usize, seed: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..count)
        .map(|i| {
            let http = http.to_string();
            tokio::spawn(async move {
                let prompt = format!("background {seed}-{i}: {}", "keep the engine busy. ".repeat(8));
                let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 3000, "stream": true});
                let _ = post(&http, "/v1/completions", &body).await;
            })
        })
        .collect()
}

/// The router's scraped load of a pod (waiting + running), once it has one.
async fn scraped_load(router: &str, id: &str) -> Option<f64> {
    let pod = router_pod(router, id).await;
    pod["load"]["scrape_age_ms"].as_u64()?;
    Some(pod["load"]["waiting"].as_f64()? + pod["load"]["running"].as_f64()?)
}

/// Where the router sends fresh prompts (no cached prefix anywhere).
async fn placements(router: &str, round: usize) -> Vec<String> {
    let mut pods = Vec::new();
    for i in 0..3 {
        let body =
            json!({"model": MODEL, "prompt": format!("round {round} prompt {i}: a short question"), "max_tokens": 1});
        let reply = post(router, "/v1/completions", &body).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        pods.push(reply.pod().to_string());
    }
    pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_sglang_pod_is_seen_loaded_and_an_idle_one_idle() {
    let bins = bins();
    let vllm = sim(&bins, "vllm");
    let sglang = sim(&bins, "sglang");
    let (vllm_pod, sglang_pod) = (&vllm.pods[0], &sglang.pods[0]);
    let metrics_page = get(&sglang_pod.http, "/metrics").await;
    let page = String::from_utf8_lossy(&metrics_page.body);
    assert!(page.contains("\nsglang:num_running_reqs{") && !page.contains("vllm:"), "{page}");

    let router = router(
        &bins,
        &[
            "--pod".into(),
            vllm_pod.router_spec(),
            "--pod".into(),
            sglang_pod.router_spec(),
            "--scrape-interval-ms".into(),
            "100".into(),
        ],
    );
    let r = router.http.as_str();

    // The vLLM pod busy, the SGLang pod idle: the SGLang pod is scraped (idle, reachable) and
    // takes the fresh prompts.
    let vllm_background = load_directly(&vllm_pod.http, 4, 1);
    wait_for("the router to see the vLLM pod busy and the SGLang pod idle", DEADLINE, || async {
        let busy = scraped_load(r, &vllm_pod.pod_id).await >= Some(4.0);
        let idle = scraped_load(r, &sglang_pod.pod_id).await == Some(0.0);
        (busy && idle).then_some(())
    })
    .await;
    let sglang_view: Value = router_pod(r, &sglang_pod.pod_id).await;
    assert_eq!(sglang_view["load"]["reachable"], true, "{sglang_view}");
    assert_eq!(sglang_view["load"]["kv_tokens"].as_u64(), Some(KV_BLOCKS * 16), "{sglang_view}");
    for pod in placements(r, 1).await {
        assert_eq!(pod, sglang_pod.pod_id, "the idle SGLang pod takes fresh prompts");
    }

    // Now the SGLang pod busier than the vLLM one: its load, read from SGLang's names, sends
    // the fresh prompts to the vLLM pod.
    let sglang_background = load_directly(&sglang_pod.http, 10, 2);
    wait_for("the router to see the SGLang pod's load", DEADLINE, || async {
        (scraped_load(r, &sglang_pod.pod_id).await >= Some(10.0)).then_some(())
    })
    .await;
    assert!(metric(r, "kvindex_router_pod_load", &[&sglang_pod.pod_id, "kind=\"running\""]).await > 0.0);
    for pod in placements(r, 2).await {
        assert_eq!(pod, vllm_pod.pod_id, "the busier SGLang pod is passed over");
    }
    assert_eq!(metric(r, "kvindex_router_scrapes_total", &["outcome=\"unknown_engine\""]).await, 0.0);

    for task in vllm_background.into_iter().chain(sglang_background) {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_one_capacity_in_tokens_weigh_alike_whatever_their_block_or_page_size() {
    let bins = bins();
    // 20,480 tokens each: vLLM blocks of 16, SGLang pages of 64, SGLang pages of 1 (its default).
    let fleets = [
        sim_sized(&bins, "vllm", 16, 1280),
        sim_sized(&bins, "sglang", 64, 320),
        sim_sized(&bins, "sglang", 1, 20_480),
    ];
    let pods: Vec<&SimPod> = fleets.iter().map(|f| &f.pods[0]).collect();
    let mut args = vec!["--scrape-interval-ms".to_string(), "100".to_string()];
    for pod in &pods {
        args.extend(["--pod".to_string(), pod.router_spec()]);
    }
    let router = router(&bins, &args);
    let ids: Vec<String> = pods.iter().map(|p| p.pod_id.clone()).collect();
    wait_scraped(&router.http, &ids).await;
    let body = json!({"model": MODEL, "prompt": "a short question", "max_tokens": 1});
    let decision = post(&router.http, "/route/v1/completions", &body).await.json();
    let weights: Vec<(String, f64)> = decision["ranked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["pod"].as_str().unwrap().to_string(), c["kv_weight"].as_f64().unwrap()))
        .collect();
    assert_eq!(weights.len(), 3, "{decision}");
    // 20,480 tokens are 1,280 blocks of the router's 16: a full cache costs 256 × 1,280 / 10,000.
    for (pod, weight) in &weights {
        assert!((weight - 256.0 * 1280.0 / 10_000.0).abs() < 1e-9, "{pod}: a full cache costs {weight}: {decision}");
    }
    for id in &ids {
        let view = router_pod(&router.http, id).await;
        assert_eq!(view["load"]["kv_tokens"], 20_480, "{view}");
    }
}
