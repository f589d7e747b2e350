//! Phase 7 of the e2e bench (`E2E_BOOTSTRAP_ENTRIES`, default off): a new replica beside a
//! running one, three ways in one invocation. 64 dialled pods fill a sibling to that many
//! entries (snapshots on); the pods then keep publishing at a low pace (traffic goes on), and
//! a new replica is spawned (1) cold, (2) with `--bootstrap-from` the sibling, and (3) the
//! sibling itself is restarted from its local snapshot. For each: spawn → `/readyz`, the
//! entries it holds then, and for (1) and (2) the hit over its first `E2E_BOOTSTRAP_PROBE_SECS`
//! (default 60) of traffic: matched blocks of random stored conversations on the new replica
//! over those on the sibling, the same prompts asked of both.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kvindex_proto::kvindex::v1::indexer_client::IndexerClient;
use kvindex_proto::kvindex::v1::ScoreTokensRequest;

use super::{fill_dialled, poll_until, restart_pod_id, Server, BLOCK, CHUNKS, MODEL, PUBLISHERS, STORE_BLOCKS};

pub struct Start {
    pub ready_s: f64,
    pub entries: u64,
    /// Matched blocks on the new replica / on the sibling, over the probe window.
    pub hit: Option<f64>,
    pub probes: u64,
}

pub struct BootstrapResult {
    pub filled: u64,
    pub fill_s: f64,
    pub cold: Start,
    pub bootstrap: Start,
    pub bootstrap_bytes: f64,
    pub local: Start,
}

/// The tokens of pod `id`'s conversation `conv` (its CHUNKS stores), as the pods publish them.
fn conversation(id: usize, conv: u64) -> Vec<u32> {
    (0..CHUNKS * STORE_BLOCKS * BLOCK)
        .map(|j| ((id as u64 * 1_000_003 + conv * 7919 + j as u64) % 151_000) as u32)
        .collect()
}

/// Matched blocks of `pod` for `tokens` on the server at `grpc`.
async fn matched(client: &mut IndexerClient<tonic::transport::Channel>, pod: &str, tokens: &[u32]) -> u64 {
    let req = ScoreTokensRequest {
        model: MODEL.into(),
        token_ids: tokens.to_vec(),
        pods: vec![pod.to_string()],
        ..Default::default()
    };
    match client.score_tokens(req).await {
        Ok(r) => r.into_inner().scores.first().map_or(0, |s| u64::from(s.matched_blocks)),
        Err(_) => 0,
    }
}

/// For `secs`, random stored conversations asked of `replica` and `sibling`: the replica's
/// matched blocks over the sibling's, and how many prompts.
async fn hit(replica: &Server, sibling: &Server, convs: u64, secs: f64) -> (f64, u64) {
    let connect = |addr: &str| IndexerClient::connect(format!("http://{addr}"));
    let (mut r, mut s) = (connect(&replica.grpc).await.unwrap(), connect(&sibling.grpc).await.unwrap());
    let (mut got, mut want, mut n) = (0u64, 0u64, 0u64);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let until = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < until {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = (x % PUBLISHERS as u64) as usize;
        let conv = (x >> 8) % convs.max(1);
        let (pod, tokens) = (restart_pod_id(id), conversation(id, conv));
        got += matched(&mut r, &pod, &tokens).await;
        want += matched(&mut s, &pod, &tokens).await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (got as f64 / want.max(1) as f64, n)
}

/// Spawns `kvindex serve` with `args`: seconds to `/readyz`, entries then.
async fn start(args: &[String]) -> (Server, f64, u64) {
    let spawned = Instant::now();
    let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(poll_until(600, || server.get("/readyz").starts_with("ready")).await, "never ready");
    let ready_s = spawned.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await; // the entries gauge's tick
    let entries = server.metric("kvindex_index_entries", "") as u64;
    (server, ready_s, entries)
}

pub async fn bootstrap_phase(entries: u64, probe_secs: f64) -> BootstrapResult {
    let dir = tempfile::tempdir().unwrap();
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "e2e-bench-admin-token-0123456789").unwrap();
    let token_flags = ["--admin-token-file".to_string(), token.path().to_str().unwrap().to_string()];
    let mut flags =
        ["--snapshot-interval", "3600", "--snapshot-dir", dir.path().to_str().unwrap()].map(String::from).to_vec();
    flags.extend(token_flags.clone());
    let (sibling, ctl, args, fill_s) = fill_dialled(entries, 500_000.0, &flags).await;
    // Every pod's conversations so far; the next ones are stored at a low pace from here on
    // (about two batches per pod and second), as traffic goes on while a replica starts.
    let published = ctl.published.load(Ordering::Relaxed);
    let convs = published / PUBLISHERS as u64 / CHUNKS as u64;
    ctl.set_rate((PUBLISHERS * STORE_BLOCKS * 2) as f64);
    assert!(poll_until(120, || sibling.metric("kvindex_events_total", "") >= published as f64).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let filled = sibling.metric("kvindex_index_entries", "") as u64;
    // The new replicas: the same pods and token, no snapshot of their own.
    let mut replica: Vec<String> = args.iter().skip(2 + flags.len()).cloned().collect();
    replica.extend(token_flags);

    let (cold, cold_ready, cold_entries) = start(&replica).await;
    let (cold_hit, cold_probes) = hit(&cold, &sibling, convs, probe_secs).await;
    drop(cold);

    let mut with_sibling = replica.clone();
    with_sibling.extend(["--bootstrap-from".to_string(), sibling.grpc.clone()]);
    let (boot, boot_ready, boot_entries) = start(&with_sibling).await;
    let bootstrap_bytes = boot.metric("kvindex_bootstrap_bytes", "");
    assert_eq!(boot.metric("kvindex_bootstrap_total", "outcome=\"loaded\""), 1.0, "the bootstrap did not load");
    let (boot_hit, boot_probes) = hit(&boot, &sibling, convs, probe_secs).await;
    drop(boot);

    // The sibling itself, restarted from its own snapshot (graceful stop: the final snapshot).
    let mut sibling = sibling;
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &sibling.process.pid().to_string()])
        .status()
        .unwrap()
        .success());
    assert!(sibling.process.wait().unwrap().success());
    let (_restarted, local_ready, local_entries) = start(&args).await;
    ctl.live.store(false, Ordering::Relaxed);
    BootstrapResult {
        filled,
        fill_s,
        cold: Start { ready_s: cold_ready, entries: cold_entries, hit: Some(cold_hit), probes: cold_probes },
        bootstrap: Start { ready_s: boot_ready, entries: boot_entries, hit: Some(boot_hit), probes: boot_probes },
        bootstrap_bytes,
        local: Start { ready_s: local_ready, entries: local_entries, hit: None, probes: 0 },
    }
}
