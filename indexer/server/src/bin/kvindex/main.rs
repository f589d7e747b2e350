//! `kvindex`: the thin command-line shell over the kvindex library.
//!
//! Subcommands: `serve` (the indexer service), `decode` (captured frames → normalized events)
//! and `vllm-hash` (vLLM's own block hashes, for cross-checking an engine's configuration).

mod decode;
mod vllm_hash;

use std::io::{self, BufReader};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kvindex", version, about = "Exact prefix-cache index for vLLM fleets")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the indexer service: subscribe to engines, keep the index exact, serve ScoreTokens.
    Serve(Box<kvindex_server::config::ServeArgs>),
    /// Decode captured ZeroMQ messages (JSON Lines with `frames_hex`) from stdin.
    Decode,
    /// Compute vLLM's own block hashes for `hashes.jsonl`-shaped records from stdin.
    VllmHash,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Serve(args) = cli.command {
        return match kvindex_server::serve::run(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kvindex serve: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let stdin = BufReader::new(io::stdin().lock());
    let stdout = io::BufWriter::new(io::stdout().lock());
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Decode => decode::run(stdin, stdout).map_err(Into::into),
        Command::VllmHash => vllm_hash::run(stdin, stdout),
        Command::Serve(_) => unreachable!("handled above"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvindex: {e}");
            ExitCode::FAILURE
        }
    }
}
