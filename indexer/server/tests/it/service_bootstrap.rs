//! Replicas that start from a sibling and prove they agree, as real processes: two (or more)
//! `kvindex serve` binaries dialling the same independent pyzmq/msgspec publishers, whose replay
//! buffers (20 messages) no longer reach their first batches, so only a sibling's index can
//! bring a new replica's old blocks back. `--bootstrap-from` must give the new replica exactly
//! its sibling's scores once ready (never a block a publisher does not hold); a sibling that
//! dies mid-stream, lies, stalls or sends too much must leave it cold, never half imported.
//! `kvindex compare` must find no difference between two caught-up replicas, and name the pod
//! whose stream was cut on one of them. The broken siblings are a grpcio relay
//! (`tests/python/sibling_proxy.py`) that breaks the real sibling's stream.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = "m";
const NAMES: [&str; 2] = ["a", "b"];
const PODS: [&str; 2] = ["a:8000", "b:8000"];
/// Chains published before any new replica starts: more than the replay buffers hold.
const OLD: u32 = 40;

/// The publishers (one per pod) and their ports.
struct Fleet {
    peer: Peer,
    ports: Vec<(u16, u16)>,
    /// The next chain to publish.
    next: u32,
}

fn tokens(pod: usize, k: u32) -> Vec<u32> {
    chain(k + 1000 * pod as u32, 4)
}

impl Fleet {
    fn start(py: &PathBuf) -> Fleet {
        let mut peer = Peer::start(py);
        let mut ports = Vec::new();
        for (name, pod) in NAMES.iter().zip(PODS) {
            let (pub_port, replay_port) = (free_port(), free_port());
            peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "bind": format!("tcp://127.0.0.1:{pub_port}"),
                "replay": format!("tcp://127.0.0.1:{replay_port}"), "buffer_steps": 20, "topic": format!("kv@{pod}@{MODEL}")}));
            ports.push((pub_port, replay_port));
        }
        Fleet { peer, ports, next: 0 }
    }

    /// `--pod` flags for every pod; pod 0's PUB through `relay_a` when given.
    fn pod_flags(&self, relay_a: Option<&str>) -> Vec<String> {
        let mut out = Vec::new();
        for (i, (pod, (pub_port, replay_port))) in PODS.iter().zip(&self.ports).enumerate() {
            let pub_ep = match (i, relay_a) {
                (0, Some(relay)) => format!("tcp://{relay}"),
                _ => format!("tcp://127.0.0.1:{pub_port}"),
            };
            out.push("--pod".to_string());
            out.push(format!("{pod},{MODEL},{pub_ep},tcp://127.0.0.1:{replay_port}"));
        }
        out
    }

    /// A `kvindex serve` over the fleet, with `extra` flags.
    fn serve(&self, relay_a: Option<&str>, extra: &[&str]) -> ServeProcess {
        let token = admin_token_file();
        let own_token = !extra.contains(&"--admin-token-file");
        let mut args: Vec<String> = [
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--block-size",
            "16",
            "--replay-timeout-ms",
            "3000",
            "--replay-cooldown-ms",
            "100",
        ]
        .map(String::from)
        .to_vec();
        if own_token {
            args.extend(["--admin-token-file".to_string(), token.to_str().unwrap().to_string()]);
        }
        args.extend(self.pod_flags(relay_a));
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kvindex_serve().args(&args).start().expect("kvindex serve")
    }

    /// Waits for a new subscription on every publisher (a server that just started).
    fn subscribed(&mut self) {
        assert_eq!(self.peer.cmd(json!({"op": "wait_sub", "names": NAMES, "fresh": true}))["subscribed"], true);
    }

    /// Publishes `n` more chains on every pod, with a removal now and then.
    fn publish(&mut self, n: u32) {
        for k in self.next..self.next + n {
            for (i, name) in NAMES.iter().enumerate() {
                self.peer.cmd(json!({"op": "store", "name": name, "chain": format!("c{k}"), "tokens": tokens(i, k)}));
                if k % 7 == 3 {
                    self.peer.cmd(json!({"op": "remove", "name": name, "tokens": tokens(i, k - 2), "blocks": [2, 3]}));
                }
            }
        }
        self.next += n;
    }

    /// Waits until `server` has applied every publisher's last seq; returns the pods' states
    /// (EXACT, or DEGRADED for a cold replica whose start-up replay no longer reaches seq 0).
    fn settle(&mut self, server: &ServeProcess) -> Vec<String> {
        let info = self.peer.cmd(json!({"op": "info", "names": NAMES}));
        wait_until("caught up with every publisher", 60, || {
            NAMES
                .iter()
                .zip(PODS)
                .map(|(name, pod)| {
                    let s = debug_source(&server.http, pod)?;
                    let state = s["state"].as_str()?;
                    (s["last_seq"] == info["pubs"][name]["last_seq"] && (state == "EXACT" || state == "DEGRADED"))
                        .then(|| state.to_string())
                })
                .collect::<Option<Vec<String>>>()
        })
    }

    /// Every pod's score for every chain published (and one never published), on `server`.
    fn scores(&mut self, server: &ServeProcess) -> Vec<Value> {
        self.peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
        let mut out = Vec::new();
        for k in 0..self.next {
            for pod in 0..PODS.len() {
                out.push(self.peer.score(MODEL, &tokens(pod, k), &[])["scores"].clone());
            }
        }
        out.push(self.peer.score(MODEL, &chain(99_999, 2), &[])["scores"].clone());
        out
    }

    /// The one rule on `server`: no pod credited with a block its publisher does not hold.
    fn check(&mut self, server: &ServeProcess) -> Value {
        self.peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
        self.peer.check(&NAMES, MODEL)
    }

    /// `pod`'s matched blocks for chain `k` on `server`.
    fn matched(&mut self, server: &ServeProcess, pod: usize, k: u32) -> u64 {
        self.peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
        self.peer.score_pod(MODEL, &tokens(pod, k), PODS[pod]).0
    }
}

