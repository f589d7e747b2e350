//! SGLang releases other than the pinned one, and DP rank 1, as live sources of `kvindex serve`:
//! each release's own `ZmqEventPublisher` from its PyPI wheel (installed by scripts/setup.sh
//! into `$KVINDEX_VENV/sglang-<version>`, tests/python/sglang_release_peer.py), built as that
//! release's scheduler builds it. Replay replies carry no topic frame before 0.5.22; 0.5.20
//! publishes map-form events, 0.5.19 positional (array-form) ones, and 0.5.6 also records one
//! event per page and no medium. A DP
//! rank offsets both its PUB and its replay port by its rank and stamps its batches with it;
//! the docs name rank r of pod `host:port` the pod `host:(port + r)`. After every batch every
//! chain is scored on every pod of the fleet and compared with what that pod's publisher would
//! serve (0 for another rank's chain): never more, and exactly that once caught up.

use crate::support::sglang::*;
use crate::support::*;
use serde_json::{json, Value};

const MODEL: &str = SGLANG_MODEL;

/// A peer running release `version` of SGLang's publisher (`None`: the venv's pinned one).
fn release_peer(version: Option<&str>) -> Option<Peer> {
    let py = sglang_python()?;
    let mut env = Vec::new();
    if let Some(v) = version {
        let listed = std::fs::read_to_string(workspace().join("scripts/sglang-live-releases.txt")).unwrap();
        assert!(listed.lines().any(|l| l.trim() == v), "SGLang {v} is not in scripts/sglang-live-releases.txt");
        let venv = std::env::var_os("KVINDEX_VENV")
            .map(std::path::PathBuf::from)
            .or_else(|| py.parent()?.parent().map(|p| p.to_path_buf()))?;
        let dir = venv.join(format!("sglang-{v}"));
        if !dir.join(format!("sglang-{v}.dist-info")).is_dir() {
            return kvindex_testkit::env::missing(&format!(
                "SGLang {v} is not installed in {} (bash scripts/setup.sh)",
                dir.display()
            ));
        }
        env.push(("PYTHONPATH", dir.into_os_string()));
    }
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let mut peer = Peer::start_script_with(&py, "sglang_release_peer.py", &env);
    if let Some(v) = version {
        assert_eq!(peer.cmd(json!({"op": "sgl_release"}))["version"], v, "the release's own module is loaded");
    }
    Some(peer)
}

/// Waits for the named publishers, then compares every chain on every named pod.
fn fleet_exact(peer: &mut Peer, server: &Server, names: &[&str]) -> Value {
    exact_by(peer, server, names, "sgl_check_fleet")
}

fn filled(server: &Server) -> f64 {
    server.metric("kvindex_replays_total", &["outcome=\"filled\""])
}

/// Per pod (we dial the engine's PUB): page-size-1 stores, a leaf-first eviction, a gap that
/// the release's replay ROUTER fills, a restart.
fn per_pod(version: &str) {
    let Some(mut peer) = release_peer(Some(version)) else { return };
    let pod = "10.0.0.7:30000";
    let a = peer.cmd(json!({"op": "sgl_engine_start", "name": "a", "pod": pod, "endpoint": "tcp://127.0.0.1:*",
        "replay_endpoint": "tcp://127.0.0.1:*"}));
    let server = serve_dialling(&mut peer, "a", pod, &a);

    let long = tokens(1, 64);
    store(&mut peer, "a", "one", &long[..40]);
    assert_eq!(exact(&mut peer, &server, &["a"])["scores"]["a/one"], json!([2, 2]));
    store(&mut peer, "a", "one", &long);
    assert_eq!(exact(&mut peer, &server, &["a"])["scores"]["a/one"], json!([4, 4]));
    peer.cmd(json!({"op": "sgl_evict", "name": "a", "chain": "one", "pages": 20}));
    assert_eq!(exact(&mut peer, &server, &["a"])["scores"]["a/one"], json!([2, 2]));

    let before = filled(&server);
    peer.cmd(json!({"op": "sgl_drop_next", "name": "a"}));
    store(&mut peer, "a", "lost", &tokens(3, 48));
    store(&mut peer, "a", "after", &tokens(4, 16));
    let r = exact(&mut peer, &server, &["a"]);
    assert_eq!((r["scores"]["a/lost"].clone(), r["scores"]["a/after"].clone()), (json!([3, 3]), json!([1, 1])));
    assert!(filled(&server) > before, "{version}'s replay ROUTER filled the gap");

    let clears = server.metric("kvindex_clears_total", &[]);
    peer.cmd(json!({"op": "sgl_restart", "name": "a"}));
    subscribed(&mut peer, &server, "a");
    assert_eq!(peer.score_pod(MODEL, &long, pod).0, 0, "nothing of the old process is credited");
    store(&mut peer, "a", "new", &tokens(5, 20));
    assert_eq!(exact(&mut peer, &server, &["a"])["scores"]["a/new"], json!([1, 1]));
    assert!(server.metric("kvindex_clears_total", &[]) > clears, "the restart cleared the pod");
}

