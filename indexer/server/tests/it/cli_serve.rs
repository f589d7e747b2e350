//! The `kvindex serve` binary itself: the fixed command-line contract (port 0, the
//! `KVINDEX_LISTENING` line, a graceful exit on SIGTERM), and configuration errors that name
//! the key and where its value came from (flag, env var, file), with exit status 1.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// Runs `kvindex serve` with `args` and `env`, which must fail; returns its stderr.
fn serve_fails(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .arg("serve")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{args:?} {env:?} should fail with status 1");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("KVINDEX_LISTENING"), "{args:?}: announced it listens, then failed: {stdout}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Sends `server` SIGTERM and waits (at most 20 s) for it to exit.
fn stop_with_sigterm(server: &mut ServeProcess) -> std::process::ExitStatus {
    let status = Command::new("kill").args(["-TERM", &server.process.pid().to_string()]).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(exit) = server.process.try_wait() {
            return exit;
        }
        assert!(Instant::now() < deadline, "kvindex serve did not exit within 20s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_contract_listening_line_and_graceful_sigterm() {
    let mut server = kvindex_serve()
        .args([
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--block-size",
            "16",
            "--zmq-bind",
            "tcp://127.0.0.1:0",
        ])
        .start()
        .expect("kvindex serve");
    assert!(server.zmq.as_deref().is_some_and(|z| z.starts_with("tcp://127.0.0.1:")), "{:?}", server.zmq);
    assert_eq!(http_request(&server.http, "GET", "/healthz", None), (200, "ok\n".to_string()));
    let exit = stop_with_sigterm(&mut server);
    assert!(exit.success(), "graceful shutdown exits 0, got {exit}");
}

/// A supervisor may send SIGTERM as soon as it reads the listening line: the handler is in
/// place by then (it was registered on first poll, after start-up work, and SIGTERM's default
/// action killed the process).
#[test]
fn a_sigterm_right_after_the_listening_line_is_a_graceful_stop() {
    for _ in 0..3 {
        let mut server = kvindex_serve()
            .args([
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
                "--block-size",
                "16",
                "--zmq-bind",
                "tcp://127.0.0.1:0",
            ])
            .start()
            .expect("kvindex serve");
        let exit = stop_with_sigterm(&mut server);
        assert!(exit.success(), "a SIGTERM at once is a graceful stop too, got {exit}");
    }
}

#[test]
fn serve_config_errors_name_the_key_and_its_origin() {
    let e = serve_fails(&["--block-size", "0"], &[]);
    assert!(e.contains("block_size (flag --block-size)"), "{e}");
    let e = serve_fails(&[], &[("KVINDEX_BLOCK_SIZE", "0")]);
    assert!(e.contains("block_size (env KVINDEX_BLOCK_SIZE)"), "{e}");
    let e = serve_fails(&[], &[("KVINDEX_BLOCK_SIZE", "sixteen")]);
    assert!(e.contains("block_size (env KVINDEX_BLOCK_SIZE)"), "a value clap rejects is still the env var's: {e}");
    let e = serve_fails(&["--block-size", "sixteen"], &[("KVINDEX_BLOCK_SIZE", "16")]);
    assert!(e.contains("block_size (flag --block-size)"), "{e}");
    assert!(serve_fails(&["--grpc-addr", "nope"], &[]).contains("grpc_addr"));
    assert!(serve_fails(&["--pod", "a,m"], &[]).contains("pods (flag --pod)"));
    assert!(serve_fails(&["--zmq-bind", "udp://127.0.0.1:1"], &[]).contains("zmq_bind"));
    assert!(serve_fails(&["--zmq-max-parts", "0"], &[]).contains("zmq_max_parts (flag --zmq-max-parts)"));
    let e = serve_fails(&["--admin-token-file", "/nonexistent/token"], &[]);
    assert!(e.contains("admin_token_file (flag --admin-token-file)"), "{e}");
    let dir = std::env::temp_dir().join(format!("kvindex-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.toml");
    std::fs::write(&f, "block_size = 16\nunknown_key = 1\n").unwrap();
    assert!(serve_fails(&["--config", f.to_str().unwrap()], &[]).contains("unknown_key"));
    std::fs::write(&f, "[[pods]]\nid = \"a\"\nmodel = \"\"\n").unwrap();
    let e = serve_fails(&["--config", f.to_str().unwrap()], &[]);
    assert!(e.contains(&format!("pods[0].model (file {})", f.display())), "{e}");
    std::fs::write(&f, "block_size = 0\n").unwrap();
    let e = serve_fails(&[], &[("KVINDEX_CONFIG", f.to_str().unwrap())]);
    assert!(e.contains(&format!("block_size (file {})", f.display())), "{e}");
    // A tokenizer that cannot load fails before the server announces it listens.
    let e = serve_fails(&["--tokenizer-model", &format!("m={}", dir.join("no-such-model").display())], &[]);
    assert!(e.contains("tokenizer_models"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn usage_errors_are_clap_errors() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex")).args(["serve", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex")).arg("--version").output().unwrap();
    assert!(out.status.success());
}
