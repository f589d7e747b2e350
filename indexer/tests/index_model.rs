//! Property tests: random interleavings of stores, removals, tier moves and clears from many
//! pods give exactly the scores of a tiny single-threaded reference model that works on token
//! prefixes, with no hashing and no shared code with the index. The same holds when pods are
//! applied from several threads while readers score concurrently.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvindex::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
use proptest::prelude::*;

/// Canonical block size of the index.
const BS: usize = 4;
const PODS: usize = 5;
const MODEL: &str = "m";

thread_local! {
    /// Engine blocks span this many canonical blocks (1 = the usual case; 2 exercises engines
    /// whose block size is a multiple of the canonical one).
    static RATIO: std::cell::Cell<usize> = const { std::cell::Cell::new(1) };
}

fn engine_bs() -> usize {
    BS * RATIO.with(|r| r.get())
}

/// A block's content is one of a few token patterns, so chains share prefixes across pods. An
/// engine block spanning several canonical blocks starts with one of only two, so two engine
/// blocks of one pod can agree on their first canonical block and then differ.
fn block_tokens(content: u8) -> Vec<u32> {
    let ratio = engine_bs() / BS;
    (0..engine_bs() as u32)
        .map(|i| {
            let first = (i as usize) < BS && ratio > 1;
            u32::from(if first { content % 2 } else { content }) * 1000 + i
        })
        .collect()
}

/// The canonical prefixes an engine block ending at `prefix` covers.
fn canonical_prefixes(prefix: &[u32]) -> Vec<Vec<u32>> {
    let end = prefix.len();
    (1..=engine_bs() / BS).map(|j| prefix[..end - engine_bs() + j * BS].to_vec()).collect()
}

/// vLLM-like engine hash: a function of the pod's seed and the whole token prefix.
fn engine_hash(pod: usize, prefix: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (pod % 2).hash(&mut h); // two "seeds": engines need not agree on hashes
    prefix.hash(&mut h);
    h.finish()
}

#[derive(Debug, Clone)]
enum Op {
    /// Store `contents` after the pod's `parent`-th known chain (None = from the root,
    /// Some(usize::MAX) = an unknown parent).
    Store {
        pod: usize,
        parent: Option<usize>,
        contents: Vec<u8>,
        cpu: bool,
    },
    /// Remove the `which`-th known block (or an unknown hash) from a tier.
    Remove {
        pod: usize,
        which: usize,
        cpu: bool,
    },
    /// Re-announce a known block in the CPU tier without tokens (vLLM's offload connector).
    Offload {
        pod: usize,
        which: usize,
    },
    Clear {
        pod: usize,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let pod = 0..PODS;
    prop_oneof![
        6 => (pod.clone(), prop::option::of(prop_oneof![8 => 0..64usize, 1 => Just(usize::MAX)]), prop::collection::vec(0u8..4, 1..5), prop::bool::weighted(0.2))
            .prop_map(|(pod, parent, contents, cpu)| Op::Store { pod, parent, contents, cpu }),
        3 => (pod.clone(), 0..80usize, prop::bool::weighted(0.2)).prop_map(|(pod, which, cpu)| Op::Remove { pod, which, cpu }),
        1 => (pod.clone(), 0..64usize).prop_map(|(pod, which)| Op::Offload { pod, which }),
        1 => pod.prop_map(|pod| Op::Clear { pod }),
    ]
}

/// The reference: per pod, the engine blocks it holds (by token prefix) and their tiers. A
/// canonical block is held in every tier of any engine block that covers it. Nothing else.
#[derive(Default, Clone)]
struct Model {
    pods: Vec<BTreeMap<Vec<u32>, (bool, bool)>>, // engine-block prefix → (gpu, cpu)
}

impl Model {
    fn new() -> Self {
        Model { pods: vec![BTreeMap::new(); PODS] }
    }

    /// The engine blocks a pod holds (what the engine can name by hash).
    fn known(&self, pod: usize) -> Vec<Vec<u32>> {
        self.pods[pod].keys().cloned().collect()
    }

    fn set_tier(&mut self, pod: usize, engine_prefix: &[u32], cpu: bool, on: bool) {
        let e = self.pods[pod].entry(engine_prefix.to_vec()).or_insert((false, false));
        if cpu {
            e.1 = on
        } else {
            e.0 = on
        }
        if !e.0 && !e.1 {
            self.pods[pod].remove(engine_prefix);
        }
    }

