//! The reference scenario at a small scale (every token count / 8): cache-aware routing must
//! be well above round-robin in hit rate and TTFT, and precise routing (a `kvindex::KvIndex`
//! fed with the pods' published events) close to the oracle that reads the caches directly.

use kvindex_loadtest::driver::{run, PolicyReport};
use kvindex_loadtest::engine::EngineConfig;
use kvindex_loadtest::policy::approximate_prefix::ApproximatePrefix;
use kvindex_loadtest::policy::least_loaded::LeastLoaded;
use kvindex_loadtest::policy::oracle::Oracle;
use kvindex_loadtest::policy::precise::Precise;
use kvindex_loadtest::policy::round_robin::RoundRobin;
use kvindex_loadtest::workload::MultiTurnConfig;

const SCALE: usize = 8;
const PODS: usize = 4;
const BLOCK: usize = 16;

fn reports() -> Vec<PolicyReport> {
    let conversations = MultiTurnConfig::reference().scaled_down(SCALE).generate();
    let blocks = 160_000 / SCALE / BLOCK + 1;
    let engine = EngineConfig {
        block_size: BLOCK,
        num_gpu_blocks: blocks,
        prefill_tokens_per_s: 16_000.0 / SCALE as f64,
        ..EngineConfig::default()
    };
    vec![
        run(&mut RoundRobin::default(), &engine, PODS, &conversations).unwrap(),
        run(&mut LeastLoaded::default(), &engine, PODS, &conversations).unwrap(),
        run(
            &mut ApproximatePrefix::new(PODS, 64 / SCALE, blocks * BLOCK / (64 / SCALE)),
            &engine,
            PODS,
            &conversations,
        )
        .unwrap(),
        run(&mut Precise::new(PODS, BLOCK, "sim-model"), &engine, PODS, &conversations).unwrap(),
        run(&mut Oracle::default(), &engine, PODS, &conversations).unwrap(),
    ]
}

#[test]
fn precise_routing_beats_round_robin_and_tracks_the_oracle() {
    let reports = reports();
    for r in &reports {
        eprintln!(
            "{:<20} hit {:.3}  ttft p50 {:.3}s p90 {:.3}s p99 {:.3}s  pods {:?}",
            r.policy, r.hit_rate, r.ttft_p50_s, r.ttft_p90_s, r.ttft_p99_s, r.requests_per_pod
        );
        assert_eq!(r.requests, 64 * 6, "{}: every turn completes", r.policy);
    }
    let [round_robin, least_loaded, approximate, precise, oracle] = &reports[..] else { unreachable!("five policies") };
    assert!(
        precise.hit_rate > round_robin.hit_rate + 0.3,
        "precise {} vs round-robin {}",
        precise.hit_rate,
        round_robin.hit_rate
    );
    assert!(precise.hit_rate > least_loaded.hit_rate + 0.3);
    assert!(precise.hit_rate >= 0.95 * oracle.hit_rate, "precise {} vs oracle {}", precise.hit_rate, oracle.hit_rate);
    assert!(approximate.hit_rate > round_robin.hit_rate + 0.3);
    assert!(
        precise.ttft_p50_s * 2.0 < round_robin.ttft_p50_s,
        "TTFT p50 precise {} vs round-robin {}",
        precise.ttft_p50_s,
        round_robin.ttft_p50_s
    );
    assert!(oracle.ttft_p90_s < round_robin.ttft_p90_s);
}

#[test]
fn runs_are_reproducible() {
    let conversations = MultiTurnConfig::reference().scaled_down(16).generate();
    let engine = EngineConfig { block_size: BLOCK, num_gpu_blocks: 600, ..EngineConfig::default() };
    let a = run(&mut Precise::new(PODS, BLOCK, "m"), &engine, PODS, &conversations).unwrap();
    let b = run(&mut Precise::new(PODS, BLOCK, "m"), &engine, PODS, &conversations).unwrap();
    assert_eq!(
        (a.hit_rate, a.ttft_p99_s, a.requests_per_pod.clone()),
        (b.hit_rate, b.ttft_p99_s, b.requests_per_pod.clone())
    );
}

#[test]
fn approximate_replicas_lose_hits_that_precise_replicas_keep() {
    use kvindex_loadtest::policy::replicated::Replicated;
    use kvindex_loadtest::policy::Policy;
    let conversations = MultiTurnConfig::reference().scaled_down(SCALE).generate();
    let blocks = 160_000 / SCALE / BLOCK + 1;
    let engine = EngineConfig {
        block_size: BLOCK,
        num_gpu_blocks: blocks,
        prefill_tokens_per_s: 16_000.0 / SCALE as f64,
        ..EngineConfig::default()
    };
    let chunk = 64 / SCALE;
    let approximate = |count: usize| {
        let replicas: Vec<Box<dyn Policy>> = (0..count)
            .map(|_| Box::new(ApproximatePrefix::new(PODS, chunk, blocks * BLOCK / chunk)) as Box<dyn Policy>)
            .collect();
        run(&mut Replicated::new(format!("approximate ×{count}"), replicas), &engine, PODS, &conversations).unwrap()
    };
    // Every precise replica reads the pods' events, as replicas sharing one indexer do.
    let precise_replicas: Vec<Box<dyn Policy>> =
        (0..4).map(|_| Box::new(Precise::new(PODS, BLOCK, "m")) as Box<dyn Policy>).collect();
    let precise = run(&mut Replicated::new("precise ×4", precise_replicas), &engine, PODS, &conversations).unwrap();
    let (one, four) = (approximate(1), approximate(4));
    eprintln!("approximate ×1 {:.3}, ×4 {:.3}, precise ×4 {:.3}", one.hit_rate, four.hit_rate, precise.hit_rate);
    assert!(four.hit_rate + 0.15 < one.hit_rate, "each approximate replica only knows its own placements");
    assert!(precise.hit_rate > one.hit_rate - 0.02, "precise replicas share what the pods publish");
}
