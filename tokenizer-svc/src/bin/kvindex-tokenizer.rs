//! The `kvindex-tokenizer` binary: parses the fixed CLI contract and runs the library's server.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use kvindex_tokenizer::client_template::{self, ClientTemplateArgs, ClientTemplates, Sandbox};
use kvindex_tokenizer::server::{serve, BoundListeners};
use kvindex_tokenizer::{RegistryConfig, TokenizerRegistry};

#[derive(Parser, Debug)]
#[command(
    name = "kvindex-tokenizer",
    version,
    about = "Exact HF tokenization and chat templates for kvindex (llm-d TokenizationService)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve tokenization.TokenizationService, health and reflection over gRPC.
    Serve(ServeArgs),
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// TCP address for gRPC, e.g. 0.0.0.0:50051 (port 0 picks a free port).
    #[arg(long)]
    grpc_addr: SocketAddr,
    /// Also serve on this Unix socket (llm-d's sidecar layout).
    #[arg(long)]
    uds: Option<PathBuf>,
    /// A model as <name>=<dir>; repeatable.
    #[arg(long = "model", value_name = "NAME=DIR")]
    models: Vec<String>,
    /// Every subdirectory holding a tokenizer.json is a model named after the subdirectory.
    #[arg(long)]
    models_dir: Option<PathBuf>,
    /// How many tokenizers stay loaded at once (least recently used is dropped).
    #[arg(long, default_value_t = kvindex_tokenizer::registry_config::DEFAULT_MAX_LOADED_MODELS)]
    max_loaded_models: usize,
    /// Load these models at start-up instead of on first use (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    preload: Vec<String>,
    /// Memory for reused prompt prefixes (incremental tokenization), in MiB; 0 disables reuse.
    #[arg(long, default_value_t = kvindex_tokenizer::registry_config::DEFAULT_PREFIX_CACHE_BYTES >> 20)]
    prefix_cache_mib: usize,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9090).
    #[arg(long)]
    http_addr: Option<SocketAddr>,
    #[command(flatten)]
    client_templates: ClientTemplateArgs,
}

fn main() -> std::process::ExitCode {
    // A client chat template's render process is this executable (docs: src/client_template.rs).
    if let Some(code) = client_template::run_worker_if_requested() {
        return code;
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let Command::Serve(args) = cli.command;
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kvindex-tokenizer: cannot start runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvindex-tokenizer: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: ServeArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let prefix_cache_bytes = args.prefix_cache_mib.checked_mul(1 << 20).ok_or("--prefix-cache-mib is too large")?;
    let mut config =
        RegistryConfig { max_loaded_models: args.max_loaded_models, prefix_cache_bytes, ..Default::default() };
    for spec in &args.models {
        config.add_model_spec(spec)?;
    }
    if let Some(dir) = &args.models_dir {
        config.add_models_dir(dir)?;
    }
    if config.models.is_empty() {
        return Err("no models configured: pass --model <name>=<dir> or --models-dir <dir>".into());
    }
    let limits = args.client_templates.limits().map_err(|(flag, message)| format!("{flag}: {message}"))?;
    let sandbox = if let Some(limits) = limits {
        let sandbox = Sandbox::for_current_exe(limits).map_err(|e| format!("--allow-client-chat-template: {e}"))?;
        let checked = sandbox.clone();
        tokio::task::spawn_blocking(move || checked.check())
            .await?
            .map_err(|e| format!("--allow-client-chat-template: {e}"))?;
        config.client_templates = ClientTemplates::Sandboxed(sandbox.clone());
        tracing::info!(?limits, "client chat templates allowed, rendered in bounded processes");
        Some(sandbox)
    } else {
        None
    };
    if let Some(addr) = args.http_addr {
        metrics_exporter_prometheus::PrometheusBuilder::new().with_http_listener(addr).install()?;
        kvindex_tokenizer::telemetry::describe();
    }
    tracing::info!(models = config.models.len(), "models configured");
    let registry = Arc::new(TokenizerRegistry::new(config));
    for name in &args.preload {
        let registry = registry.clone();
        let name = name.clone();
        tokio::task::spawn_blocking(move || registry.initialize(&name)).await??;
    }
    let signal = shutdown_signal()?;
    // Client template renders in flight are killed at once, so they never hold up the stop.
    let shutdown = async move {
        signal.await;
        if let Some(sandbox) = sandbox {
            sandbox.shutdown();
        }
    };
    let listeners = BoundListeners::bind(args.grpc_addr, args.uds.clone()).await?;
    let tcp = listeners.tcp_addr()?;
    // One machine-readable line on stdout so supervisors and tests learn the bound address.
    println!(
        "kvindex-tokenizer listening grpc={tcp}{}",
        args.uds.as_ref().map(|p| format!(" uds={}", p.display())).unwrap_or_default()
    );
    tracing::info!(%tcp, uds = ?args.uds, "serving tokenization.TokenizationService");
    serve(registry, listeners, shutdown).await
}

/// Registers SIGTERM/SIGINT handlers now (before the address is announced, so a supervisor's
/// immediate SIGTERM is a graceful stop, not the default kill) and returns the future that
/// resolves on the first of them.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = interrupt.recv() => {},
        }
        tracing::info!("shutting down");
    })
}
