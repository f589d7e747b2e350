//! Engines whose blocks are larger than the index's canonical block, end to end over real
//! sockets: independent pyzmq/msgspec publishers in vLLM's event layout (one `BlockStored` of
//! several engine blocks of `E` tokens) behind `kvindex serve --block-size B`, in the shapes a
//! fleet runs (64 over 16, 32 over 16, 128 over 32, and 16 over 16 as the control). vLLM reuses
//! only whole engine blocks and never the prompt's last token, so a prompt of `n` tokens that
//! shares `k` tokens with what a pod holds is served `⌊min(k, n − 1) / E⌋ · E` tokens from its
//! cache, and exactly that is credited, through ScoreTokens and through llm-d's GetPodScores;
//! a pod declared EAGLE is credited one engine block less.

use std::path::PathBuf;

use crate::support::*;
use kvindex_proto::indexer::v1::indexer_service_client::IndexerServiceClient;
use kvindex_proto::indexer::v1::GetPodScoresRequest;
use kvindex_tokenizer::{RegistryConfig, TokenizerRegistry};
use serde_json::{json, Value};

const MODEL: &str = "m";

/// Engine blocks each publisher stores.
const HELD: usize = 4;

/// The held chain: 4 engine blocks of the largest size (tokens no other test uses).
fn held_tokens() -> Vec<u32> {
    (0..HELD as u32 * 128).map(|j| 500_000 + j).collect()
}

/// A prompt of `n` tokens sharing its first `k` with `held` (the rest differ).
fn prompt(held: &[u32], k: usize, n: usize) -> Vec<u32> {
    (0..n).map(|i| if i < k { held[i] } else { 900_000 + i as u32 }).collect()
}

/// What vLLM serves from its cache, in tokens, of a prompt of `n` tokens sharing `k` with a pod
/// whose engine blocks are `e` tokens (one block less with EAGLE).
fn served(k: usize, n: usize, e: usize, eagle: bool) -> usize {
    let whole = k.min(n.saturating_sub(1)) / e * e;
    if eagle {
        whole.saturating_sub(e)
    } else {
        whole
    }
}

/// Starts publisher `name` for `pod` with engine blocks of `e` tokens, connected to `server`.
fn publisher(peer: &mut Peer, server: &Server, name: &str, pod: &str, e: usize) {
    let topic = format!("kv@{pod}@{MODEL}");
    peer.cmd(
        json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(), "topic": topic, "block_size": e}),
    );
}

/// Every (k, n) a test asks: k from 0 to everything held (every few tokens, and each engine
/// block boundary and the tokens around it), n = k (the prompt is the shared part), k + 1 and
/// well past the held chain.
fn cases(e: usize) -> Vec<(usize, usize)> {
    let held = HELD * e;
    let mut ks: Vec<usize> = (0..=held).step_by(4).collect();
    for b in 0..=HELD {
        ks.extend([b * e, (b * e).saturating_sub(1), b * e + 1].into_iter().filter(|&k| k <= held));
    }
    ks.sort_unstable();
    ks.dedup();
    ks.into_iter().flat_map(|k| [(k, k), (k, k + 1), (k, held + 37)]).filter(|&(_, n)| n > 0).collect()
}

/// Checks every case of `pod` (engine blocks of `e` tokens, index blocks of `b`): the matched
/// blocks ScoreTokens answers are what vLLM serves. Returns the cases that differ.
fn check_pod(peer: &mut Peer, pod: &str, e: usize, b: usize, eagle: bool) -> Vec<String> {
    let held = held_tokens();
    let cases = cases(e);
    let prompts: Vec<Vec<u32>> = cases.iter().map(|&(k, n)| prompt(&held, k, n)).collect();
    let r = peer.cmd(json!({"op": "score_pod_many", "model": MODEL, "pod": pod, "prompts": prompts}));
    let got = r["scores"].as_array().unwrap_or_else(|| panic!("{r}"));
    let mut wrong = Vec::new();
    for (&(k, n), s) in cases.iter().zip(got) {
        let (matched, state) = (s[0].as_u64().unwrap() as usize, s[1].as_str().unwrap_or_default());
        let want = served(k, n, e, eagle);
        if matched * b != want {
            wrong.push(format!(
                "{pod} (E {e} over B {b}): k {k} n {n}: credited {} tokens, vLLM serves {want} ({state})",
                matched * b
            ));
        }
    }
    wrong
}

