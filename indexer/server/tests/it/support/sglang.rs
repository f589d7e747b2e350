//! Driving SGLang's own publisher (tests/python/sglang_peer.py and, for other releases and DP
//! ranks, sglang_release_peer.py) against the service: the waits and the after-every-batch
//! comparison with what SGLang would serve, shared by service_sglang.rs (the pinned release)
//! and service_sglang_releases.rs (older releases, DP rank 1).

use serde_json::{json, Value};

use super::{wait_until, Admin, Peer, Server};

pub const SGLANG_MODEL: &str = "Qwen/Qwen3-0.6B";
pub const SGLANG_BLOCK: u64 = 16;

/// The venv's Python when it has what the SGLang peers import (the peer itself fails loudly,
/// and so the test, when the sglang wheel is not installed).
pub fn sglang_python() -> Option<std::path::PathBuf> {
    kvindex_testkit::env::python_with(&["zmq", "msgspec", "grpc", "grpc_tools", "pydantic"])
}

/// `n` tokens of chain `k` (distinct chains share no first block).
pub fn tokens(k: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|j| 1 + k * 10_000 + j).collect()
}

/// `kvindex serve` dialling `pod`, an SGLang pod whose publisher the peer started as `name`
/// (`started`: its answer, with the bound endpoints), connected to the peer's gRPC client and
/// subscribed.
pub fn serve_dialling(peer: &mut Peer, name: &str, pod: &str, started: &Value) -> Server {
    let flag = format!(
        "{pod},{SGLANG_MODEL},{},{},engine=sglang",
        started["endpoint"].as_str().unwrap(),
        started["replay_endpoint"].as_str().unwrap()
    );
    let server = Server::start(&["--block-size", "16", "--pod", &flag]);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    subscribed(peer, &server, name);
    server
}

/// Pings `name` until the indexer has seen a ping (its SUB is subscribed, or its dialer
/// connected), replaying whatever came before.
pub fn subscribed(peer: &mut Peer, server: &Server, name: &str) {
    let pod = peer.cmd(json!({"op": "sgl_info", "names": [name]}))["pubs"][name]["pod"].as_str().unwrap().to_string();
    wait_until(&format!("{name}'s stream seen by the indexer"), 30, || {
        let seq = peer.cmd(json!({"op": "sgl_ping", "name": name}))["seq"].clone();
        let seen = wait_until_or_none(1, || server.source(&pod).filter(|s| s["last_live_seq"] == seq).map(|_| ()));
        seen.map(|_| ())
    });
}

/// Polls `f` for at most `secs` seconds; `None` when it never answered.
pub fn wait_until_or_none<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits until the indexer has applied every named SGLang publisher's last seq, then until
/// every chain scores exactly what its publisher serves; asserts at every poll that no chain
/// scores more. Returns the last comparison.
pub fn exact(peer: &mut Peer, server: &Server, names: &[&str]) -> Value {
    exact_by(peer, server, names, "sgl_check")
}

/// [`exact`] with the comparison op `check`: `sgl_check` (each publisher's own chains on its
/// own pod) or `sgl_check_fleet` (sglang_release_peer.py: every chain on every named pod).
pub fn exact_by(peer: &mut Peer, server: &Server, names: &[&str], check: &str) -> Value {
    caught_up(peer, server, names);
    wait_until(&format!("{names:?} scored as SGLang serves them"), 30, || {
        let r = peer.cmd(json!({"op": check, "names": names, "model": SGLANG_MODEL, "block_size": SGLANG_BLOCK}));
        assert_eq!(r["violations"], json!([]), "a pod was credited with a block SGLang would not serve: {r}");
        (r["mismatches"] == json!([])).then_some(r)
    })
}

/// Waits until the indexer has applied every named SGLang publisher's last seq.
pub fn caught_up(peer: &mut Peer, server: &Server, names: &[&str]) {
    let info = peer.cmd(json!({"op": "sgl_info", "names": names}));
    let caught_up = wait_until_or_none(30, || {
        names
            .iter()
            .all(|n| {
                let p = &info["pubs"][n];
                server
                    .source(p["pod"].as_str().unwrap())
                    .is_some_and(|s| s["last_seq"] == p["last_seq"] && s["state"] != "REPLAYING")
            })
            .then_some(())
    });
    assert!(caught_up.is_some(), "the indexer did not catch up with {info} in 30s: {}", server.sources());
}

pub fn store(peer: &mut Peer, name: &str, chain: &str, tokens: &[u32]) {
    peer.cmd(json!({"op": "sgl_store", "name": name, "chain": chain, "tokens": tokens}));
}