    /// A pod's canonical blocks (by token prefix) and the tiers it holds each in.
    fn canonical(&self, pod: usize) -> BTreeMap<Vec<u32>, (bool, bool)> {
        let mut out: BTreeMap<Vec<u32>, (bool, bool)> = BTreeMap::new();
        for (engine, &(g, c)) in &self.pods[pod] {
            for p in canonical_prefixes(engine) {
                let e = out.entry(p).or_default();
                *e = (e.0 || g, e.1 || c);
            }
        }
        out
    }

    /// Matched blocks and weighted score per pod for `query`.
    fn score(&self, query: &[u32]) -> BTreeMap<String, (u32, f64, u32, u32)> {
        let mut out = BTreeMap::new();
        for pod in 0..self.pods.len() {
            let held = self.canonical(pod);
            let (mut n, mut w, mut gpu, mut cpu) = (0, 0.0, 0, 0);
            while (n + 1) * BS <= query.len() {
                match held.get(&query[..(n + 1) * BS]) {
                    Some(&(g, c)) if g || c => {
                        w += if g { 1.0 } else { 0.8 };
                        gpu += u32::from(g);
                        cpu += u32::from(c);
                        n += 1;
                    }
                    _ => break,
                }
            }
            if n > 0 {
                out.insert(pod_name(pod), (n as u32, w, gpu, cpu));
            }
        }
        out
    }
}

fn pod_name(pod: usize) -> String {
    format!("10.0.0.{pod}:8000")
}

/// Turns an op into the event the engine would publish, updating the model like the engine's
/// own state. Returns None when the op means nothing for that engine.
fn to_event(model: &mut Model, op: &Op) -> Option<(usize, OwnedEvent)> {
    match op {
        Op::Store { pod, parent, contents, cpu } => {
            let known = model.known(*pod);
            let (mut prefix, parent_hash, resolvable) = match parent {
                None => (Vec::new(), None, true),
                Some(usize::MAX) => (vec![9_999_999], Some(0xdead_beef_u64), false),
                Some(_) if known.is_empty() => (Vec::new(), None, true),
                Some(i) => {
                    let p = known[i % known.len()].clone();
                    let h = engine_hash(*pod, &p);
                    (p, Some(h), true)
                }
            };
            let mut hashes = Vec::new();
            let mut tokens = Vec::new();
            for &c in contents {
                prefix.extend(block_tokens(c));
                tokens.extend(block_tokens(c));
                hashes.push(engine_hash(*pod, &prefix));
                if resolvable {
                    model.set_tier(*pod, &prefix, *cpu, true);
                }
            }
            let medium = if *cpu { "CPU" } else { "GPU" };
            Some((*pod, OwnedEvent::Stored { hashes, parent: parent_hash, tokens, medium }))
        }
        Op::Remove { pod, which, cpu } => {
            let known = model.known(*pod);
            let hash = if *which < known.len() {
                let p = known[*which].clone();
                model.set_tier(*pod, &p, *cpu, false);
                engine_hash(*pod, &p)
            } else {
                0x1234_5678 // unknown to both sides
            };
            Some((*pod, OwnedEvent::Removed { hash, medium: if *cpu { "CPU" } else { "GPU" } }))
        }
        Op::Offload { pod, which } => {
            let known = model.known(*pod);
            let p = known.get(*which % known.len().max(1))?.clone();
            model.set_tier(*pod, &p, true, true);
            Some((
                *pod,
                OwnedEvent::Stored { hashes: vec![engine_hash(*pod, &p)], parent: None, tokens: vec![], medium: "CPU" },
            ))
        }
        Op::Clear { pod } => {
            model.pods[*pod].clear();
            Some((*pod, OwnedEvent::Cleared))
        }
    }
}

#[derive(Debug, Clone)]
enum OwnedEvent {
    Stored { hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>, medium: &'static str },
    Removed { hash: u64, medium: &'static str },
    Cleared,
}

fn apply(index: &KvIndex, pod: usize, ev: &OwnedEvent) {
    let event = match ev {
        OwnedEvent::Stored { hashes, parent, tokens, medium } => Event::BlockStored(BlockStored {
            block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
            parent_block_hash: parent.map(EngineHash::Uint),
            token_ids: Some(tokens.clone()),
            block_size: Some(if tokens.is_empty() { 0 } else { engine_bs() as i64 }),
            medium: Some(medium),
            ..Default::default()
        }),
        OwnedEvent::Removed { hash, medium } => Event::BlockRemoved(BlockRemoved {
            block_hashes: vec![EngineHash::Uint(*hash)],
            medium: Some(medium),
            ..Default::default()
        }),
        OwnedEvent::Cleared => Event::AllBlocksCleared { other: vec![] },
    };
    index.apply(&pod_name(pod), MODEL, &EventBatch { ts: 0.0, events: vec![event], data_parallel_rank: Some(0) });
}

fn index_score(index: &KvIndex, query: &[u32]) -> BTreeMap<String, (u32, f64, u32, u32)> {
    let r = index.score(&ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: query, pods: None });
    assert_eq!(r.total_blocks as usize, query.len() / BS);
    let gpu = index.tiers().lookup("GPU").unwrap().0 as usize;
    let cpu = index.tiers().lookup("CPU").unwrap().0 as usize;
    r.matches
        .iter()
        .map(|m| {
            let name = index.pods().name(m.pod).unwrap().to_string();
            (name, (m.matched_blocks, m.weighted_score, m.by_tier[gpu], m.by_tier[cpu]))
        })
        .collect()
}

/// Queries worth asking: every held prefix (plus a trailing partial block), and a few misses.
fn queries(model: &Model) -> Vec<Vec<u32>> {
    let mut qs: Vec<Vec<u32>> = (0..PODS).flat_map(|p| model.canonical(p).into_keys()).collect();
    let extended: Vec<Vec<u32>> = qs.iter().map(|q| [q.as_slice(), &block_tokens(1)[..BS], &[7, 7]].concat()).collect();
    qs.extend(extended);
    qs.push(block_tokens(3)[..BS].to_vec());
    qs.push(vec![]);
    qs
}

fn assert_same(index: &KvIndex, model: &Model) -> Result<(), TestCaseError> {
    for q in queries(model) {
        let got = index_score(index, &q);
        let want = model.score(&q);
        prop_assert_eq!(got.len(), want.len(), "pods matched for {:?}", q);
        for (pod, (n, w, g, c)) in &want {
            let (gn, gw, gg, gc) = got[pod];
            prop_assert_eq!((gn, gg, gc), (*n, *g, *c), "pod {} query {:?}", pod, q);
            prop_assert!((gw - w).abs() < 1e-9, "weighted {} vs {}", gw, w);
        }
    }
    Ok(())
}

/// Applies `ops` one by one, comparing with the reference after each, then checks that clearing
/// every pod leaves nothing behind (invariant 5: clear is total).
fn check_sequential(ops: &[Op]) -> Result<(), TestCaseError> {
    let index = KvIndex::new(KvIndexConfig { block_size: BS, shards: 8, ..Default::default() });
    let mut model = Model::new();
    for op in ops {
        if let Some((pod, ev)) = to_event(&mut model, op) {
            apply(&index, pod, &ev);
        }
        assert_same(&index, &model)?;
    }
    for pod in 0..PODS {
        apply(&index, pod, &OwnedEvent::Cleared);
    }
    prop_assert_eq!(index.table().entries(), 0);
    prop_assert_eq!(index.table().keys(), 0);
    Ok(())
}

/// Runs of blocks with the same holders split and merge: a removal inside a chain two pods
/// share, the hole refilled, a pod leaving one branch of two, then everyone leaving.
#[test]
fn runs_split_and_merge_against_the_reference() {
    let store = |pod, parent, contents: &[u8]| Op::Store { pod, parent, contents: contents.to_vec(), cpu: false };
    // A pod's known prefixes sort by length along one chain, so `which` = prefix length - 1.
    let ops = vec![
        store(0, None, &[0, 1, 2, 3]),
        store(1, None, &[0, 1, 2, 3]),
        Op::Remove { pod: 0, which: 1, cpu: false }, // inside the shared run: it splits in three
        store(0, Some(0), &[1]),                     // refilled: the runs merge back
        store(1, Some(1), &[3, 3]),                  // a second branch after block 2 for pod 1
        Op::Remove { pod: 1, which: 4, cpu: false }, // pod 1 leaves the new branch's last block
        Op::Remove { pod: 1, which: 3, cpu: false },
        Op::Offload { pod: 0, which: 2 }, // a tier move splits runs by tier
        Op::Remove { pod: 0, which: 3, cpu: false },
        Op::Clear { pod: 1 },
        Op::Remove { pod: 0, which: 0, cpu: false },
    ];
    for ratio in [1, 2] {
        RATIO.with(|r| r.set(ratio));
        check_sequential(&ops).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn sequential_ops_match_the_reference(ops in prop::collection::vec(op_strategy(), 1..60)) {
        RATIO.with(|r| r.set(1));
        check_sequential(&ops)?;
    }

    #[test]
    fn engine_blocks_spanning_several_canonical_blocks(ops in prop::collection::vec(op_strategy(), 1..50)) {
        RATIO.with(|r| r.set(2));
        check_sequential(&ops)?;
    }

    #[test]
    fn replaying_a_batch_twice_changes_nothing(ops in prop::collection::vec(op_strategy(), 1..40)) {
        let index = KvIndex::new(KvIndexConfig { block_size: BS, shards: 8, ..Default::default() });
        let mut model = Model::new();
        for op in &ops {
            if let Some((pod, ev)) = to_event(&mut model, op) {
                apply(&index, pod, &ev);
                if matches!(ev, OwnedEvent::Stored { .. }) {
                    apply(&index, pod, &ev); // a replay overlap delivers the same store again
                }
            }
        }
        assert_same(&index, &model)?;
    }

    #[test]
    fn concurrent_writers_and_readers_end_exact(ops in prop::collection::vec(op_strategy(), 1..80)) {
        let mut model = Model::new();
        let events: Vec<(usize, OwnedEvent)> = ops.iter().filter_map(|op| to_event(&mut model, op)).collect();
        let index = Arc::new(KvIndex::new(KvIndexConfig { block_size: BS, shards: 4, ..Default::default() }));
        let stop = Arc::new(AtomicBool::new(false));
        let probe: Vec<Vec<u32>> = queries(&model);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (index, stop, probe) = (index.clone(), stop.clone(), probe.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) || reads == 0 {
                        for q in &probe {
                            for (_, (n, w, _, _)) in index_score(&index, q) {
                                assert!(n as usize <= q.len() / BS);
                                assert!(w <= f64::from(n) + 1e-9);
                            }
                            reads += 1;
                        }
                    }
                    reads
                })
            })
            .collect();
        // Each pod's events in order on one writer; pods split over two writers (sources commute).
        let mut per_writer: HashMap<usize, Vec<(usize, OwnedEvent)>> = HashMap::new();
        for (pod, ev) in events {
            per_writer.entry(pod % 2).or_default().push((pod, ev));
        }
        let writers: Vec<_> = per_writer
            .into_values()
            .map(|evs| {
                let index = index.clone();
                std::thread::spawn(move || evs.iter().for_each(|(pod, ev)| apply(&index, *pod, ev)))
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            prop_assert!(r.join().expect("reader") > 0);
        }
        assert_same(&index, &model)?;
    }