/// Waits until each pod (engine blocks of `e` tokens, credited in units of `u`) is EXACT and
/// credited its whole held chain (of a prompt one token longer).
fn wait_held(peer: &mut Peer, server: &Server, names: &[&str], pods: &[(&str, usize, usize, bool)]) {
    peer.settle(server, names);
    let held = held_tokens();
    for &(pod, e, u, eagle) in pods {
        let want = served(HELD * e, HELD * e + 1, u, eagle) as u64;
        let q = prompt(&held, HELD * e, HELD * e + 1);
        wait_until(&format!("{pod} EXACT with its chain"), 30, || {
            let r = peer.score_exactly(MODEL, &q, &[pod]);
            let s = &r["scores"][0];
            let b = r["block_size"].as_u64().unwrap_or(1);
            (s["state"] == "EXACT" && s["matched_blocks"].as_u64().map(|m| m * b) == Some(want)).then_some(())
        });
    }
}

#[test]
fn score_tokens_credits_whole_engine_blocks_in_every_fleet_shape() {
    let Some(py) = python() else { return };
    let held = held_tokens();
    let mut wrong = Vec::new();
    // (index block, [(publisher, pod, engine block)]).
    type Publisher = (&'static str, &'static str, usize);
    let shapes: [(usize, &[Publisher]); 2] = [
        (16, &[("e64", "10.0.1.1:8000", 64), ("e32", "10.0.1.2:8000", 32), ("e16", "10.0.1.3:8000", 16)]),
        (32, &[("e128", "10.0.2.1:8000", 128), ("e32b", "10.0.2.2:8000", 32)]),
    ];
    for (b, pods) in shapes {
        let bs = b.to_string();
        let server = Server::start(&["--zmq-bind", "tcp://127.0.0.1:0", "--block-size", &bs]);
        let mut peer = Peer::with_grpc(&py, &server);
        for &(name, pod, e) in pods {
            publisher(&mut peer, &server, name, pod, e);
        }
        let names: Vec<&str> = pods.iter().map(|p| p.0).collect();
        assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": names}))["subscribed"], true);
        for &(name, _, e) in pods {
            // One BlockStored of all four engine blocks, as vLLM sends a request's blocks.
            peer.cmd(json!({"op": "store", "name": name, "chain": "held", "tokens": &held[..HELD * e]}));
        }
        let expect: Vec<(&str, usize, usize, bool)> = pods.iter().map(|&(_, pod, e)| (pod, e, e, false)).collect();
        wait_held(&mut peer, &server, &names, &expect);
        for &(_, pod, e) in pods {
            wrong.extend(check_pod(&mut peer, pod, e, b, false));
        }
        // The unit each pod is credited in is shown with its score and in /debug/sources.
        for &(_, pod, e) in pods {
            let r = peer.cmd(json!({"op": "score_units", "model": MODEL, "tokens": &held[..e + 1], "pods": [pod]}));
            assert_eq!(r["units"], json!([e]), "{pod}: {r}");
            let source = server.source(pod).unwrap();
            assert_eq!(
                (source["credit_unit_tokens"].as_u64(), source["eagle"].as_bool()),
                (Some(e as u64), Some(false)),
                "{source}"
            );
        }
    }
    assert!(wrong.is_empty(), "{} cases credited what vLLM does not serve:\n{}", wrong.len(), wrong.join("\n"));
}

