//! Child processes of the workspace's binaries for tests and benchmarks that run the real
//! thing on loopback: finding a binary in the target directory, a `kvindex-sim` fleet (its
//! pods read from the JSON lines it prints), and `kvindex-router` replicas (their addresses
//! read from `KVINDEX_ROUTER_LISTENING`). Every child is killed and reaped on drop.
//!
//! Children's stderr is discarded unless `$KVINDEX_TEST_LOG_DIR` names a directory, where each
//! child then logs to `<name>-<pid>.log`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use serde_json::Value;

/// How long a child may take to report its addresses (a debug build on a loaded box).
pub const START_DEADLINE: Duration = Duration::from_secs(60);

pub use kvindex_testkit::binaries::{required_binary, workspace_binary};

/// A running child with its stdout lines; killed and reaped on drop.
pub struct ChildProcess {
    child: Child,
    lines: Receiver<String>,
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChildProcess {
    /// Spawns `command` with stdout piped (read on a thread, so the child never blocks on it).
    pub fn spawn(command: &mut Command) -> Result<ChildProcess, String> {
        let name =
            Path::new(command.get_program()).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let stderr = match std::env::var_os("KVINDEX_TEST_LOG_DIR") {
            Some(dir) => {
                let path = PathBuf::from(dir).join(format!("{name}-{}-{}.log", std::process::id(), unique()));
                Stdio::from(std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?)
            }
            None => Stdio::null(),
        };
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(ChildProcess { child, lines })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line, within `timeout`.
    pub fn next_line(&self, timeout: Duration) -> Result<String, String> {
        self.lines.recv_timeout(timeout).map_err(|_| format!("no output from pid {} within {timeout:?}", self.pid()))
    }

    /// Waits for the line starting with `prefix` and returns its `key=value` pairs.
    pub fn listening(&self, prefix: &str) -> Result<HashMap<String, String>, String> {
        loop {
            let line = self.next_line(START_DEADLINE)?;
            if let Some(rest) = line.strip_prefix(prefix) {
                return Ok(rest
                    .split_whitespace()
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect());
            }
        }
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, …) with `kill(1)`.
    pub fn signal(&self, signal: &str) -> Result<(), String> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .map_err(|e| format!("kill -{signal}: {e}"))?;
        status.success().then_some(()).ok_or_else(|| format!("kill -{signal} {} failed", self.pid()))
    }

    /// Stops the child (SIGSTOP) and waits until the kernel reports it stopped, so nothing it
    /// answers afterwards can have raced the signal.
    pub fn stop(&self) -> Result<(), String> {
        self.signal("STOP")?;
        let deadline = std::time::Instant::now() + START_DEADLINE;
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
            if matches!(state, Some("T" | "t")) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("pid {} did not stop", self.pid()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Kills the child now (it is reaped too).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the child has exited (with its status).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One pod of a running `kvindex-sim`, as it reported itself.
#[derive(Debug, Clone)]
pub struct SimPod {
    /// The pod id the indexer reports (`127.0.0.1:<http port>`).
    pub pod_id: String,
    /// `host:port` of its HTTP API.
    pub http: String,
    /// Its replay ROUTER endpoint, if any.
    pub replay: Option<String>,
}

impl SimPod {
    /// `<pod-id>=http://<http>`, the router's `--pod` syntax.
    pub fn router_spec(&self) -> String {
        format!("{}=http://{}", self.pod_id, self.http)
    }
}

/// A `kvindex-sim` process and its pods.
pub struct SimFleet {
    pub process: ChildProcess,
    pub pods: Vec<SimPod>,
}

impl SimFleet {
    /// Starts `binary --pods <n> <args…>` and reads its n pod lines.
    pub fn start(binary: &Path, pods: usize, args: &[&str]) -> Result<SimFleet, String> {
        let process = ChildProcess::spawn(Command::new(binary).arg("--pods").arg(pods.to_string()).args(args))?;
        let mut found = Vec::with_capacity(pods);
        while found.len() < pods {
            let line = process.next_line(START_DEADLINE)?;
            let Ok(pod) = serde_json::from_str::<Value>(&line) else { continue };
            let text = |key: &str| pod[key].as_str().map(str::to_string);
            found.push(SimPod {
                pod_id: text("pod_id").ok_or_else(|| format!("pod line without pod_id: {line}"))?,
                http: text("http").ok_or_else(|| format!("pod line without http: {line}"))?,
                replay: text("replay"),
            });
        }
        Ok(SimFleet { process, pods: found })
    }
}

/// A `kvindex-router serve` process.
pub struct RouterProcess {
    pub process: ChildProcess,
    /// `host:port` of `--http-addr`.
    pub http: String,
    /// `host:port` of `--admin-addr`, when given.
    pub admin: Option<String>,
    /// `host:port` of `--metrics-addr`, when given.
    pub metrics: Option<String>,
    /// `host:port` of `--probe-addr`, when given.
    pub probe: Option<String>,
}

impl RouterProcess {
    /// Starts `binary serve --http-addr 127.0.0.1:0 <args…>` and reads its addresses.
    pub fn start(binary: &Path, args: &[String]) -> Result<RouterProcess, String> {
        let process =
            ChildProcess::spawn(Command::new(binary).args(["serve", "--http-addr", "127.0.0.1:0"]).args(args))?;
        let addrs = process.listening("KVINDEX_ROUTER_LISTENING ")?;
        let http = addrs.get("http").cloned().ok_or("KVINDEX_ROUTER_LISTENING without http=")?;
        let named = |name: &str| addrs.get(name).cloned();
        Ok(RouterProcess { process, http, admin: named("admin"), metrics: named("metrics"), probe: named("probe") })
    }
}