/// Central (the engine dials our SUB, its topic names it): the same, replay through the
/// registered ROUTER.
fn central(version: &str) {
    let Some(mut peer) = release_peer(Some(version)) else { return };
    let server = Server::central(&[]);
    peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    let pod = "10.0.0.8:30000";
    let s = peer.cmd(json!({"op": "sgl_engine_start", "name": "s", "pod": pod, "endpoint": server.zmq(),
        "replay_endpoint": "tcp://127.0.0.1:*", "topic": format!("kv@{pod}@{MODEL}")}));
    peer.cmd(json!({"op": "register", "pod": pod, "model": MODEL, "replay_endpoint": s["replay_endpoint"], "engine": "sglang"}));
    subscribed(&mut peer, &server, "s");

    let shared = tokens(11, 48);
    store(&mut peer, "s", "shared", &shared);
    assert_eq!(exact(&mut peer, &server, &["s"])["scores"]["s/shared"], json!([3, 3]));
    assert_eq!(server.source(pod).unwrap()["engine"], "sglang");

    let before = filled(&server);
    peer.cmd(json!({"op": "sgl_drop_next", "name": "s"}));
    store(&mut peer, "s", "lost", &tokens(12, 35));
    store(&mut peer, "s", "after", &tokens(13, 16));
    let r = exact(&mut peer, &server, &["s"]);
    assert_eq!((r["scores"]["s/lost"].clone(), r["scores"]["s/after"].clone()), (json!([2, 2]), json!([1, 1])));
    assert!(filled(&server) > before, "{version}'s replay ROUTER filled the gap");

    peer.cmd(json!({"op": "sgl_restart", "name": "s"}));
    subscribed(&mut peer, &server, "s");
    assert_eq!(peer.score_pod(MODEL, &shared, pod).0, 0, "nothing of the old process is credited");
    store(&mut peer, "s", "new", &tokens(14, 32));
    assert_eq!(exact(&mut peer, &server, &["s"])["scores"]["s/new"], json!([2, 2]));
}

/// Two attention-DP ranks of one pod, each built as the release's scheduler builds it from one
/// `--kv-events-config` (PUB `p`, replay `q`: rank 1 binds `p + 1` and `q + 1`). Per pod, the
/// pod is registered once with `dp_size = 2` and dialled by the port rule; central, rank 1
/// dials our SUB's port + 1 (`zmq_bind_dp_size = 2`), both ranks share the topic and the
/// registered replay endpoint, rank 1's ROUTER found by the rule. A gap on rank 1 replays from
/// rank 1's ROUTER; a restart of rank 1 clears rank 1 only.
fn dp_rank_1(version: Option<&str>, central_mode: bool) {
    dp_rank_1_as(version, central_mode, Dp::Attention)
}

/// How the engine runs its ranks: attention DP (each rank its own KV cache shard) or pure data
/// parallelism (attention-DP size 1), where 0.5.19+ offsets by the replica index instead.
#[derive(Clone, Copy)]
enum Dp {
    Attention,
    Replicas,
}

/// The scheduler of `rank`: attention-DP rank of 2, or data-parallel replica (attention-DP 1).
fn scheduler_rank(start: &mut Value, dp: Dp, rank: u64) {
    let fields = match dp {
        Dp::Attention => json!({"attn_dp_size": 2, "attn_dp_rank": rank}),
        Dp::Replicas => json!({"attn_dp_size": 1, "attn_dp_rank": 0, "dp_rank": rank}),
    };
    start.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
}

