//! The driver of an independent peer process that speaks one JSON object a line: it prints
//! `{"ready": true}` once started, then answers each command written to its stdin with one
//! line. The Python peers (`kvpeer.py` of the server's tests, `zmtppeer.py` of kvindex-zmtp's)
//! each add their own commands on top of this.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::Value;

/// How long a peer may take to print its ready line (Python imports on a loaded box).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one command may take to answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// A running peer; killed (and reaped) when dropped.
pub struct JsonPeer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl JsonPeer {
    /// Spawns `command` (its stdin and stdout piped, stderr to the test's) and waits for the
    /// ready line; panics when it does not come.
    pub fn start(command: &mut Command) -> JsonPeer {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start peer {command:?}: {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let lines = line_reader(child.stdout.take().expect("piped stdout"));
        let mut peer = JsonPeer { child, stdin, lines };
        let ready = peer.read(READY_TIMEOUT);
        assert_eq!(ready["ready"], true, "peer did not start: {ready}");
        peer
    }

    fn read(&mut self, timeout: Duration) -> Value {
        let line = self
            .lines
            .recv_timeout(timeout)
            .unwrap_or_else(|_| panic!("peer did not answer within {}s", timeout.as_secs()));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad peer line {line:?}: {e}"))
    }

    /// Sends a command; returns the reply whether or not it succeeded.
    pub fn try_cmd(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").expect("write to peer");
        self.stdin.flush().expect("flush to peer");
        self.read(ANSWER_TIMEOUT)
    }

    /// Sends a command that must succeed (`"ok": true`).
    pub fn cmd(&mut self, cmd: Value) -> Value {
        let reply = self.try_cmd(cmd.clone());
        assert_eq!(reply["ok"], true, "peer command {cmd} failed: {reply}");
        reply
    }
}

impl Drop for JsonPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of `stream`, read on a thread of their own, so a wait on them can time out.
pub fn line_reader(stream: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer in shell: ready, then echoes `{"ok": true, "got": <line>}` for every line.
    fn echo_peer() -> JsonPeer {
        JsonPeer::start(Command::new("sh").args([
            "-c",
            r#"echo '{"ready": true}'; while read -r line; do echo "{\"ok\": true, \"got\": $line}"; done"#,
        ]))
    }

    #[test]
    fn a_command_is_answered_by_its_line() {
        let mut peer = echo_peer();
        let reply = peer.cmd(serde_json::json!({"op": "x", "n": 1}));
        assert_eq!(reply["got"]["n"], 1);
    }

    #[test]
    #[should_panic(expected = "peer did not start")]
    fn a_peer_that_is_not_ready_fails_loudly() {
        JsonPeer::start(Command::new("sh").args(["-c", r#"echo '{"ready": false}'"#]));
    }
}
