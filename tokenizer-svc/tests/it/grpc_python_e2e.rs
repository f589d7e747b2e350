//! The `kvindex-tokenizer` binary, started with the fixed CLI contract, driven by a Python
//! `grpcio` client (tests/python/grpc_client.py) over TCP and a Unix socket, with every answer
//! checked against transformers, plus the Prometheus endpoint.
use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const MODELS: &[&str] =
    &["deepseek", "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct", "mistralai-Mistral-7B-Instruct-v0.3"];

/// Kills the server even when an assertion fails.
struct Running(Child);
impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use kvindex_testkit::ports::free_port;

#[test]
fn grpcio_client_drives_the_binary_over_tcp_and_uds() {
    let (Some(fixtures), Some(python)) = (common::fixtures(), common::python()) else {
        return;
    };
    let scratch = common::scratch_dir("grpcio-e2e");
    let uds = scratch.join("tokenizer.sock");
    let metrics = format!("127.0.0.1:{}", free_port());
    let models = fixtures.join("models");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvindex-tokenizer"));
    cmd.args(["serve", "--grpc-addr", "127.0.0.1:0", "--uds"]).arg(&uds).args(["--http-addr", &metrics]);
    for m in MODELS {
        cmd.arg("--model").arg(format!("{m}={}", models.join(m).display()));
    }
    let mut server =
        Running(cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("start kvindex-tokenizer"));

    // Wait (with a deadline) for the one line announcing the bound address.
    let stdout = server.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).expect("server announces its address within 60 s");
    let tcp = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .unwrap_or_else(|| panic!("unexpected announcement {line:?}"))
        .to_string();

    let output = Command::new(&python)
        .arg(common::python_dir().join("grpc_client.py"))
        .args(["--tcp", &tcp, "--uds"])
        .arg(&uds)
        .arg("--models-dir")
        .arg(&models)
        .args(["--models", &MODELS.join(","), "--metrics-url", &format!("http://{metrics}/metrics")])
        .output()
        .expect("run grpc_client.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    assert!(output.status.success(), "grpcio client failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("matched transformers over TCP and UDS"));
}