fn dp_rank_1_as(version: Option<&str>, central_mode: bool, dp: Dp) {
    let Some(mut peer) = release_peer(version) else { return };
    let ports = peer.cmd(json!({"op": "free_ports", "count": 2, "n": 2}))["bases"].clone();
    let (pub_port, replay_port) = (ports[0].as_u64().unwrap(), ports[1].as_u64().unwrap());
    let base = if central_mode { "10.0.0.8:30000" } else { "10.0.0.7:30000" };
    let rank1 = if central_mode { "10.0.0.8:30001" } else { "10.0.0.7:30001" };
    let topic = format!("kv@{base}@{MODEL}");
    let replay = format!("tcp://127.0.0.1:{replay_port}");
    let (server, _config);
    if central_mode {
        // Rank r dials the configured port + r (`offset_endpoint_port` offsets connect
        // endpoints too), so our SUB listens on both ports (`zmq_bind_dp_size`).
        let sub_port = pub_port;
        let zmq = format!("tcp://127.0.0.1:{sub_port}");
        server = Server::start(&["--zmq-bind", &zmq, "--zmq-bind-dp-size", "2", "--block-size", "16"]);
        _config = None;
        for (name, rank, pod) in [("r0", 0, base), ("r1", 1, rank1)] {
            let mut start = json!({"op": "sgl_engine_start", "name": name, "pod": pod, "endpoint": zmq,
                "replay_endpoint": replay, "topic": topic});
            scheduler_rank(&mut start, dp, rank);
            let r = peer.cmd(start);
            let want = (json!(rank), json!(format!("tcp://127.0.0.1:{}", sub_port + rank)));
            assert_eq!((r["rank"].clone(), r["endpoint"].clone()), want, "{r}");
        }
        peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
        peer.cmd(json!({"op": "register", "pod": base, "model": MODEL, "replay_endpoint": replay, "engine": "sglang"}));
    } else {
        for (name, rank, pod) in [("r0", 0, base), ("r1", 1, rank1)] {
            let mut start = json!({"op": "sgl_engine_start", "name": name, "pod": pod, "endpoint": format!("tcp://*:{pub_port}"),
                "replay_endpoint": format!("tcp://*:{replay_port}"), "topic": topic});
            scheduler_rank(&mut start, dp, rank);
            let r = peer.cmd(start);
            let want = (
                json!(rank),
                json!(format!("tcp://127.0.0.1:{}", pub_port + rank)),
                json!(format!("tcp://127.0.0.1:{}", replay_port + rank)),
            );
            assert_eq!((r["rank"].clone(), r["endpoint"].clone(), r["replay_endpoint"].clone()), want, "{r}");
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            file.path(),
            format!(
                "block_size = 16\n[[pods]]\nid = \"{base}\"\nmodel = \"{MODEL}\"\nendpoint = \"tcp://127.0.0.1:{pub_port}\"\nreplay_endpoint = \"{replay}\"\nengine = \"sglang\"\ndp_size = 2\n"
            ),
        )
        .unwrap();
        server = Server::start(&["--config", file.path().to_str().unwrap()]);
        _config = Some(file);
        peer.cmd(json!({"op": "grpc", "addr": server.grpc}));
    }
    subscribed(&mut peer, &server, "r0");
    subscribed(&mut peer, &server, "r1");
    let ranks = ["r0", "r1"];

    // Different prompts on the two ranks, and one prompt on both.
    store(&mut peer, "r0", "zero", &tokens(21, 40));
    fleet_exact(&mut peer, &server, &ranks);
    store(&mut peer, "r1", "one", &tokens(22, 48));
    let r = fleet_exact(&mut peer, &server, &ranks);
    assert_eq!((r["scores"]["r1/one"].clone(), r["scores"]["r0/one"].clone()), (json!([3, 3]), json!([0, 0])), "{r}");
    store(&mut peer, "r1", "both", &tokens(23, 32));
    store(&mut peer, "r0", "both", &tokens(23, 32));
    fleet_exact(&mut peer, &server, &ranks);
    let s = server.source(rank1).unwrap();
    assert_eq!(
        (s["dp_rank"].clone(), s["base_pod"].clone(), s["engine"].clone()),
        (json!(1), json!(base), json!("sglang")),
        "{s}"
    );

    // A gap on rank 1 only: rank 1's ROUTER (replay port + 1) fills it.
    let before = filled(&server);
    peer.cmd(json!({"op": "sgl_drop_next", "name": "r1"}));
    store(&mut peer, "r1", "lost", &tokens(24, 35));
    store(&mut peer, "r1", "after", &tokens(25, 16));
    let r = fleet_exact(&mut peer, &server, &ranks);
    assert_eq!((r["scores"]["r1/lost"].clone(), r["scores"]["r0/lost"].clone()), (json!([2, 2]), json!([0, 0])), "{r}");
    assert!(filled(&server) > before, "rank 1's replay ROUTER filled the gap");

    // Rank 1 restarts: its pod is cleared, rank 0 keeps what it holds.
    peer.cmd(json!({"op": "sgl_restart", "name": "r1"}));
    subscribed(&mut peer, &server, "r1");
    store(&mut peer, "r1", "new", &tokens(26, 16));
    let r = fleet_exact(&mut peer, &server, &ranks);
    assert_eq!((r["scores"]["r0/zero"].clone(), r["scores"]["r1/new"].clone()), (json!([2, 2]), json!([1, 1])), "{r}");
    assert_eq!(peer.score_pod(MODEL, &tokens(22, 48), rank1).0, 0, "nothing of rank 1's old process is credited");
}