    #[test]
    fn concurrent_reads_of_growing_chains_never_exceed_the_final_state(
        ops in prop::collection::vec((0..PODS, prop::collection::vec(0u8..4, 1..6)), 1..40)
    ) {
        // Stores only: every state a reader can observe is a subset of the final one, so no
        // read may credit a pod with more than the final state does.
        let mut model = Model::new();
        let events: Vec<(usize, OwnedEvent)> = ops
            .iter()
            .filter_map(|(pod, contents)| {
                to_event(&mut model, &Op::Store { pod: *pod, parent: Some(0), contents: contents.clone(), cpu: false })
            })
            .collect();
        let index = Arc::new(KvIndex::new(KvIndexConfig { block_size: BS, shards: 4, ..Default::default() }));
        let probe = queries(&model);
        let finals: Vec<_> = probe.iter().map(|q| model.score(q)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (index, stop, probe, finals) = (index.clone(), stop.clone(), probe.clone(), finals.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (q, fin) in probe.iter().zip(&finals) {
                        for (pod, (n, ..)) in index_score(&index, q) {
                            let bound = fin.get(&pod).map_or(0, |f| f.0);
                            assert!(n <= bound, "pod {pod}: read {n} > final {bound}");
                        }
                    }
                }
            })
        };
        for (pod, ev) in &events {
            apply(&index, *pod, ev);
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("reader saw no false positive");
        assert_same(&index, &model)?;
    }
}

