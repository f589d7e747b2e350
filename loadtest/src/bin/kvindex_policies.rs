//! `kvindex-policies`: a seeded workload (the reference scenario or llm-d's many-tenants
//! benchmark, optionally scaled down) played under every routing policy in process, printing
//! hit rate, TTFT percentiles and KV usage per policy. With `--kvindex <binary>` the precise
//! policy also runs through a real `kvindex serve` (ZeroMQ events, gRPC `ScoreTokens`); with
//! `--router <binary>` as well, real `kvindex-router` processes place the requests (1 replica and
//! each `--replicas` count) over such a service.

use std::path::PathBuf;

use clap::Parser;
use kvindex_loadtest::driver::{run, PolicyReport};
use kvindex_loadtest::engine::EngineConfig;
use kvindex_loadtest::policy::approximate_prefix::ApproximatePrefix;
use kvindex_loadtest::policy::least_loaded::LeastLoaded;
use kvindex_loadtest::policy::oracle::Oracle;
use kvindex_loadtest::policy::precise::Precise;
use kvindex_loadtest::policy::precise_grpc::PreciseGrpc;
use kvindex_loadtest::policy::replicated::Replicated;
use kvindex_loadtest::policy::round_robin::RoundRobin;
use kvindex_loadtest::policy::router_processes::RouterProcesses;
use kvindex_loadtest::policy::Policy;
use kvindex_loadtest::workload::{MultiTurnConfig, TenantsConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    /// 64 conversations × 6 turns growing to ~8k tokens (anchors.md's worked example).
    Reference,
    /// llm-d's benchmark: 150 tenants × 6k-token system prompts, 1.2k-token questions.
    Tenants,
    /// 16 agents × 30 tool-loop steps growing to ~17k tokens.
    Agentic,
    /// The reference shape with 256 conversations: the working set overflows the fleet.
    Overflow,
}

