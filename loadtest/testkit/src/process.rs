//! A child process of one of the workspace's binaries, for tests and benchmarks that run the
//! real thing on loopback: its stdout read line by line on a thread (so the child never blocks
//! on it), the `KEY=value` pairs of the line where it reports its addresses, signals, and a
//! kill and reap on drop, however the test ends.
//!
//! Children's stderr is discarded unless `$KVINDEX_TEST_LOG_DIR` names a directory, where each
//! child then logs to `<name>-<pid>.log`; [`ChildProcess::spawn_logging`] passes it through to
//! the test's own output instead.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// How long a child may take to report its addresses (a debug build on a loaded box).
pub const START_DEADLINE: Duration = Duration::from_secs(60);

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
        let name = program_name(command);
        let stderr = match std::env::var_os("KVINDEX_TEST_LOG_DIR") {
            Some(dir) => {
                let path = PathBuf::from(dir).join(format!("{name}-{}-{}.log", std::process::id(), unique()));
                Stdio::from(std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?)
            }
            None => Stdio::null(),
        };
        Self::spawn_with_stderr(command, stderr)
    }

    /// [`ChildProcess::spawn`] with the child's stderr going to the test's own output (shown
    /// when the test fails), for the tests of the binary itself.
    pub fn spawn_logging(command: &mut Command) -> Result<ChildProcess, String> {
        Self::spawn_with_stderr(command, Stdio::inherit())
    }

    fn spawn_with_stderr(command: &mut Command, stderr: Stdio) -> Result<ChildProcess, String> {
        let name = program_name(command);
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
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for the child to exit on its own (after a signal the test sent).
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait()
    }
}

fn program_name(command: &Command) -> String {
    Path::new(command.get_program()).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
