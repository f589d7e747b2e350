//! `kvindex`: the command line over the kvindex library and its server.
//!
//! Subcommands: `serve` (the indexer service, `kvindex_server::run`), `record` / `replay` (KV-event
//! dumps), `decode` (captured frames → normalized events), `vllm-hash` (vLLM's own block hashes, for cross-checking an
//! engine's configuration), `sglang-hash` (SGLang's page ids, likewise) and `compare` (do two
//! running replicas hold the same for every pod?). Exit status 1 on any error, with one line on stderr; `replay` exits
//! 2 when its dump ends early (truncated or corrupt), after reporting every whole line before.

mod compare;
mod decode;
mod record;
mod replay;
mod sglang_hash;
mod vllm_hash;

use std::ffi::OsString;
use std::io::{self, BufReader, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

use kvindex_server::config::{Config, ConfigError, ServeArgs};

#[derive(Parser)]
#[command(name = "kvindex", version, about = "Exact prefix-cache index for vLLM, SGLang and TensorRT-LLM fleets")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the indexer service: subscribe to engines, keep the index exact, serve ScoreTokens.
    Serve(Box<ServeArgs>),
    /// Decode captured ZeroMQ messages (JSON Lines with `frames_hex`) from stdin.
    Decode(decode::DecodeArgs),
    /// Compute vLLM's own block hashes for `hashes.jsonl`-shaped records from stdin.
    VllmHash,
    /// Compute SGLang's published page ids for `hashes-sglang.jsonl`-shaped records from stdin.
    SglangHash,
    /// Run the sources like `serve`, appending every message (with token ids) to a dump.
    Record(Box<record::RecordArgs>),
    /// Rebuild an index offline from a dump: statistics, scores, explain, read-only gRPC.
    ///
    /// Bad lines (too long, not UTF-8, not a record) are counted and named in the report and
    /// skipped. Exit status: 0 when the dump was read to its end, 2 when it ends early (a
    /// truncated or corrupt gzip; the report covers every whole line before), 1 on an error.
    Replay(Box<replay::ReplayArgs>),
    /// Which pods two running replicas hold differently: per pod, digests at the streams'
    /// cursors (asked again while one is only behind), blocks and cursors of each side.
    ///
    /// Exit status: 0 when every pod agrees, 1 when some differ, 2 when a replica cannot be asked.
    Compare(compare::CompareArgs),
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let matches = match Cli::command().try_get_matches_from(&argv) {
        Ok(matches) => matches,
        Err(e) => match ConfigError::from_clap(&e, &argv, &kvindex_server::config::serve_command()) {
            Some(config_error) => return fail("kvindex serve", &config_error.into()),
            None => e.exit(),
        },
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Serve(_) = cli.command {
        let serve_matches = matches.subcommand_matches("serve").expect("the serve subcommand matched");
        return match serve(serve_matches) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail("kvindex serve", &e),
        };
    }
    if let Command::Record(args) = &cli.command {
        init_logs();
        let record_matches = matches.subcommand_matches("record").expect("the record subcommand matched");
        return match record::config(record_matches, args).and_then(run_service) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail("kvindex record", &e),
        };
    }
    if let Command::Replay(args) = &cli.command {
        return match replay::run(args) {
            Ok(replay::Outcome::Complete) => ExitCode::SUCCESS,
            Ok(replay::Outcome::EndedEarly) => ExitCode::from(2),
            Err(e) => fail("kvindex", &e.context("replay")),
        };
    }
    if let Command::Compare(args) = &cli.command {
        return match compare::run(args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("kvindex compare: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    let result = match cli.command {
        Command::Serve(_) | Command::Record(_) | Command::Replay(_) | Command::Compare(_) => {
            unreachable!("handled above")
        }
        Command::Decode(args) => {
            decode::run(&args, BufReader::new(io::stdin().lock()), io::BufWriter::new(io::stdout().lock()))
                .context("decode")
        }
        Command::SglangHash => {
            sglang_hash::run(BufReader::new(io::stdin().lock()), io::BufWriter::new(io::stdout().lock()))
                .context("sglang-hash")
        }
        Command::VllmHash => {
            vllm_hash::run(BufReader::new(io::stdin().lock()), io::BufWriter::new(io::stdout().lock()))
                .map_err(|e| anyhow::anyhow!("{e}"))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("kvindex", &e),
    }
}

fn fail(what: &str, error: &anyhow::Error) -> ExitCode {
    eprintln!("{what}: {error:#}");
    ExitCode::FAILURE
}

/// `kvindex serve`: binds, prints one machine-readable line for scripts and tests that start it
/// on port 0, and runs until SIGINT or SIGTERM.
fn serve(matches: &ArgMatches) -> anyhow::Result<()> {
    init_logs();
    let config = Config::from_matches(matches).map_err(|e| anyhow::anyhow!("{e}"))?;
    run_service(config)
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(io::stderr).with_ansi(false).try_init();
}

/// Runs the service (`serve`, or `record`) until SIGINT or SIGTERM.
fn run_service(config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("kvindex-rpc").build()?;
    runtime.block_on(async {
        // Before the listening line: a SIGTERM sent as soon as it is read must stop us gracefully.
        let stop = shutdown_signal();
        let listeners = kvindex_server::bind(&config).await?;
        let mut out = io::stdout().lock();
        let zmq = listeners.zmq_endpoint().unwrap_or("-");
        write!(out, "KVINDEX_LISTENING grpc={} http={} zmq={zmq}", listeners.grpc_addr(), listeners.http_addr())?;
        if let Some(metrics) = listeners.metrics_addr() {
            write!(out, " metrics={metrics}")?;
        }
        if let Some(probe) = listeners.probe_addr() {
            write!(out, " probe={probe}")?;
        }
        writeln!(out)?;
        out.flush()?;
        drop(out);
        kvindex_server::run(config, listeners, stop).await?;
        Ok(())
    })
}

/// `kvindex replay --grpc-addr`: the rebuilt index behind the gRPC API until SIGINT/SIGTERM.
fn serve_read_only(offline: kvindex_server::persist::dump::offline::Offline, addr: &str) -> anyhow::Result<()> {
    init_logs();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let stop = shutdown_signal();
        kvindex_server::dump_server::serve_index(
            offline.into_index(),
            addr,
            |bound| {
                println!("KVINDEX_LISTENING grpc={bound} http=- zmq=-");
                let _ = io::stdout().flush();
            },
            stop,
        )
        .await
    })?;
    Ok(())
}

/// Registers the SIGINT and SIGTERM handlers now, in the runtime, and returns the future that
/// resolves on the first of them. Registered before the listening line is printed: a signal a
/// supervisor (or a test) sends as soon as it reads the line is then a graceful stop, not the
/// default action that kills the process (a handler registered on first poll came too late).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let interrupt = signal(SignalKind::interrupt());
    let term = signal(SignalKind::terminate());
    async move {
        match (interrupt, term) {
            (Ok(mut interrupt), Ok(mut term)) => tokio::select! {
                _ = interrupt.recv() => tracing::info!("interrupted"),
                _ = term.recv() => tracing::info!("terminated"),
            },
            (Ok(mut interrupt), Err(e)) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the server");
                interrupt.recv().await;
            }
            (Err(e), Ok(mut term)) => {
                tracing::error!(error = %e, "cannot listen for SIGINT; only SIGTERM stops the server");
                term.recv().await;
            }
            (Err(e), Err(_)) => {
                tracing::error!(error = %e, "cannot listen for SIGINT or SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    }
}
