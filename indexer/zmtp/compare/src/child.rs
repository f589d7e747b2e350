//! Child processes of this binary (a subscriber, the publishers), their JSON-line output read
//! on a thread, killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child as Process, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Child {
    process: Process,
    lines: Receiver<Value>,
}

impl Child {
    /// Runs this executable with `args`; `max_fds` caps its descriptors (RLIMIT_NOFILE).
    pub fn spawn(args: &[String], max_fds: Option<u64>) -> Child {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if let Some(n) = max_fds {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut process = cmd.spawn().expect("spawn child");
        let stdout = process.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str(&line) else { continue };
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Child { process, lines }
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// The next line that has `key`, within `timeout`.
    pub fn expect(&self, key: &str, timeout: Duration) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let v = self.lines.recv_timeout(left).ok()?;
            if v.get(key).is_some() {
                return Some(v);
            }
        }
    }

    /// Every line received within `window`.
    pub fn drain(&self, window: Duration) -> Vec<Value> {
        let deadline = Instant::now() + window;
        let mut out = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(v) => out.push(v),
                Err(_) => break,
            }
        }
        out
    }

    /// Lines until `done` says stop (it sees each), or `timeout`.
    pub fn until(&self, timeout: Duration, mut done: impl FnMut(&Value) -> bool) -> (Vec<Value>, bool) {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(v) => {
                    let stop = done(&v);
                    out.push(v);
                    if stop {
                        return (out, true);
                    }
                }
                Err(_) => break,
            }
        }
        (out, false)
    }

    /// Whether the process is still running (not crashed or aborted).
    pub fn alive(&mut self) -> Result<(), String> {
        match self.process.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                use std::os::unix::process::ExitStatusExt;
                Err(match (status.code(), status.signal()) {
                    (Some(0), _) => "exited normally".to_string(),
                    (_, Some(6)) => "killed by SIGABRT".to_string(),
                    (_, Some(sig)) => format!("killed by signal {sig}"),
                    (code, _) => format!("exited with {code:?}"),
                })
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
