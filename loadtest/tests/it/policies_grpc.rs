//! The precise policy through the real service must route exactly like the in-process one:
//! the same seeded reference workload (small scale) played under `precise` (a `KvIndex` in
//! process) and `precise-grpc` (a real `kvindex serve`, events over ZeroMQ PUB→SUB, scores over
//! gRPC `ScoreTokens`) gives the same hit rate and the same placements, far above round-robin.
//!
//! Needs the `kvindex` binary: `$KVINDEX_BIN`, else `$CARGO_TARGET_DIR/debug/kvindex`, else the
//! one beside this test's target directory (`cargo build -p kvindex-server --bin kvindex`). Without
//! it the test is skipped with a message, except under `CI`, where it fails.

use crate::support::kvindex_binary;
use kvindex_loadtest::driver::run;
use kvindex_loadtest::engine::EngineConfig;
use kvindex_loadtest::policy::precise::Precise;
use kvindex_loadtest::policy::precise_grpc::PreciseGrpc;
use kvindex_loadtest::policy::round_robin::RoundRobin;
use kvindex_loadtest::workload::MultiTurnConfig;

const SCALE: usize = 16;
const PODS: usize = 4;
const BLOCK: usize = 16;

#[test]
fn precise_through_kvindex_serve_matches_precise_in_process() {
    let Some(binary) = kvindex_binary() else {
        return;
    };
    let conversations =
        MultiTurnConfig { conversations: 32, ..MultiTurnConfig::reference() }.scaled_down(SCALE).generate();
    let blocks = 160_000 / SCALE / BLOCK + 1;
    let engine = EngineConfig {
        block_size: BLOCK,
        num_gpu_blocks: blocks,
        prefill_tokens_per_s: 16_000.0 / SCALE as f64,
        ..EngineConfig::default()
    };
    let round_robin = run(&mut RoundRobin::default(), &engine, PODS, &conversations).unwrap();
    let in_process = run(&mut Precise::new(PODS, BLOCK, "sim-model"), &engine, PODS, &conversations).unwrap();
    let mut through_service = PreciseGrpc::start(&binary, PODS, BLOCK, "sim-model").expect("start kvindex serve");
    let grpc = run(&mut through_service, &engine, PODS, &conversations).expect("precise-grpc run");
    for r in [&round_robin, &in_process, &grpc] {
        eprintln!(
            "{:<14} hit {:.4}  ttft p50 {:.3}s p99 {:.3}s  pods {:?}",
            r.policy, r.hit_rate, r.ttft_p50_s, r.ttft_p99_s, r.requests_per_pod
        );
    }
    assert_eq!(grpc.requests, in_process.requests);
    assert_eq!(grpc.hit_rate, in_process.hit_rate, "same events, same scores, same choices");
    assert_eq!(grpc.requests_per_pod, in_process.requests_per_pod);
    assert_eq!(grpc.ttft_p99_s, in_process.ttft_p99_s);
    assert!(
        grpc.hit_rate > round_robin.hit_rate + 0.3,
        "precise-grpc {} vs round-robin {}",
        grpc.hit_rate,
        round_robin.hit_rate
    );
}
