//! `kvindex-sim`: runs a simulated vLLM fleet until interrupted. Prints one JSON line per pod
//! (its HTTP address, topic and endpoints) once everything listens, so scripts can wait on it.

use clap::Parser;
use kvindex_loadtest::cli::Cli;
use kvindex_loadtest::fleet::start_fleet;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let config = match cli.fleet_config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("kvindex-sim: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    let pods = match start_fleet(&config).await {
        Ok(pods) => pods,
        Err(error) => {
            eprintln!("kvindex-sim: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    for (index, running) in pods.iter().enumerate() {
        let line = serde_json::json!({
            "pod": index,
            "http": running.http_addr.to_string(),
            "pod_id": running.pod.info.pod_id,
            "topic": running.pod.info.topic,
            // Rank 0's endpoints; every rank's in "ranks" (data parallelism).
            "pub": running.ranks.first().and_then(|r| r.pub_endpoint.clone()),
            "replay": running.ranks.first().and_then(|r| r.replay_endpoint.clone()),
            "ranks": running.ranks,
        });
        println!("{line}");
    }
    tracing::info!(pods = pods.len(), model = %config.model, "kvindex-sim ready");
    let _ = tokio::signal::ctrl_c().await;
    std::process::ExitCode::SUCCESS
}
