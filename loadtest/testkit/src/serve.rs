//! The one way tests and benchmarks start `kvindex serve` as a child process: a builder for
//! the binary, its flags and environment, which reads back the addresses the service announces
//! on its `KVINDEX_LISTENING` line, optionally waits until `/readyz` answers 200, and kills and
//! reaps the process when the handle is dropped.
//!
//! ```no_run
//! # use kvindex_testkit::serve::Serve;
//! let server = Serve::new("target/debug/kvindex")
//!     .loopback()
//!     .args(["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", "16"])
//!     .until_ready()
//!     .start()
//!     .expect("kvindex serve");
//! println!("gRPC on {}", server.grpc);
//! ```

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::ChildProcess;

/// How long `kvindex serve` may take to announce its addresses and, when asked, to become
/// ready: generous, for a debug build on a busy 2-core box.
pub const SERVE_DEADLINE: Duration = Duration::from_secs(60);

/// A `kvindex serve` to start: `binary serve` and the caller's flags.
pub struct Serve {
    binary: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    max_open_files: Option<u32>,
    until_ready: bool,
    logging: bool,
    deadline: Duration,
}

/// A running `kvindex serve` and the addresses it announced; killed and reaped on drop.
pub struct Serving {
    /// The child (for signals and exit status: `pid`, `signal`, `kill`, `wait`).
    pub process: ChildProcess,
    /// `host:port` of the gRPC server.
    pub grpc: String,
    /// `host:port` of the HTTP admin server.
    pub http: String,
    /// The central SUB's bound endpoint (`tcp://127.0.0.1:<port>`), when `--zmq-bind` is given.
    pub zmq: Option<String>,
    /// The metrics-only listener (`--metrics-addr`), when the server has one.
    pub metrics: Option<String>,
    /// The probe listener (`--probe-addr`), when the server has one.
    pub probe: Option<String>,
}

impl Serve {
    /// `binary` (the `kvindex` executable) `serve`, with no flags yet.
    pub fn new(binary: impl Into<PathBuf>) -> Serve {
        Serve {
            binary: binary.into(),
            args: Vec::new(),
            env: Vec::new(),
            max_open_files: None,
            until_ready: false,
            logging: false,
            deadline: SERVE_DEADLINE,
        }
    }

    /// The workspace's `kvindex` (`$KVINDEX_BIN`, else the target directory, built on demand;
    /// see [`crate::binaries::required_binary`]).
    pub fn kvindex() -> Serve {
        Serve::new(crate::binaries::required_binary("kvindex", "KVINDEX_BIN"))
    }

    /// gRPC and HTTP on loopback ports the OS picks (`--grpc-addr 127.0.0.1:0 --http-addr
    /// 127.0.0.1:0`), read back from the announcement.
    pub fn loopback(self) -> Serve {
        self.args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
    }

