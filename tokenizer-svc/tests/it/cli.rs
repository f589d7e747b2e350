//! The binary's fixed command-line contract: `serve --grpc-addr <host:port> [--uds <path>]
//! [--model <name>=<dir>]... [--models-dir <dir>]`, its start-up errors and graceful shutdown.
use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::trained;

/// Kills the server if the test fails before it exits on its own.
struct Running(std::process::Child);
impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn run_to_exit(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex-tokenizer")).args(args).output().expect("run binary");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn start_up_errors_are_clear_and_exit_non_zero() {
    let (ok, err) = run_to_exit(&["serve", "--grpc-addr", "127.0.0.1:0"]);
    assert!(!ok && err.contains("no models configured"), "{err}");
    let (ok, err) = run_to_exit(&["serve", "--grpc-addr", "127.0.0.1:0", "--model", "no-equals"]);
    assert!(!ok && err.contains("<name>=<dir>"), "{err}");
    let (ok, err) = run_to_exit(&["serve", "--grpc-addr", "127.0.0.1:0", "--model", "m=/nonexistent/dir"]);
    assert!(!ok && err.contains("has no tokenizer.json"), "{err}");
    let (ok, err) = run_to_exit(&["serve", "--grpc-addr", "not-an-address", "--model", "m=/x"]);
    assert!(!ok && err.contains("--grpc-addr"), "{err}");
    let root = common::scratch_dir("cli-budget");
    let model = format!("m={}", trained::chatml_model(&root, "m").display());
    let (ok, err) = run_to_exit(&[
        "serve",
        "--grpc-addr",
        "127.0.0.1:0",
        "--model",
        &model,
        "--client-chat-template-memory-mib",
        "1",
    ]);
    assert!(!ok && err.contains("--client-chat-template-memory-mib: must be at least 16"), "{err}");
}

#[test]
fn serves_models_dir_and_model_flags_then_stops_on_sigterm() {
    let root = common::scratch_dir("cli-serve");
    let models = root.join("models");
    trained::chatml_model(&models, "alpha");
    let extra = trained::raising_model(&root, "beta");
    let uds = root.join("tok.sock");
    let mut child = Running(
        Command::new(env!("CARGO_BIN_EXE_kvindex-tokenizer"))
            .args(["serve", "--grpc-addr", "127.0.0.1:0", "--preload", "alpha,beta", "--models-dir"])
            .arg(&models)
            .arg("--model")
            .arg(format!("beta={}", extra.display()))
            .arg("--uds")
            .arg(&uds)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(30)).expect("announcement");
    assert!(line.starts_with("kvindex-tokenizer listening grpc=127.0.0.1:"), "{line}");
    assert!(line.ends_with(&format!("uds={}", uds.display())), "{line}");
    assert!(uds.exists());

    let status = Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break exit;
        }
        assert!(std::time::Instant::now() < deadline, "still running 30 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    assert!(!uds.exists(), "socket removed on shutdown");
}
