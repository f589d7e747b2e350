//! An SGLang engine serving two data-parallel ranks behind one HTTP port, through
//! `kvindex serve` and `kvindex-router`: every prediction (`x-kvindex-matched-blocks`) against
//! the `cached_tokens` of the rank that served the request.
//!
//! The indexer credits each rank's blocks to that rank's pod id (`host:(port + r)`); the router
//! sends to the one URL. Where the engine's balancer picks the rank, the pod is credited what
//! every rank holds (configured with `dp_size`, or seen on its `/metrics` when it was not);
//! where the router names the rank (`dp_routing=router`, `X-Data-Parallel-Rank`), each rank is
//! its own candidate, credited its own blocks, and the engine serves there.
//!
//! Independent peers: each rank's publisher is SGLang's own `kv_events.py` from the pinned wheel
//! (0.5.23), and the rank a request lands on is decided by SGLang's own DP-controller dispatch
//! and rank-header code read from that wheel (`tests/python/sglang_dp_engine.py`).

use std::path::PathBuf;
use std::process::Command;

use crate::support::*;
use kvindex_testkit::json_peer::JsonPeer;
use serde_json::{json, Value};

const MODEL: &str = "Qwen/Qwen3-0.6B";
const RANKS: u16 = 2;

/// The engine peer, or `None` (skipped, failed under CI) without the test venv's SGLang.
fn engine_peer() -> Option<JsonPeer> {
    let python = kvindex_testkit::env::python_with(&["zmq", "msgspec", "grpc", "grpc_tools", "pydantic"])?;
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut command = Command::new(python);
    command.arg(root.join("router/tests/python/sglang_dp_engine.py")).arg(root.join("proto/kvindex/v1/indexer.proto"));
    Some(JsonPeer::start(&mut command))
}

/// The engine, `kvindex serve` dialling its ranks (per pod, `dp_size = 2`), and the pod id.
struct DpStack {
    peer: JsonPeer,
    /// `kvindex serve`, killed on drop.
    _kv: Serving,
    kv_http: String,
    kv_grpc: String,
    /// Holds the indexer's config and admin token; removed on drop.
    dir: PathBuf,
    /// The engine's HTTP address, which is also its pod id (rank 0's).
    pod: String,
}

