//! `kvindex record`: the service's sources, with every message they deliver appended to a
//! dump (`kvindex_server::persist::dump`). Recording holds token ids, so it exists only as this explicit
//! command, with a size and age bound on what it keeps.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgMatches, Args};

use kvindex_server::config::retention::Retention;
use kvindex_server::config::{Config, RecordConfig, ServeArgs};

/// `kvindex record --out <file> (--zmq-bind <endpoint> | --pod ...)...`, plus any `serve` flag.
#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// The dump to append to (gzip JSON Lines; rotated to `<file>.1` past the bounds).
    #[arg(long)]
    pub out: PathBuf,
    /// Compressed bytes before the dump rotates (at most twice this is kept).
    #[arg(long, default_value_t = 1 << 30)]
    pub max_bytes: u64,
    /// Seconds before the dump rotates (no record is kept longer than twice this).
    #[arg(long, default_value_t = 86_400)]
    pub max_age: u64,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The service configuration of a recording: `serve`'s, with the dump, and gRPC/HTTP on free
/// loopback ports unless given (a recorder runs beside the real indexer).
pub fn config(matches: &ArgMatches, args: &RecordArgs) -> anyhow::Result<Config> {
    let mut config = Config::from_matches(matches).map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.serve.settings.grpc_addr.is_none() {
        config.grpc_addr = "127.0.0.1:0".parse()?;
    }
    if args.serve.settings.http_addr.is_none() {
        config.http_addr = "127.0.0.1:0".parse()?;
    }
    anyhow::ensure!(args.max_bytes > 0 && args.max_age > 0, "--max-bytes and --max-age must be positive");
    config.record = Some(RecordConfig {
        path: args.out.clone(),
        retention: Retention { max_bytes: args.max_bytes, max_age: Duration::from_secs(args.max_age) },
    });
    Ok(config)
}
