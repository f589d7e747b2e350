//! The one rule under lag: a source far behind its engine is not credited
//! (`max_source_staleness_ms`). An EXACT source whose batches reach us long after its engine
//! made them (a backlog in the publisher, where the server's own lag cannot see it) would be
//! credited with blocks the engine may have evicted meanwhile. So once its batches' `ts` show
//! it past the bound, ScoreTokens answers it as holding nothing (STALE); its state is kept, it
//! stays EXACT, and it is credited again as soon as it catches up, with no replay or clear.
//! Engines' clocks are not ours: a steady source an hour ahead or behind is credited normally.
//!
//! Independent peers: pyzmq publishers sending vLLM 0.33's frames at an engine's pace (one
//! store every 20 ms, from their own process), the server's SUB (central) or dialled sockets
//! (per pod), and a grpcio client scoring.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::*;
use serde_json::json;

const MODEL: &str = "m";
/// The bound the tests run under (the default is 10 s; a backlog grows 1 s a second here).
const BOUND_MS: u64 = 1_500;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Central,
    PerPod,
}

/// A publisher from its own peer process, storing one block every 20 ms until dropped, with
/// the `ts` the test chooses: its clock (`None`), or frozen at a time (a backlog: every batch
/// from then on was made then and reaches us only now).
struct Engine {
    pod: String,
    frozen: Arc<Mutex<Option<f64>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    fn start(py: &std::path::PathBuf, server: &Server, mode: Mode, pod: &str, skew_s: f64, chain: &[u32]) -> Engine {
        let mut peer = Peer::with_grpc(py, server);
        let mut cfg = json!({"op": "pub_start", "name": "e", "pod": pod, "topic": format!("kv@{pod}@{MODEL}"),
            "ts_offset": skew_s});
        match mode {
            Mode::Central => cfg["connect"] = json!(server.zmq()),
            Mode::PerPod => cfg["bind"] = json!("tcp://127.0.0.1:0"),
        }
        let p = peer.cmd(cfg);
        if let Mode::PerPod = mode {
            peer.cmd(json!({"op": "register", "pod": pod, "model": MODEL, "endpoint": p["endpoint"]}));
        }
        assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["e"]}))["subscribed"], true);
        peer.cmd(json!({"op": "store", "name": "e", "chain": "a", "tokens": chain}));
        let (frozen, stop) = (Arc::new(Mutex::new(None)), Arc::new(AtomicBool::new(false)));
        let (f, s) = (frozen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let ts = *f.lock().unwrap();
                peer.cmd(json!({"op": "pace", "name": "e", "n": 5, "interval_ms": 20, "frozen_ts": ts}));
            }
        });
        Engine { pod: pod.to_string(), frozen, stop, thread: Some(thread) }
    }

    /// From now on every batch was made now: the backlog grows by a second a second.
    fn freeze(&self) {
        *self.frozen.lock().unwrap() = Some(unix_now());
    }

    /// The backlog is gone: batches are made as they are sent again.
    fn catch_up(&self) {
        *self.frozen.lock().unwrap() = None;
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn server(mode: Mode) -> Server {
    let bound = BOUND_MS.to_string();
    match mode {
        Mode::Central => Server::central(&["--max-source-staleness-ms", &bound]),
        Mode::PerPod => Server::start(&["--block-size", "16", "--max-source-staleness-ms", &bound]),
    }
}

fn a_source_behind_its_engine_is_withheld_until_it_catches_up(mode: Mode) {
    let Some(py) = python() else { return };
    let server = server(mode);
    let tokens = chain(1, 4);
    let engine = Engine::start(&py, &server, mode, "pod-a", 0.0, &tokens);
    let mut client = Peer::with_grpc(&py, &server);
    let pod = engine.pod.clone();
    wait_until(&format!("{mode:?}: pod-a credited"), 20, || {
        (client.score_pod(MODEL, &tokens, &pod) == (4, "EXACT".to_string())).then_some(())
    });

    // The publisher falls behind: its batches still come every 20 ms, in order, but were made
    // when the backlog began.
    engine.freeze();
    let frozen_at = Instant::now();
    let source = wait_until(&format!("{mode:?}: pod-a withheld"), 20, || {
        let (matched, state) = client.score_pod(MODEL, &tokens, &pod);
        let s = server.source(&pod)?;
        (matched == 0 && state == "STALE" && s["stale"] == true).then_some(s)
    });
    let took = frozen_at.elapsed();
    assert!(
        took >= Duration::from_millis(BOUND_MS - 300) && took < Duration::from_millis(BOUND_MS + 5_000),
        "{mode:?}: withheld {took:?} after the backlog began, bound {BOUND_MS} ms"
    );
    // Kept, not cleared: the stream is EXACT and says how far behind it is.
    assert_eq!(source["state"], "EXACT", "{source}");
    assert!(source["staleness_ms"].as_f64().unwrap() > BOUND_MS as f64, "{source}");
    assert_eq!(server.metric("kvindex_stale_sources", &[]), 1.0);
    assert!(server.metric("kvindex_scores_withheld_total", &[]) >= 1.0);
    // An unfiltered query does not list it at all.
    let all = client.score(MODEL, &tokens, &[]);
    assert_eq!(all["scores"], json!([]), "{all}");

    // It catches up: credited again, with what it held all along.
    engine.catch_up();
    wait_until(&format!("{mode:?}: pod-a credited again"), 20, || {
        (client.score_pod(MODEL, &tokens, &pod) == (4, "EXACT".to_string())).then_some(())
    });
    let source = server.source(&pod).unwrap();
    assert_eq!(source["stale"], false, "{source}");
    assert_eq!(
        (source["clears"].as_u64(), source["gaps"].as_u64(), source["replays_started"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "no clear, gap or replay: {source}"
    );
    assert_eq!(server.metric("kvindex_stale_sources", &[]), 0.0);
}

#[test]
fn central_a_source_behind_its_engine_is_withheld_until_it_catches_up() {
    a_source_behind_its_engine_is_withheld_until_it_catches_up(Mode::Central);
}

#[test]
fn per_pod_a_source_behind_its_engine_is_withheld_until_it_catches_up() {
    a_source_behind_its_engine_is_withheld_until_it_catches_up(Mode::PerPod);
}

#[test]
fn steady_sources_with_skewed_clocks_are_credited() {
    let Some(py) = python() else { return };
    let server = server(Mode::Central);
    let tokens = chain(2, 3);
    let engines: Vec<Engine> = [("pod-ahead", 3600.0), ("pod-behind", -3600.0)]
        .into_iter()
        .map(|(pod, skew)| Engine::start(&py, &server, Mode::Central, pod, skew, &tokens))
        .collect();
    let mut client = Peer::with_grpc(&py, &server);
    for e in &engines {
        wait_until(&format!("{} credited", e.pod), 20, || {
            (client.score_pod(MODEL, &tokens, &e.pod) == (3, "EXACT".to_string())).then_some(())
        });
    }
    // Every answer over three bounds' time credits both.
    let until = Instant::now() + Duration::from_millis(3 * BOUND_MS);
    let mut answers = 0;
    while Instant::now() < until {
        for e in &engines {
            assert_eq!(client.score_pod(MODEL, &tokens, &e.pod), (3, "EXACT".to_string()), "{}", e.pod);
            let s = server.source(&e.pod).unwrap();
            assert!(s["stale"] == false && s["staleness_ms"].as_f64().unwrap() < BOUND_MS as f64, "{s}");
            answers += 1;
        }
    }
    assert!(answers >= 4, "{answers}");
    assert_eq!(server.metric("kvindex_scores_withheld_total", &[]), 0.0);
}
