//! Prefill/decode disaggregation: the decode pod is chosen by load (and rendezvous), the prefill
//! pod by cache affinity within a load band, and the request goes to the decode pod with
//! `x-prefiller-host-port` naming the prefill pod (llm-d's sidecar convention), which the
//! router sets itself (a client's own value never passes).

use crate::support::fake_pod::{vllm_metrics, FakePod, Script};
use crate::support::*;
use serde_json::{json, Value};

fn prompt(base: u32) -> Vec<u32> {
    (0..96).map(|t| base + t).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_by_load_prefill_by_cache_within_the_band() {
    let bins = bins();
    let stack = Stack::start(&bins, 2, &["--model", "sim/model"]).await;
    let (a, b) = (stack.sim.pods[0].clone(), stack.sim.pods[1].clone());
    let decode = [FakePod::start(Script::Echo("d0".into())).await, FakePod::start(Script::Echo("d1".into())).await];
    let mut args =
        vec!["--indexer".to_string(), stack.kv.grpc_addr.clone(), "--scrape-interval-ms".into(), "20".into()];
    args.extend(["--score-deadline-ms".into(), "500".into()]);
    for pod in [&a, &b] {
        args.extend(["--prefill-pod".to_string(), pod.router_spec()]);
    }
    for pod in &decode {
        args.extend(["--decode-pod".to_string(), pod.spec()]);
    }
    let router = router(&bins, &args);
    let all: Vec<String> = [a.pod_id.clone(), b.pod_id.clone(), decode[0].addr.clone(), decode[1].addr.clone()].into();
    wait_scraped(&router.http, &all).await;

    // The prefix lives on b: b prefills, whichever pod decodes.
    let warm =
        post(&b.http, "/v1/completions", &json!({"model": "sim/model", "prompt": prompt(1000), "max_tokens": 1})).await;
    assert_eq!(warm.status, 200);
    stack.settle().await;
    let body = json!({"model": "sim/model", "prompt": prompt(1000).into_iter().chain(0..8).collect::<Vec<u32>>(), "max_tokens": 4});
    let reply = request(
        &router.http,
        "POST",
        "/v1/completions",
        Some(body.to_string().into()),
        &[("x-prefiller-host-port", "10.6.6.6:666")],
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-kvindex-prefill-pod"), Some(b.pod_id.as_str()));
    assert_eq!(reply.header("x-kvindex-prefill-matched-blocks"), Some("6"));
    let served = reply.json()["pod"].as_str().unwrap().to_string();
    let decode_pod = decode.iter().find(|d| reply.pod() == d.addr).expect("a decode pod served");
    assert_eq!(served, if decode_pod.addr == decode[0].addr { "d0" } else { "d1" });
    let seen = decode_pod.posts().pop().unwrap();
    assert_eq!(seen.header("x-prefiller-host-port"), Some(b.pod_id.as_str()), "the router's value, not the client's");
    assert_eq!(seen.body, body.to_string().into_bytes());
    assert!(a.pod_id != b.pod_id);

    // Decode by load: the busier decode pod is passed over, whatever the prompt.
    for (busy, idle) in [(0, 1), (1, 0)] {
        *decode[busy].metrics.lock() = vllm_metrics(0.0, 8.0, 0.1);
        *decode[idle].metrics.lock() = vllm_metrics(0.0, 0.0, 0.1);
        let (busy_id, idle_id) = (decode[busy].addr.clone(), decode[idle].addr.clone());
        // Both pods: the idle one was the busy one in the previous round.
        wait_for("the router to see the decode load", DEADLINE, || async {
            let running = |pod: Value| pod["load"]["running"].as_f64();
            (running(router_pod(&router.http, &busy_id).await) == Some(8.0)
                && running(router_pod(&router.http, &idle_id).await) == Some(0.0))
            .then_some(())
        })
        .await;
        for base in [5000, 6000, 7000] {
            let reply = post(
                &router.http,
                "/v1/completions",
                &json!({"model": "sim/model", "prompt": prompt(base), "max_tokens": 1}),
            )
            .await;
            assert_eq!(reply.pod(), decode[idle].addr, "decode goes to the idle pod");
        }
    }

    // Prefill within the load band: with b three requests busier than a, b's cache no longer
    // decides, and a prefills.
    let background: Vec<_> = (0..3)
        .map(|i| {
            let http = b.http.clone();
            tokio::spawn(async move {
                let body = json!({"model": "sim/model", "prompt": prompt(90_000 + 1000 * i), "max_tokens": 3000, "stream": true});
                let _ = post(&http, "/v1/completions", &body).await;
            })
        })
        .collect();
    wait_for("the router to see b's load", DEADLINE, || async {
        (router_pod(&router.http, &b.pod_id).await["load"]["load"].as_f64() >= Some(3.0)).then_some(())
    })
    .await;
    let reply = post(&router.http, "/v1/completions", &body).await;
    assert_eq!(
        reply.header("x-kvindex-prefill-pod"),
        Some(a.pod_id.as_str()),
        "out of the band, the cache does not decide"
    );
    for task in background {
        task.abort();
    }
}