fn ready(server: &ServeProcess, secs: u64) {
    wait_until("ready", secs, || (http_request(&server.http, "GET", "/readyz", None).0 == 200).then_some(()));
}

/// A sibling that has applied `OLD` chains on every pod (and one more, so the start-up replay
/// of seq 0 is not raced by the rest), settled.
fn sibling_with_history(fleet: &mut Fleet) -> ServeProcess {
    let sibling = fleet.serve(None, &[]);
    fleet.subscribed();
    fleet.publish(1);
    fleet.settle(&sibling);
    fleet.publish(OLD - 1);
    assert_eq!(fleet.settle(&sibling), ["EXACT", "EXACT"]);
    sibling
}

/// `tests/python/sibling_proxy.py <upstream> <mode> [n]`, and the address it serves.
struct Proxy {
    child: Child,
    addr: String,
}

impl Proxy {
    fn start(py: &PathBuf, upstream: &str, mode: &str, n: u32) -> Proxy {
        let script = workspace().join("indexer/server/tests/python/sibling_proxy.py");
        let mut child = Command::new(py)
            .arg(script)
            .args([upstream, mode, &n.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sibling_proxy.py");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("sibling_proxy.py said {line:?}: {e}"));
        Proxy { child, addr: v["addr"].as_str().unwrap().to_string() }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kvindex compare a b`: (exit code, stdout).
fn compare(a: &ServeProcess, b: &ServeProcess) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["compare", &a.grpc, &b.grpc, "--attempts", "20"])
        .output()
        .expect("run kvindex compare");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("kvindex compare: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), stdout)
}

#[test]
fn a_new_replica_bootstraps_from_its_sibling_and_scores_exactly_as_it_does() {
    let Some(py) = python() else { return };
    let mut fleet = Fleet::start(&py);
    let sibling = sibling_with_history(&mut fleet);

    // Control: a replica that starts cold cannot get the old chains back (the replay buffers no
    // longer reach them), so its scores differ from its sibling's: under-reported, never over.
    let cold = fleet.serve(None, &[]);
    fleet.subscribed();
    fleet.publish(1);
    ready(&cold, 30);
    fleet.settle(&cold);
    fleet.settle(&sibling);
    assert_ne!(fleet.scores(&cold), fleet.scores(&sibling), "a cold replica lacks the old chains");
    assert_eq!(fleet.matched(&cold, 0, 0), 0);
    fleet.check(&cold);
    drop(cold);

    let replica = fleet.serve(None, &["--bootstrap-from", &sibling.grpc, "--sibling-check-interval-ms", "300"]);
    // Its streams start once the sibling's index is in; the next batch proves each record.
    fleet.subscribed();
    fleet.publish(1);
    ready(&replica, 60);
    assert_eq!(fleet.settle(&replica), ["EXACT", "EXACT"], "the sibling's records proven and imported");
    fleet.settle(&sibling);
    assert_eq!(fleet.scores(&replica), fleet.scores(&sibling), "once ready, every probe scores as on the sibling");
    assert_eq!(fleet.matched(&replica, 0, 0), 4, "an old chain, long out of the replay buffer");
    let r = fleet.check(&replica);
    assert_eq!(r["mismatches"], json!([]), "EXACT pods hold exactly what their publishers hold: {r}");
    assert_eq!(http_metric(&replica.http, "kvindex_bootstrap_total", &["outcome=\"loaded\""]), 1.0);
    assert_eq!(http_metric(&replica.http, "kvindex_snapshot_restored_pods_total", &["outcome=\"imported\""]), 2.0);
    assert_eq!(http_metric(&sibling.http, "kvindex_sibling_exports_total", &["outcome=\"ok\""]), 1.0);

    // Both hold the same for every pod, and say so in /debug/sources and to `kvindex compare`.
    let digests = |s: &ServeProcess| PODS.map(|p| debug_source(&s.http, p).unwrap()["digest"].clone());
    assert_eq!(digests(&replica), digests(&sibling));
    assert!(digests(&sibling).iter().all(|d| d.as_str().is_some_and(|d| d.len() == 16 && d != "0000000000000000")));
    let (code, out) = compare(&sibling, &replica);
    assert_eq!(code, 0, "two caught-up replicas agree: {out}");
    assert!(out.contains("2 pods, 2 agree, 0 differ"), "{out}");
    // The opt-in periodic check agrees too.
    wait_until("the sibling check", 30, || {
        (http_metric(&replica.http, "kvindex_sibling_pods", &["verdict=\"agree\""]) == 2.0).then_some(())
    });
    assert_eq!(http_metric(&replica.http, "kvindex_sibling_pods", &["verdict=\"differ\""]), 0.0);
}

#[test]
fn compare_names_the_pod_whose_stream_was_cut_on_one_replica() {
    let Some(py) = python() else { return };
    let mut fleet = Fleet::start(&py);
    let first = fleet.serve(None, &[]);
    fleet.subscribed();
    // The second replica reaches pod a's publisher through a link this test cuts.
    let link = Proxy::start(&py, &format!("127.0.0.1:{}", fleet.ports[0].0), "tcp", 0);
    let second = fleet.serve(Some(&link.addr), &[]);
    fleet.subscribed();
    fleet.publish(1);
    fleet.settle(&first);
    fleet.settle(&second);
    fleet.publish(10);
    fleet.settle(&first);
    fleet.settle(&second);
    let (code, out) = compare(&first, &second);
    assert_eq!(code, 0, "both caught up: {out}");

    drop(link);
    fleet.publish(3);
    fleet.settle(&first);
    let (code, out) = compare(&first, &second);
    assert_eq!(code, 1, "the replicas differ: {out}");
    let named: Vec<&str> =
        out.lines().filter_map(|l| l.split_whitespace().next()).filter(|p| PODS.contains(p)).collect();
    assert_eq!(named, ["a:8000"], "only the cut pod is named: {out}");
    fleet.check(&second);
}

/// How the sibling misbehaves (a `sibling_proxy.py` mode and its N, or none: the sibling
/// itself), the replica's flags, and the outcome it must count.
type BrokenSibling<'a> = (Option<(&'a str, u32)>, Vec<&'a str>, &'a str);

#[test]
fn a_sibling_that_dies_lies_stalls_or_oversends_mid_bootstrap_means_a_cold_start() {
    let Some(py) = python() else { return };
    let mut fleet = Fleet::start(&py);
    let mut sibling = sibling_with_history(&mut fleet);
    let wrong_token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(wrong_token.path(), "another-token-0123456789abcdef").unwrap();
    let wrong_token = wrong_token.path().to_str().unwrap().to_string();
    let cases: Vec<BrokenSibling> = vec![
        (Some(("die_after", 2)), vec![], "interrupted"),
        (Some(("unbounded", 0)), vec!["--bootstrap-max-bytes", "64"], "too_large"),
        (Some(("flip", 1)), vec![], "damaged"),
        (Some(("stall", 1)), vec!["--bootstrap-timeout-ms", "3000"], "timeout"),
        (None, vec!["--bootstrap-max-bytes", "64"], "too_large"),
        (None, vec!["--admin-token-file", &wrong_token], "denied"),
    ];
    for (broken, flags, outcome) in cases {
        let proxy = broken.map(|(mode, n)| Proxy::start(&py, &sibling.grpc, mode, n));
        let from = proxy.as_ref().map_or(sibling.grpc.clone(), |p| p.addr.clone());
        let mut args = vec!["--bootstrap-from", from.as_str()];
        args.extend(flags);
        let replica = fleet.serve(None, &args);
        fleet.subscribed();
        fleet.publish(1);
        ready(&replica, 60);
        fleet.settle(&replica);
        assert_eq!(
            http_metric(&replica.http, "kvindex_bootstrap_total", &[&format!("outcome=\"{outcome}\"")]),
            1.0,
            "{outcome}"
        );
        assert_eq!(http_metric(&replica.http, "kvindex_bootstrap_total", &["outcome=\"loaded\""]), 0.0, "{outcome}");
        // Cold, never half: not one record of the sibling went in, even those that arrived whole.
        assert_eq!(http_metric(&replica.http, "kvindex_snapshot_restored_pods_total", &["outcome=\"imported\""]), 0.0);
        assert_eq!((fleet.matched(&replica, 0, 0), fleet.matched(&replica, 1, 0)), (0, 0), "{outcome}");
        fleet.check(&replica);
    }
    assert_eq!(http_metric(&sibling.http, "kvindex_sibling_exports_total", &["outcome=\"denied\""]), 1.0);
    // The direct request carried its bound, and the sibling refused at once; the relay that
    // dropped it made the sibling send everything, and the replica refused it on arrival.
    assert_eq!(http_metric(&sibling.http, "kvindex_sibling_exports_total", &["outcome=\"too_large\""]), 1.0);

    // Nothing listens where the sibling should be (the first replica of an install).
    let nowhere = format!("127.0.0.1:{}", free_port());
    let replica = fleet.serve(None, &["--bootstrap-from", &nowhere]);
    fleet.subscribed();
    fleet.publish(1);
    ready(&replica, 60);
    assert_eq!(http_metric(&replica.http, "kvindex_bootstrap_total", &["outcome=\"unreachable\""]), 1.0);
    drop(replica);

    // The sibling itself dies (SIGKILL) while a replica waits for its export.
    let pid = sibling.process.pid().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let replica = fleet.serve(None, &["--bootstrap-from", &sibling.grpc]);
    wait_until("the replica asking", 30, || {
        (http_request(&replica.http, "GET", "/readyz", None).0 == 503).then_some(())
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    sibling.process.kill();
    fleet.subscribed();
    fleet.publish(1);
    ready(&replica, 60);
    fleet.settle(&replica);
    assert_eq!(http_metric(&replica.http, "kvindex_bootstrap_total", &["outcome=\"loaded\""]), 0.0);
    assert_eq!(http_metric(&replica.http, "kvindex_bootstrap_total", &[]), 1.0);
    assert_eq!(fleet.matched(&replica, 0, 0), 0, "cold");
    fleet.check(&replica);
}