/// Two engine blocks of one pod that agree on their first canonical block share it: evicting
/// one keeps it while the other still covers it (the engine still holds those tokens' KV).
#[test]
fn a_canonical_block_two_engine_blocks_cover_stays_until_both_leave() {
    RATIO.with(|r| r.set(2));
    let index = KvIndex::new(KvIndexConfig { block_size: BS, shards: 2, ..Default::default() });
    let shared: Vec<u32> = (0..BS as u32).collect();
    let block =
        |tail: u32| -> Vec<u32> { shared.iter().copied().chain((0..BS as u32).map(|i| tail * 100 + i)).collect() };
    let (a, b) = (block(1), block(2));
    apply(&index, 0, &OwnedEvent::Stored { hashes: vec![11], parent: None, tokens: a.clone(), medium: "GPU" });
    apply(&index, 0, &OwnedEvent::Stored { hashes: vec![22], parent: None, tokens: b.clone(), medium: "GPU" });
    apply(&index, 0, &OwnedEvent::Stored { hashes: vec![22], parent: None, tokens: b.clone(), medium: "GPU" });
    let matched = |q: &[u32]| index_score(&index, q).get(&pod_name(0)).map_or(0, |m| m.0);
    assert_eq!((matched(&a), matched(&b)), (2, 2));
    apply(&index, 0, &OwnedEvent::Removed { hash: 11, medium: "GPU" });
    assert_eq!(matched(&b), 2, "B still covers the shared canonical block");
    assert_eq!(matched(&a), 1, "A's own canonical block is gone; the shared one is held");
    apply(&index, 0, &OwnedEvent::Removed { hash: 22, medium: "GPU" });
    assert_eq!((matched(&a), matched(&b)), (0, 0));
    assert_eq!((index.table().entries(), index.table().keys()), (0, 0));
}