impl Drop for DpStack {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl DpStack {
    fn start() -> Option<DpStack> {
        let mut peer = engine_peer()?;
        let ports = peer.cmd(json!({"op": "free_ports", "count": 2, "n": RANKS}))["bases"].clone();
        let (pub_port, replay_port) = (ports[0].as_u64().unwrap(), ports[1].as_u64().unwrap());
        let engine = peer.cmd(json!({"op": "dp_engine_start", "ranks": RANKS, "pub_port": pub_port,
            "replay_port": replay_port, "page_size": 16}));
        assert_eq!(engine["version"], "0.5.23", "the pinned SGLang's own publisher and dispatch");
        let pod = engine["http"].as_str().unwrap().to_string();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("kvindex-router-sglang-dp-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (token_file, config) = (dir.join("admin-token"), dir.join("kvindex.toml"));
        std::fs::write(&token_file, "sglang-dp-test-admin-token-0123456789").unwrap();
        std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        std::fs::write(
            &config,
            format!(
                "block_size = 16\nadmin_token_file = \"{}\"\n[[pods]]\nid = \"{pod}\"\nmodel = \"{MODEL}\"\n\
                 endpoint = \"tcp://127.0.0.1:{pub_port}\"\nreplay_endpoint = \"tcp://127.0.0.1:{replay_port}\"\n\
                 engine = \"sglang\"\npage_size = 16\ndp_size = {RANKS}\n",
                token_file.display()
            ),
        )
        .unwrap();
        let kv = Serve::new(&bins().kvindex).loopback().arg("--config").arg(&config).start().expect("kvindex serve");
        Some(DpStack { peer, kv_http: kv.http.clone(), kv_grpc: kv.grpc.clone(), _kv: kv, dir, pod })
    }

    /// The indexer's id of rank `r`.
    fn rank_id(&self, r: u16) -> String {
        let (host, port) = self.pod.rsplit_once(':').unwrap();
        format!("{host}:{}", port.parse::<u16>().unwrap() + r)
    }

    /// Whether the indexer's source of rank `r` has `key` (`last_seq`, `last_live_seq`) at
    /// `seq`, EXACT.
    async fn rank_at(&self, r: u16, key: &str, seq: i64) -> bool {
        let sources = get(&self.kv_http, "/debug/sources").await.json();
        let id = self.rank_id(r);
        let source = sources["sources"].as_array().and_then(|s| s.iter().find(|s| s["pod"] == id.as_str()).cloned());
        source.is_some_and(|s| s[key].as_i64() == Some(seq) && s["state"] == "EXACT")
    }

    /// Pings every rank until the indexer has seen a ping of each live (its dialers are
    /// subscribed; a ping sent before that is replayed, not seen live).
    async fn subscribed(&mut self) {
        let deadline = std::time::Instant::now() + DEADLINE;
        loop {
            let seqs = self.peer.cmd(json!({"op": "dp_engine_ping"}))["seqs"].clone();
            for _ in 0..25 {
                let mut all = true;
                for r in 0..RANKS {
                    all &= self.rank_at(r, "last_live_seq", seqs[usize::from(r)].as_i64().unwrap()).await;
                }
                if all {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(40)).await;
            }
            assert!(std::time::Instant::now() < deadline, "the indexer never saw both ranks live");
        }
    }

    /// Waits until the indexer applied every batch each rank published.
    async fn settle(&mut self) {
        let seqs = self.peer.cmd(json!({"op": "dp_engine_seqs"}))["seqs"].clone();
        let deadline = std::time::Instant::now() + DEADLINE;
        for r in 0..RANKS {
            while !self.rank_at(r, "last_seq", seqs[usize::from(r)].as_i64().unwrap()).await {
                assert!(std::time::Instant::now() < deadline, "the indexer did not apply rank {r}'s batches");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }

    fn router(&self, pod_spec: &str) -> RouterProcess {
        let token = self.dir.join("admin-token");
        let args = [
            "--indexer",
            &self.kv_grpc,
            "--indexer-admin-token-file",
            token.to_str().unwrap(),
            "--pod",
            pod_spec,
            "--model",
            MODEL,
            "--block-size",
            "16",
            "--scrape-interval-ms",
            "100",
        ];
        router(&bins(), &args.map(String::from))
    }
}

/// Prompt `turn` of conversation `k`: a 48-token shared prefix (three blocks, three pages) and
/// five tokens of its own, so the prefix is reusable (never the prompt's last token).
fn prompt(k: u32, turn: u32) -> Vec<u32> {
    let prefix = (0..48).map(|i| 1 + 10_000 * k + i);
    prefix.chain((0..5).map(|i| 500_000 + 1000 * k + 10 * turn + i)).collect()
}

/// One request through the router: (pod the router picked, matched blocks it predicted,
/// cached tokens the engine served, rank that served).
async fn complete(router: &str, tokens: &[u32]) -> (String, u64, u64, u64) {
    complete_asking_rank(router, tokens, None).await
}

/// [`complete`], the client naming rank `asked` itself (header and body), if given.
async fn complete_asking_rank(router: &str, tokens: &[u32], asked: Option<u64>) -> (String, u64, u64, u64) {
    let mut body = json!({"model": MODEL, "prompt": tokens, "max_tokens": 1});
    let asked = asked.map(|r| r.to_string());
    let headers: Vec<(&str, &str)> = asked.iter().map(|r| ("x-data-parallel-rank", r.as_str())).collect();
    if let Some(r) = &asked {
        body["routed_dp_rank"] = json!(r.parse::<u64>().unwrap());
    }
    let reply = request(router, "POST", "/v1/completions", Some(body.to_string().into()), &headers).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let matched = reply.header("x-kvindex-matched-blocks").unwrap().parse().unwrap();
    let rank = reply.header("x-sgl-dp-rank").expect("the engine names the rank that served").parse().unwrap();
    (reply.pod().to_string(), matched, reply.cached_tokens(), rank)
}

/// Conversations over a round-robin engine: each turn's prediction against what the rank the
/// engine picked served. Returns (turns, turns credited > 0, turns credited exactly).
async fn balanced_turns(stack: &mut DpStack, router: &str) -> (u32, u32, u32) {
    let (mut turns, mut credited, mut exact) = (0, 0, 0);
    for turn in 0..4 {
        for k in 0..3 {
            let (pod, matched, cached, rank) = complete(router, &prompt(k, turn)).await;
            assert_eq!(pod, stack.pod, "one pod: the engine's");
            assert!(
                matched * 16 <= cached,
                "turn {turn} of conversation {k}: the router predicted {matched} cached blocks; rank {rank} served {cached} \
                 cached tokens"
            );
            turns += 1;
            credited += u32::from(matched > 0);
            exact += u32::from(matched * 16 == cached);
            stack.settle().await;
        }
    }
    (turns, credited, exact)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_configured_as_one_is_credited_what_every_rank_holds_once_its_metrics_show_its_ranks() {
    let Some(mut stack) = DpStack::start() else { return };
    stack.subscribed().await;
    let router = stack.router(&format!("{}=http://{}", stack.pod, stack.pod));
    wait_scraped(&router.http, std::slice::from_ref(&stack.pod)).await;
    let (turns, credited, exact) = balanced_turns(&mut stack, &router.http).await;
    // Round robin: by the third turn every prefix is on both ranks, credited and served.
    assert!(credited >= 6 && exact >= 6, "{credited} of {turns} turns credited, {exact} exact");
    let entry = router_pod(&router.http, &stack.pod).await;
    assert_eq!(entry["load"]["engines"], 2, "read from the pod's /metrics: {entry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_engine_picks_the_rank_is_credited_what_every_rank_holds() {
    let Some(mut stack) = DpStack::start() else { return };
    stack.subscribed().await;
    let router = stack.router(&format!("{}=http://{},dp_size=2", stack.pod, stack.pod));
    let entry = router_pod(&router.http, &stack.pod).await;
    assert_eq!(entry["dp_ranks"], json!([stack.rank_id(0), stack.rank_id(1)]), "{entry}");
    let (turns, credited, exact) = balanced_turns(&mut stack, &router.http).await;
    assert!(credited >= 6 && exact >= 6, "{credited} of {turns} turns credited, {exact} exact");
    let served = stack.peer.cmd(json!({"op": "dp_engine_served"}))["served"].clone();
    assert!(served.as_array().unwrap().iter().all(|s| s[0].is_null()), "the router names no rank: {served}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_names_the_rank_holding_the_prefix_and_the_engine_serves_it_there() {
    let Some(mut stack) = DpStack::start() else { return };
    stack.subscribed().await;
    let router = stack.router(&format!("{}=http://{},dp_size=2,dp_routing=router", stack.pod, stack.pod));
    let ranks = [stack.rank_id(0), stack.rank_id(1)];
    wait_scraped(&router.http, &ranks).await;
    for (r, id) in ranks.iter().enumerate() {
        let entry = router_pod(&router.http, id).await;
        assert_eq!(entry["dp_rank"], json!({"pod": stack.pod, "rank": r}), "{entry}");
        assert_eq!(entry["url"], format!("http://{}", stack.pod), "{entry}");
    }

    // First turns: nothing cached; the router names a rank and the engine obeys.
    let mut home = Vec::new();
    for k in 0..6 {
        let (pod, matched, cached, rank) = complete(&router.http, &prompt(k, 0)).await;
        assert_eq!((matched, cached), (0, 0));
        assert_eq!(pod, ranks[rank as usize], "the rank that served is the one the router picked");
        home.push(rank);
        stack.settle().await;
    }
    // Follow-ups: each goes to the rank holding its prefix, predicted and served exactly; on the
    // last turn the client names the other rank itself, and the router's rank replaces it.
    for turn in 1..3 {
        for k in 0..6u32 {
            let other = (turn == 2).then(|| 1 - home[k as usize]);
            let (pod, matched, cached, rank) = complete_asking_rank(&router.http, &prompt(k, turn), other).await;
            assert_eq!(rank, home[k as usize], "conversation {k} stays on its rank");
            assert_eq!(pod, ranks[rank as usize]);
            assert_eq!((matched, cached), (3, 48), "conversation {k}, turn {turn}: predicted and served");
            stack.settle().await;
        }
    }
    let served = stack.peer.cmd(json!({"op": "dp_engine_served"}))["served"].clone();
    let named: Vec<Value> = served.as_array().unwrap().iter().map(|s| s[0].clone()).collect();
    assert!(named.iter().all(|r| r.is_u64()), "every request named its rank: {served}");
    assert!(served.as_array().unwrap().iter().all(|s| s[0] == s[1]), "and was served there: {served}");
}