#[test]
fn an_eagle_pod_is_credited_one_engine_block_less() {
    let Some(py) = python() else { return };
    let held = held_tokens();
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.toml");
    let entry = |pod: &str, rest: &str| format!("[[pods]]\nid = \"{pod}\"\nmodel = \"{MODEL}\"\n{rest}");
    std::fs::write(
        &pods_file,
        [entry("10.0.3.1:8000", "eagle = true\n"), entry("10.0.3.2:8000", "eagle = true\ncontext_parallel = 2\n")]
            .concat(),
    )
    .unwrap();
    let server = Server::central(&["--pods-file", pods_file.to_str().unwrap()]);
    let mut peer = Peer::with_grpc(&py, &server);
    // EAGLE over engine blocks of 64; EAGLE and two-way context parallelism over blocks of 16 (a
    // unit of 32 tokens); and the same engine undeclared, as vLLM without EAGLE serves it.
    let pods = [("eagle", "10.0.3.1:8000", 64), ("eagle_cp", "10.0.3.2:8000", 16), ("plain", "10.0.3.3:8000", 64)];
    for (name, pod, e) in pods {
        publisher(&mut peer, &server, name, pod, e);
    }
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["eagle", "eagle_cp", "plain"]}))["subscribed"], true);
    for (name, _, e) in pods {
        peer.cmd(json!({"op": "store", "name": name, "chain": "held", "tokens": &held[..HELD * e]}));
    }
    let expect = [("10.0.3.1:8000", 64, 64, true), ("10.0.3.2:8000", 16, 32, true), ("10.0.3.3:8000", 64, 64, false)];
    wait_held(&mut peer, &server, &["eagle", "eagle_cp", "plain"], &expect);
    let mut wrong = check_pod(&mut peer, "10.0.3.1:8000", 64, 16, true);
    wrong.extend(check_pod(&mut peer, "10.0.3.3:8000", 64, 16, false));
    // Context parallelism 2 over blocks of 16: the unit is 32 tokens.
    for (k, n) in [(64, 65), (64, 64), (63, 65), (48, 200), (32, 200), (31, 200)] {
        let r = peer.score_exactly(MODEL, &prompt(&held, k, n), &["10.0.3.2:8000"]);
        let matched = r["scores"][0]["matched_blocks"].as_u64().unwrap();
        let want = served(k, n, 32, true);
        if matched as usize * 16 != want {
            wrong.push(format!("context parallel 2 + EAGLE: k {k} n {n}: {} vs {want}", matched * 16));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let source = server.source("10.0.3.2:8000").unwrap();
    assert_eq!((source["credit_unit_tokens"].as_u64(), source["eagle"].as_bool()), (Some(32), Some(true)), "{source}");
}

/// The DeepSeek tokenizer directory laid out by `scripts/setup.sh`.
fn deepseek_dir() -> Option<PathBuf> {
    kvindex_testkit::env::deepseek_tokenizer()
}

const PROMPT: &str = "You are the on-call assistant for an inference platform team. Keep every answer short, \
    name the runbook section you used, and say so when a number cannot be checked. The platform serves \
    several models with prefix caching on a fleet of engines behind a gateway; an indexer follows every \
    engine's cache events and tells the gateway which engine already holds the longest prefix of each \
    prompt, so that a request lands where its cache is warm and its time to first token is short. Some \
    engines store their cache in blocks of sixteen tokens, others in blocks of sixty-four or one hundred \
    and twenty-eight, and a few run speculative decoding with a draft head. Question: after yesterday's \
    change to the engines' block size, the gateway's predicted cached tokens no longer match what the \
    engines report; which dashboards and which logs show where the two disagree, and how do we tell an \
    engine that reuses less than predicted from one that evicted the prefix just before the request came?";

#[test]
fn get_pod_scores_credits_whole_engine_blocks() {
    let Some(py) = python() else { return };
    let Some(dir) = deepseek_dir() else { return };
    let spec = format!("deepseek={}", dir.display());
    let mut config = RegistryConfig::default();
    config.add_model_spec(&spec).unwrap();
    // The question asked twice: long enough for two engine blocks of 128 and a partial one.
    let text = format!("{PROMPT}\n\nOnce more, in other words: {PROMPT}");
    let tokens = TokenizerRegistry::new(config).render_completion("deepseek", &text).unwrap();
    let n = tokens.len();
    assert!(n > 260, "the prompt is {n} tokens");
    let junk = |len: usize| (0..len as u32).map(|i| 800_000 + i).collect::<Vec<u32>>();
    // What each pod holds: a prefix of the prompt's tokens, then tokens the prompt does not have,
    // in whole engine blocks (the stored blocks themselves are always whole).
    let shared = |k: usize, e: usize| -> Vec<u32> {
        let whole = k.div_ceil(e) * e;
        [&tokens[..k], &junk(whole - k)[..]].concat()
    };
    // (index block, [(publisher, pod, engine block, shared tokens, EAGLE)]).
    type Pod = (&'static str, &'static str, usize, usize, bool);
    let shapes: [(usize, Vec<Pod>); 2] = [
        (
            32,
            vec![
                ("a", "10.0.4.1:8000", 128, 96, false),  // 96 of a 128-token block: engine 0
                ("b", "10.0.4.2:8000", 128, 256, false), // two whole engine blocks
                ("c", "10.0.4.3:8000", 32, 96, false),   // the control: three blocks of 32
            ],
        ),
        (
            16,
            vec![
                ("d", "10.0.5.1:8000", 64, 48, false), // 48 of a 64-token block: engine 0
                ("e", "10.0.5.2:8000", 32, 80, false), // two blocks of 32 and half of a third
                ("f", "10.0.5.3:8000", 16, 48, false), // the control: three blocks of 16
                ("g", "10.0.5.4:8000", 64, 128, true), // EAGLE: one of its two blocks
            ],
        ),
    ];
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (b, pods) in shapes {
        let dir = tempfile::tempdir().unwrap();
        let pods_file = dir.path().join("pods.toml");
        let eagle: String = pods
            .iter()
            .filter(|p| p.4)
            .map(|p| format!("[[pods]]\nid = \"{}\"\nmodel = \"deepseek\"\neagle = true\n", p.1))
            .collect();
        std::fs::write(&pods_file, eagle).unwrap();
        let bs = b.to_string();
        let server = Server::start(&[
            "--zmq-bind",
            "tcp://127.0.0.1:0",
            "--block-size",
            &bs,
            "--tokenizer-model",
            &spec,
            "--pods-file",
            pods_file.to_str().unwrap(),
        ]);
        let mut peer = Peer::with_grpc(&py, &server);
        for &(name, pod, e, _, _) in &pods {
            peer.cmd(json!({"op": "pub_start", "name": name, "pod": pod, "connect": server.zmq(), "topic": format!("kv@{pod}@deepseek"), "block_size": e}));
        }
        let names: Vec<&str> = pods.iter().map(|p| p.0).collect();
        assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": names}))["subscribed"], true);
        for &(name, _, e, k, _) in &pods {
            peer.cmd(json!({"op": "store", "name": name, "chain": "p", "tokens": shared(k, e)}));
        }
        peer.settle(&server, &names);
        // Every pod EXACT, with what it holds in the index (its chain one token longer).
        for &(_, pod, e, k, _) in &pods {
            let chain = shared(k, e);
            let q = [&chain[..], &[0]].concat();
            wait_until(&format!("{pod} EXACT"), 30, || {
                let r = peer.score_exactly("deepseek", &q, &[pod]);
                let s = &r["scores"][0];
                (s["state"] == "EXACT" && s["matched_blocks"].as_u64() > Some(0)).then_some(())
            });
        }
        let want: Vec<(String, f64)> =
            pods.iter().map(|&(_, pod, e, k, eagle)| (pod.to_string(), (served(k, n, e, eagle) / b) as f64)).collect();
        let got = rt.block_on(async {
            let mut client = IndexerServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
            let pods: Vec<String> = pods.iter().map(|p| p.1.to_string()).collect();
            let req =
                GetPodScoresRequest { prompt: text.clone(), model_name: "deepseek".into(), pod_identifiers: pods };
            let scores = client.get_pod_scores(req).await.unwrap().into_inner().scores;
            scores.into_iter().map(|s| (s.pod, s.score)).collect::<Vec<_>>()
        });
        assert_eq!(got, want, "GetPodScores over --block-size {b}: (pod, GPU-weighted blocks)");
        // ScoreTokens of the same tokens says the same.
        for (pod, score) in &want {
            let r: Value = peer.score_exactly("deepseek", &tokens, &[pod]);
            assert_eq!(r["scores"][0]["matched_blocks"].as_u64(), Some(*score as u64), "{pod}: {r}");
        }
    }
}

/// The matched blocks and state ScoreTokens answers for `pod` and the prompt `tokens`.
fn credited(peer: &mut Peer, tokens: &[u32], pod: &str) -> (u64, String) {
    let r = peer.score_exactly(MODEL, tokens, &[pod]);
    let s = &r["scores"][0];
    (s["matched_blocks"].as_u64().unwrap(), s["state"].as_str().unwrap().to_string())
}

/// `kvindex_skipped_blocks_total{reason="block_size_mismatch"}`.
fn mismatched(server: &Server) -> f64 {
    server.metric("kvindex_skipped_blocks_total", &["reason=\"block_size_mismatch\""])
}

/// A pod whose engine changes block size within one run (its events disagree: counted, credited
/// in whole blocks of both sizes), then restarts with another (learnt afresh), and an engine
/// whose block is not a multiple of the index's (refused, counted, nothing credited).
#[test]
fn an_engine_that_changes_block_size_and_one_whose_block_cannot_be_indexed() {
    let Some(py) = python() else { return };
    let held = held_tokens();
    let server = Server::central(&[]);
    let mut peer = Peer::with_grpc(&py, &server);
    let (pod, odd) = ("10.0.6.1:8000", "10.0.6.2:8000");
    publisher(&mut peer, &server, "p", pod, 64);
    publisher(&mut peer, &server, "odd", odd, 24);
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["p", "odd"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "p", "chain": "held", "tokens": &held[..HELD * 64]}));
    wait_held(&mut peer, &server, &["p"], &[(pod, 64, 64, false)]);
    assert_eq!(server.metric("kvindex_block_size_changes_total", &[]), 0.0);

    // The same engine, same group and tier, now stores blocks of 48: its events disagree. The
    // store is applied and counted, and the pod is credited in whole blocks of both sizes
    // (the lcm, 192 tokens): never past either.
    let other: Vec<u32> = (0..96).map(|j| 600_000 + j).collect();
    peer.cmd(json!({"op": "store", "name": "p", "chain": "other", "tokens": other, "block_size": 48}));
    peer.settle(&server, &["p"]);
    assert_eq!(server.metric("kvindex_block_size_changes_total", &[]), 1.0);
    let source = server.source(pod).unwrap();
    assert_eq!(source["credit_unit_tokens"].as_u64(), Some(192), "{source}");
    for (k, n, want) in [(256, 257, 192), (191, 300, 0), (192, 193, 192), (192, 192, 0)] {
        let (matched, state) = credited(&mut peer, &prompt(&held, k, n), pod);
        assert_eq!((matched * 16, state.as_str()), (want, "EXACT"), "k {k} n {n}");
    }
    assert_eq!(credited(&mut peer, &[&other[..], &[1]].concat(), pod).0, 0, "96 tokens: no whole unit of 192");

    // A new process of the engine with blocks of 32: the restart clears the pod, and the unit
    // is the new block size once it stores.
    peer.cmd(json!({"op": "restart", "name": "p", "block_size": 32}));
    assert_eq!(peer.cmd(json!({"op": "wait_sub", "names": ["p"]}))["subscribed"], true);
    peer.cmd(json!({"op": "store", "name": "p", "chain": "held", "tokens": &held[..HELD * 32]}));
    wait_until("the restarted engine credited in blocks of 32", 30, || {
        let source = server.source(pod)?;
        let (matched, state) = credited(&mut peer, &prompt(&held, 128, 129), pod);
        (source["credit_unit_tokens"].as_u64() == Some(32) && matched == 8 && state == "EXACT").then_some(())
    });
    assert_eq!(server.metric("kvindex_block_size_changes_total", &[]), 1.0, "a restart is not a disagreement");
    wrong_if_any(check_pod(&mut peer, pod, 32, 16, false));

    // Engine blocks of 24 tokens behind blocks of 16 cannot be cut into canonical blocks:
    // refused and counted, nothing credited, the unit untouched.
    peer.cmd(json!({"op": "store", "name": "odd", "chain": "held", "tokens": &held[..96]}));
    wait_until("the refused store counted", 30, || (mismatched(&server) > 0.0).then_some(()));
    peer.settle(&server, &["odd"]);
    assert_eq!(credited(&mut peer, &held[..97], odd).0, 0);
    let source = server.source(odd).unwrap();
    assert_eq!(source["credit_unit_tokens"].as_u64(), Some(16), "{source}");
}

fn wrong_if_any(wrong: Vec<String>) {
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