    /// One more `serve` flag or value.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Serve {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// More `serve` flags and values.
    pub fn args<I, S>(mut self, args: I) -> Serve
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// An environment variable for the child (`RUST_LOG`, `KVINDEX_DISCOVERY_MODEL`, …).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Serve {
        self.env.push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Environment variables for the child.
    pub fn envs<I, K, V>(mut self, vars: I) -> Serve
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        self.env.extend(vars.into_iter().map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned())));
        self
    }

    /// Runs the service under a descriptor limit (`ulimit -n`, soft and hard), as a
    /// container's RLIMIT_NOFILE would set it.
    pub fn max_open_files(mut self, limit: u32) -> Serve {
        self.max_open_files = Some(limit);
        self
    }

    /// After the addresses, also waits until `GET /readyz` answers 200 (bootstrap done, sources
    /// caught up), within the same deadline; plain HTTP, so not for a server with `--tls-cert`.
    pub fn until_ready(mut self) -> Serve {
        self.until_ready = true;
        self
    }

    /// The child's stderr (its logs) goes to the test's output instead of being discarded
    /// (or written under `$KVINDEX_TEST_LOG_DIR`).
    pub fn logging(mut self) -> Serve {
        self.logging = true;
        self
    }

    /// How long the start may take ([`SERVE_DEADLINE`] unless changed).
    pub fn deadline(mut self, deadline: Duration) -> Serve {
        self.deadline = deadline;
        self
    }

    /// Starts the process and waits for its addresses (and readiness, when asked). `Err` names
    /// what it waited for, and the exit status if the service stopped on its own.
    pub fn start(self) -> Result<Serving, String> {
        let mut command = match self.max_open_files {
            Some(limit) => {
                let mut command = Command::new("bash");
                command
                    .arg("-c")
                    .arg(format!("ulimit -n {limit} && exec \"$0\" serve \"$@\""))
                    .arg(&self.binary)
                    .args(&self.args);
                command
            }
            None => {
                let mut command = Command::new(&self.binary);
                command.arg("serve").args(&self.args);
                command
            }
        };
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        let spawn = if self.logging { ChildProcess::spawn_logging } else { ChildProcess::spawn };
        let mut process = spawn(&mut command).map_err(|e| format!("{}: {e}", self.binary.display()))?;
        let deadline = Instant::now() + self.deadline;
        let announced = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match process.next_line(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("KVINDEX_LISTENING ") {
                        break rest.to_string();
                    }
                }
                Err(_) => {
                    return Err(not_started(&mut process, &self.binary, "no KVINDEX_LISTENING line", self.deadline))
                }
            }
        };
        let field = |name: &str| {
            announced.split_whitespace().find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')).map(str::to_string)
        };
        let required =
            |name: &str| field(name).ok_or_else(|| format!("KVINDEX_LISTENING without {name}=: {announced}"));
        let serving = Serving {
            grpc: required("grpc")?,
            http: required("http")?,
            zmq: field("zmq").filter(|z| z != "-"),
            metrics: field("metrics"),
            probe: field("probe"),
            process,
        };
        if self.until_ready {
            let mut serving = serving;
            while serving.readyz() != Some(200) {
                if Instant::now() >= deadline {
                    return Err(not_started(
                        &mut serving.process,
                        &self.binary,
                        "/readyz never answered 200",
                        self.deadline,
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            return Ok(serving);
        }
        Ok(serving)
    }
}

/// Why the start failed: what was missing, and the exit status if the process has stopped.
fn not_started(process: &mut ChildProcess, binary: &Path, missing: &str, deadline: Duration) -> String {
    // Its stdout closes a moment before its exit status is there to read.
    let until = Instant::now() + Duration::from_secs(5);
    let exited = loop {
        match process.try_wait() {
            None if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            status => break status,
        }
    };
    let exit = exited.map_or_else(|| "still running".to_string(), |status| format!("exited with {status}"));
    format!("{} serve: {missing} within {deadline:?} ({exit})", binary.display())
}

impl Serving {
    /// The status of `GET /readyz` on the HTTP listener, or `None` when it does not answer.
    pub fn readyz(&self) -> Option<u16> {
        let mut stream = TcpStream::connect(&self.http).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(stream, "GET /readyz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.http).ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        response.split_whitespace().nth(1)?.parse().ok()
    }

    /// The central SUB endpoint; panics without `--zmq-bind`.
    pub fn zmq(&self) -> String {
        self.zmq.clone().expect("kvindex serve without --zmq-bind has no SUB endpoint")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `kvindex` (a shell script given `serve` and the flags), in a scratch file.
    fn script(name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("kvindex-testkit-serve-{name}-{}", std::process::id()));
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        path
    }

    #[test]
    fn reads_the_announced_addresses_and_kills_the_service_on_drop() {
        let binary = script(
            "announces",
            r#"[ "$1" = serve ] && [ "$2" = --grpc-addr ] && [ "$KVINDEX_TEST_ENV" = yes ] || exit 3
echo "starting"
echo "KVINDEX_LISTENING grpc=127.0.0.1:1 http=127.0.0.1:2 zmq=- metrics=127.0.0.1:3"
exec sleep 300"#,
        );
        let serving = Serve::new(&binary).loopback().env("KVINDEX_TEST_ENV", "yes").start().unwrap();
        assert_eq!((serving.grpc.as_str(), serving.http.as_str()), ("127.0.0.1:1", "127.0.0.1:2"));
        assert_eq!(
            (serving.zmq.as_deref(), serving.metrics.as_deref(), serving.probe.as_deref()),
            (None, Some("127.0.0.1:3"), None)
        );
        let proc_dir = PathBuf::from(format!("/proc/{}", serving.process.pid()));
        assert!(proc_dir.exists());
        drop(serving);
        assert!(!proc_dir.exists(), "killed and reaped on drop");
        let _ = std::fs::remove_file(binary);
    }

    #[test]
    fn a_service_that_stops_before_announcing_is_an_error_naming_its_exit() {
        let binary = script("exits", "echo 'config error: nope' >&2; exit 1");
        let err = Serve::new(&binary).loopback().start().err().expect("no KVINDEX_LISTENING line");
        assert!(err.contains("no KVINDEX_LISTENING line") && err.contains("exit status: 1"), "{err}");
        let _ = std::fs::remove_file(binary);
    }
}