#[derive(Debug, Parser)]
#[command(name = "kvindex-policies", about = "Compare routing policies on the simulated reference scenario")]
struct Args {
    #[arg(long, value_enum, default_value_t = Workload::Reference)]
    workload: Workload,
    /// Tenants workload: requests and mean arrival rate per second.
    #[arg(long, default_value_t = 1500)]
    requests: usize,
    #[arg(long, default_value_t = 5.0)]
    rate: f64,
    #[arg(long, default_value_t = 4)]
    pods: usize,
    /// KV capacity per pod, tokens.
    #[arg(long, default_value_t = 160_000)]
    kv_tokens: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Multi-turn workloads: override the preset's conversation and turn counts.
    #[arg(long)]
    conversations: Option<usize>,
    #[arg(long)]
    turns: Option<usize>,
    /// Divide every token count (contexts, KV capacity, prefill rate) by this.
    #[arg(long, default_value_t = 1)]
    scale_down: usize,
    #[arg(long, default_value_t = 16_000.0)]
    prefill_tokens_per_s: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Also run approximate prefix affinity with this many independent placement replicas
    /// (comma-separated, e.g. 2,4,8); each replica keeps only its own history.
    #[arg(long, value_delimiter = ',')]
    replicas: Vec<usize>,
    /// Path to the `kvindex` binary: adds `precise-grpc`, the precise policy through a real
    /// `kvindex serve` (events over ZeroMQ, scores over gRPC), which must match `precise`.
    #[arg(long)]
    kvindex: Option<PathBuf>,
    /// Path to the `kvindex-router` binary (needs --kvindex): adds `kvindex-router`, real router
    /// processes over a real `kvindex serve`, with 1 replica and each --replicas count.
    #[arg(long, requires = "kvindex")]
    router: Option<PathBuf>,
    /// Extra flags for those routers, whitespace-separated (e.g. "--policy load-band").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    router_args: String,
    /// Also draw hit rate and TTFT p50/p99 per policy into this PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

fn policy_after_precise(policies: &mut Vec<Box<dyn Policy>>, policy: Box<dyn Policy>) {
    let at = policies.iter().position(|p| p.name() == "precise").map_or(policies.len(), |index| index + 1);
    policies.insert(at, policy);
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.pods == 0 || args.block_size == 0 || args.scale_down == 0 {
        eprintln!("kvindex-policies: --pods, --block-size and --scale-down must be at least 1");
        return std::process::ExitCode::from(2);
    }
    let scale = args.scale_down;
    let multi_turn = |preset: MultiTurnConfig| {
        MultiTurnConfig {
            conversations: args.conversations.unwrap_or(preset.conversations),
            turns: args.turns.unwrap_or(preset.turns),
            seed: args.seed,
            ..preset
        }
        .scaled_down(scale)
        .generate()
    };
    let conversations = match args.workload {
        Workload::Reference => multi_turn(MultiTurnConfig::reference()),
        Workload::Agentic => multi_turn(MultiTurnConfig::agentic()),
        Workload::Overflow => multi_turn(MultiTurnConfig::overflow()),
        Workload::Tenants => TenantsConfig {
            requests: args.requests,
            rate_per_s: args.rate,
            seed: args.seed,
            ..TenantsConfig::llm_d_benchmark()
        }
        .scaled_down(scale)
        .generate(),
    };
    let blocks = args.kv_tokens / scale / args.block_size + 1;
    let engine = EngineConfig {
        block_size: args.block_size,
        num_gpu_blocks: blocks,
        prefill_tokens_per_s: args.prefill_tokens_per_s / scale as f64,
        ..EngineConfig::default()
    };
    let chunks_per_pod = blocks * args.block_size / 64;
    let mut policies: Vec<Box<dyn Policy>> = vec![
        Box::new(RoundRobin::default()),
        Box::new(LeastLoaded::default()),
        Box::new(ApproximatePrefix::new(args.pods, 64, chunks_per_pod)),
        Box::new(Precise::new(args.pods, args.block_size, "sim-model")),
        Box::new(Oracle::default()),
    ];
    if let Some(binary) = &args.kvindex {
        match PreciseGrpc::start(binary, args.pods, args.block_size, "sim-model") {
            // Right after the in-process precise policy, which it must match.
            Ok(policy) => policy_after_precise(&mut policies, Box::new(policy)),
            Err(error) => {
                eprintln!("kvindex-policies: --kvindex: {error}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    for &count in args.replicas.iter().filter(|&&count| count > 1) {
        let replicas: Vec<Box<dyn Policy>> = (0..count)
            .map(|_| Box::new(ApproximatePrefix::new(args.pods, 64, chunks_per_pod)) as Box<dyn Policy>)
            .collect();
        policies.push(Box::new(Replicated::new(format!("approximate ×{count}"), replicas)));
    }
    if let (Some(router), Some(kvindex)) = (&args.router, &args.kvindex) {
        let extra: Vec<String> = args.router_args.split_whitespace().map(str::to_string).collect();
        let counts = std::iter::once(1).chain(args.replicas.iter().copied().filter(|&count| count > 1));
        for count in counts {
            policies.push(Box::new(RouterProcesses::new(
                kvindex,
                router,
                count,
                args.pods,
                args.block_size,
                "sim-model",
                &extra,
            )));
        }
    }
    let reports: Vec<PolicyReport> =
        match policies.iter_mut().map(|policy| run(policy.as_mut(), &engine, args.pods, &conversations)).collect() {
            Ok(reports) => reports,
            Err(error) => {
                eprintln!("kvindex-policies: {error}");
                return std::process::ExitCode::FAILURE;
            }
        };
    if args.json {
        for report in &reports {
            println!("{}", serde_json::to_string(report).unwrap_or_default());
        }
    } else {
        println!(
            "{:<20} {:>8} {:>9} {:>9} {:>9} {:>9}  kv usage per pod",
            "policy", "requests", "hit rate", "ttft p50", "ttft p90", "ttft p99"
        );
        for r in &reports {
            let usage: Vec<String> = r.kv_usage_per_pod.iter().map(|u| format!("{:.2}", u)).collect();
            println!(
                "{:<20} {:>8} {:>9.3} {:>8.3}s {:>8.3}s {:>8.3}s  [{}]",
                r.policy,
                r.requests,
                r.hit_rate,
                r.ttft_p50_s,
                r.ttft_p90_s,
                r.ttft_p99_s,
                usage.join(" ")
            );
        }
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "{:?} workload, {} pods, 1/{} scale, seed {}",
            args.workload, args.pods, args.scale_down, args.seed
        )
        .to_lowercase();
        if let Err(error) = kvindex_loadtest::plot::write_png(path, &title, &reports) {
            eprintln!("kvindex-policies: --plot: {error}");
            return std::process::ExitCode::FAILURE;
        }
    }
    std::process::ExitCode::SUCCESS
}
