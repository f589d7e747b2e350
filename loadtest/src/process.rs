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

/// `name` from the target directory: `$<env_var>`, else beside the running executable's
/// profile directory (`target/<profile>/deps/<test>` → `target/<profile>/<name>`), else
/// `$CARGO_TARGET_DIR/debug/<name>`. `None` (with the places looked at) when absent.
pub fn workspace_binary(name: &str, env_var: &str) -> Result<PathBuf, String> {
    let candidates = [
        std::env::var_os(env_var).map(PathBuf::from),
        std::env::current_exe().ok().and_then(|exe| {
            let dir = exe.parent()?;
            let dir = if dir.ends_with("deps") { dir.parent()? } else { dir };
            Some(dir.join(name))
        }),
        std::env::var_os("CARGO_TARGET_DIR").map(|dir| PathBuf::from(dir).join("debug").join(name)),
    ];
    candidates.iter().flatten().find(|path| path.is_file()).cloned().ok_or_else(|| {
        format!(
            "no {name} binary among {:?} (build the workspace, or set {env_var})",
            candidates.iter().flatten().collect::<Vec<_>>()
        )
    })
}

/// The package that builds each workspace binary a test may need.
const PACKAGE_OF: &[(&str, &str)] = &[
    ("kvindex", "kvindex-server"),
    ("kvindex-sim", "kvindex-loadtest"),
    ("kvindex-policies", "kvindex-loadtest"),
    ("kvindex-router", "kvindex-router"),
    ("kvindex-tokenizer", "kvindex-tokenizer"),
];

/// For tests: the binary, built on demand when it is not there yet (a crate's tests run alone,
/// `cargo test -p kvindex-router`, do not build the other crates' binaries). Panics with the
/// places looked at and the build's error when it can be neither found nor built: a test that
/// needs a binary fails loudly rather than skipping.
pub fn required_binary(name: &str, env_var: &str) -> PathBuf {
    match workspace_binary(name, env_var) {
        Ok(path) => path,
        Err(missing) => match build_binary(name) {
            Ok(path) => path,
            Err(build) => panic!("{missing}; building it failed: {build}"),
        },
    }
}

/// `cargo build --bin <name>` into the target and profile directory the running test lives in.
fn build_binary(name: &str) -> Result<PathBuf, String> {
    let package = PACKAGE_OF
        .iter()
        .find(|(bin, _)| *bin == name)
        .map(|(_, package)| *package)
        .ok_or_else(|| format!("{name} is not a workspace binary this helper knows how to build"))?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let profile_dir = exe.parent().map(|d| if d.ends_with("deps") { d.parent().unwrap_or(d) } else { d });
    let profile_dir = profile_dir.ok_or("the test executable has no directory")?;
    let target_dir = profile_dir.parent().ok_or("the profile directory has no parent")?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => return Err("the profile directory has no name".into()),
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building {name} (package {package}, profile {profile}) for this test");
    let status = Command::new(cargo)
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", package, "--bin", name, "--profile", &profile])
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    let path = profile_dir.join(name);
    match (status.success(), path.is_file()) {
        (true, true) => Ok(path),
        (true, false) => Err(format!("cargo built {name} but {} is not there", path.display())),
        (false, _) => Err(format!("cargo build -p {package} --bin {name} exited with {status}")),
    }
}

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
}

impl RouterProcess {
    /// Starts `binary serve --http-addr 127.0.0.1:0 <args…>` and reads its addresses.
    pub fn start(binary: &Path, args: &[String]) -> Result<RouterProcess, String> {
        let process =
            ChildProcess::spawn(Command::new(binary).args(["serve", "--http-addr", "127.0.0.1:0"]).args(args))?;
        let addrs = process.listening("KVINDEX_ROUTER_LISTENING ")?;
        let http = addrs.get("http").cloned().ok_or("KVINDEX_ROUTER_LISTENING without http=")?;
        Ok(RouterProcess { process, http, admin: addrs.get("admin").cloned(), metrics: addrs.get("metrics").cloned() })
    }
}
