//! `kvindex-router`: the thin command line over the router library. `serve` binds the
//! listeners, prints `KVINDEX_ROUTER_LISTENING http=<addr> [admin=<addr>] [metrics=<addr>] [probe=<addr>]
//! [ext_proc=<addr>] [ext_proc_health=<addr>]` (so scripts and tests using port 0 learn the addresses), and runs
//! until SIGINT or SIGTERM.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kvindex_router::config::{LogFormat, ServeArgs};
use kvindex_router::error::StartError;
use kvindex_router::serve::{self, Listeners};

#[derive(Parser)]
#[command(name = "kvindex-router", version, about = "Routes LLM requests by exact cached prefix and load")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible proxy (and, with --ext-proc-addr, the Gateway API endpoint picker).
    Serve(Box<ServeArgs>),
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Registers the SIGINT and SIGTERM handlers now and returns the future that resolves on the
/// first of them: called before the listening line is printed, so a signal sent as soon as it
/// is read is a graceful stop, not the default action that kills the process.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let (interrupt, term) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()));
    async move {
        match (interrupt, term) {
            (Ok(mut interrupt), Ok(mut term)) => tokio::select! {
                _ = interrupt.recv() => {}
                _ = term.recv() => {}
            },
            (Ok(mut only), Err(_)) | (Err(_), Ok(mut only)) => {
                only.recv().await;
            }
            (Err(_), Err(_)) => std::future::pending::<()>().await,
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), StartError> {
    let config = args.into_config()?;
    init_logs(config.log_format);
    let stop = shutdown_signal();
    let http = bind("--http-addr", &config.http_addr).await?;
    let admin = match &config.admin_addr {
        Some(addr) => Some(bind("--admin-addr", addr).await?),
        None => None,
    };
    let metrics = match &config.metrics_addr {
        Some(addr) => Some(bind("--metrics-addr", addr).await?),
        None => None,
    };
    let probe = match &config.probe_addr {
        Some(addr) => Some(bind("--probe-addr", addr).await?),
        None => None,
    };
    let (ext_proc, ext_proc_health) = match &config.ext_proc {
        Some(e) => {
            let listener = bind("--ext-proc-addr", &e.addr).await?;
            let health = match &e.health_addr {
                Some(addr) => Some(bind("--ext-proc-health-addr", addr).await?),
                None => None,
            };
            (Some(listener), health)
        }
        None => (None, None),
    };
    let mut line = format!("KVINDEX_ROUTER_LISTENING http={}", http.local_addr()?);
    let named = [
        ("admin", &admin),
        ("metrics", &metrics),
        ("probe", &probe),
        ("ext_proc", &ext_proc),
        ("ext_proc_health", &ext_proc_health),
    ];
    for (name, listener) in named {
        if let Some(listener) = listener {
            line.push_str(&format!(" {name}={}", listener.local_addr()?));
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|_| out.flush())?;
    drop(out);
    serve::run(config, Listeners { http, admin, metrics, probe, ext_proc, ext_proc_health }, stop).await
}

async fn bind(flag: &str, addr: &str) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| StartError::setting(format!("{flag} {addr}"), e))
}

fn main() -> ExitCode {
    // A client chat template's render process is this executable (kvindex_tokenizer::client_template).
    if let Some(code) = kvindex_tokenizer::client_template::run_worker_if_requested() {
        return code;
    }
    let Cli { command: Command::Serve(args) } = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("kvindex-router: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(*args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvindex-router serve: {e}");
            ExitCode::from(2)
        }
    }
}