#[test]
fn service_sglang_0_5_20_per_pod_map_events_replay_without_topic_frame_and_restart() {
    per_pod("0.5.20");
}

#[test]
fn service_sglang_0_5_19_per_pod_array_events_replay_without_topic_frame_and_restart() {
    per_pod("0.5.19");
}

#[test]
fn service_sglang_0_5_6_per_pod_page_per_event_replay_without_topic_frame_and_restart() {
    per_pod("0.5.6");
}

#[test]
fn service_sglang_0_5_19_central_gap_and_restart() {
    central("0.5.19");
}

#[test]
fn service_sglang_0_5_6_central_gap_and_restart() {
    central("0.5.6");
}

#[test]
fn service_sglang_dp_rank_1_per_pod_pinned_release() {
    dp_rank_1(None, false);
}

#[test]
fn service_sglang_dp_rank_1_per_pod_0_5_19() {
    dp_rank_1(Some("0.5.19"), false);
}

#[test]
fn service_sglang_dp_rank_1_per_pod_0_5_6() {
    dp_rank_1(Some("0.5.6"), false);
}

#[test]
fn service_sglang_dp_rank_1_central_pinned_release() {
    dp_rank_1(None, true);
}

#[test]
fn service_sglang_dp_rank_1_central_0_5_19() {
    dp_rank_1(Some("0.5.19"), true);
}

#[test]
fn service_sglang_dp_rank_1_central_0_5_6() {
    dp_rank_1(Some("0.5.6"), true);
}

#[test]
fn service_sglang_pure_dp_replica_1_per_pod_0_5_19() {
    dp_rank_1_as(Some("0.5.19"), false, Dp::Replicas);
}

/// SGLang before 0.5.6 (ids are Python's `hash()` of a page; every radix node's first page is
/// published with no parent): a node that extends a cached prefix looks like a new chain, so
/// nothing such a release stores may credit (kvindex::sglang::builtin_ids). Its own publisher:
/// a prompt of the continuation's tokens alone must score 0 on the pod.
#[test]
fn service_sglang_0_5_5_stores_never_credit_a_continuation_as_a_chain() {
    let Some(mut peer) = release_peer(Some("0.5.5")) else { return };
    let pod = "10.0.0.7:30000";
    let a = peer.cmd(json!({"op": "sgl_engine_start", "name": "a", "pod": pod, "endpoint": "tcp://127.0.0.1:*",
        "replay_endpoint": "tcp://127.0.0.1:*"}));
    let server = serve_dialling(&mut peer, "a", pod, &a);
    let long = tokens(1, 64);
    store(&mut peer, "a", "one", &long[..40]);
    store(&mut peer, "a", "one", &long);
    store(&mut peer, "a", "two", &tokens(2, 32));
    caught_up(&mut peer, &server, &["a"]);
    for start in [16, 32, 40, 48] {
        assert_eq!(peer.score_pod(MODEL, &long[start..], pod).0, 0, "tokens {start}.. are no chain the pod holds");
    }
    let r = peer.cmd(json!({"op": "sgl_check", "names": ["a"], "model": MODEL, "block_size": SGLANG_BLOCK}));
    assert_eq!(r["violations"], json!([]), "{r}");
    assert_eq!((r["scores"]["a/one"].clone(), r["scores"]["a/two"].clone()), (json!([0, 4]), json!([0, 2])), "{r}");
    assert!(server.metric("kvindex_skipped_blocks_total", &["reason=\"parent_unknown\""]) >= 96.0);
}