/// A canonical block two engine blocks cover is held in the tiers of either, and loses a tier
/// only when neither holds it there: A in CPU and B in GPU share their first block; once A
/// leaves CPU and B leaves GPU, nothing of it is held (a tier A left must not stay behind
/// because B still covered the block).
#[test]
fn a_shared_canonical_block_keeps_only_the_tiers_its_engine_blocks_hold() {
    RATIO.with(|r| r.set(2));
    let store = |contents: &[u8], cpu| Op::Store { pod: 0, parent: None, contents: contents.to_vec(), cpu };
    // Known engine blocks sort by tokens: block 0 before block 2, which shares its first half.
    let in_order = vec![
        store(&[0], true),
        store(&[2], false),
        Op::Remove { pod: 0, which: 0, cpu: true },
        Op::Remove { pod: 0, which: 0, cpu: false },
    ];
    check_sequential(&in_order).unwrap();
    // A re-store in a new tier and a re-announcement add tiers to a shared block too.
    let tiers_added = vec![
        store(&[0], true),
        store(&[0], false),                          // A: CPU and GPU
        store(&[2], false),                          // B: GPU
        Op::Offload { pod: 0, which: 1 },            // B: GPU and CPU
        Op::Remove { pod: 0, which: 0, cpu: false }, // A: CPU
        Op::Remove { pod: 0, which: 1, cpu: true },  // B: GPU
        Op::Remove { pod: 0, which: 0, cpu: true },  // A gone; the shared block in GPU only
        Op::Remove { pod: 0, which: 0, cpu: false }, // B gone
    ];
    check_sequential(&tiers_added).unwrap();
}

/// An eviction out of chain order (not a chain end) and a tier re-announcement of an inner
/// block resolve through the engine table, which a pod's blocks enter on that first miss.
#[test]
fn lookups_past_the_chain_ends_index_the_pod_and_stay_exact() {
    RATIO.with(|r| r.set(1));
    let index = KvIndex::new(KvIndexConfig { block_size: BS, shards: 2, ..Default::default() });
    let tokens: Vec<u32> = (0..4 * BS as u32).collect();
    let prefix = |n: usize| tokens[..n * BS].to_vec();
    let hashes: Vec<u64> = (1..=4).map(|n| engine_hash(0, &prefix(n))).collect();
    apply(
        &index,
        0,
        &OwnedEvent::Stored { hashes: hashes.clone(), parent: None, tokens: tokens.clone(), medium: "GPU" },
    );
    let score = |q: &[u32]| index_score(&index, q).get(&pod_name(0)).copied();
    assert_eq!(score(&tokens).map(|m| m.0), Some(4));
    // Block 2 is inside the store: only the engine table can name it.
    apply(&index, 0, &OwnedEvent::Stored { hashes: vec![hashes[1]], parent: None, tokens: vec![], medium: "CPU" });
    assert_eq!(score(&tokens).map(|m| (m.0, m.3)), Some((4, 1)), "CPU tier on block 2");
    apply(&index, 0, &OwnedEvent::Removed { hash: hashes[1], medium: "GPU" });
    apply(&index, 0, &OwnedEvent::Removed { hash: hashes[1], medium: "CPU" });
    assert_eq!(score(&tokens).map(|m| m.0), Some(1), "a hole after block 1");
    // The chain's end and the rest still resolve, now through the table too.
    apply(&index, 0, &OwnedEvent::Removed { hash: hashes[3], medium: "GPU" });
    apply(&index, 0, &OwnedEvent::Removed { hash: hashes[2], medium: "GPU" });
    apply(&index, 0, &OwnedEvent::Removed { hash: hashes[0], medium: "GPU" });
    assert_eq!(score(&tokens), None);
    assert_eq!((index.table().entries(), index.table().keys()), (0, 0));
}
