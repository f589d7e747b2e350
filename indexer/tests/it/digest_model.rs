//! Property tests of the pod digest (`kvindex::index::digest`): after any interleaving of
//! stores, removals, tier moves and clears, each pod's digest is exactly the one computed from
//! a tiny reference of what the pod holds (token prefix → tiers), whatever the history that led
//! there; so two replicas that applied the same events in other batches agree, and one that
//! missed an event does not. An export imported into another index carries the same digest.

use std::collections::BTreeMap;

use kvindex::index::digest::{combine, residency};
use kvindex::keys::{block_key, namespace_of, namespace_root};
use kvindex::wire::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch};
use kvindex::{KvIndex, KvIndexConfig};
use proptest::prelude::*;

const BS: usize = 4;
const PODS: usize = 3;
const MODEL: &str = "m";

fn pod_name(pod: usize) -> String {
    format!("10.0.0.{pod}:8000")
}

fn block_tokens(content: u8) -> Vec<u32> {
    (0..BS as u32).map(|i| u32::from(content) * 1000 + i).collect()
}

fn engine_hash(prefix: &[u32]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    prefix.hash(&mut h);
    h.finish().max(1)
}

#[derive(Debug, Clone)]
enum Op {
    Store { pod: usize, parent: Option<usize>, contents: Vec<u8>, cpu: bool },
    Remove { pod: usize, which: usize, cpu: bool },
    Clear { pod: usize },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..PODS, prop::option::of(0..32usize), prop::collection::vec(0u8..4, 1..5), prop::bool::weighted(0.2))
            .prop_map(|(pod, parent, contents, cpu)| Op::Store { pod, parent, contents, cpu }),
        3 => (0..PODS, 0..40usize, prop::bool::weighted(0.2)).prop_map(|(pod, which, cpu)| Op::Remove { pod, which, cpu }),
        1 => (0..PODS).prop_map(|pod| Op::Clear { pod }),
    ]
}

/// Per pod: block prefix (tokens) → (gpu, cpu).
type Model = Vec<BTreeMap<Vec<u32>, (bool, bool)>>;

/// The event an engine would publish for `op`, with the model updated as its cache.
fn to_event(model: &mut Model, op: &Op) -> (usize, Event<'static>) {
    let medium = |cpu: bool| Some(if cpu { "CPU" } else { "GPU" });
    match op {
        Op::Store { pod, parent, contents, cpu } => {
            let known: Vec<Vec<u32>> = model[*pod].keys().cloned().collect();
            let mut prefix = match parent {
                Some(i) if !known.is_empty() => known[i % known.len()].clone(),
                _ => Vec::new(),
            };
            let parent_hash = (!prefix.is_empty()).then(|| EngineHash::Uint(engine_hash(&prefix)));
            let (mut hashes, mut tokens) = (Vec::new(), Vec::new());
            for &c in contents {
                prefix.extend(block_tokens(c));
                tokens.extend(block_tokens(c));
                hashes.push(EngineHash::Uint(engine_hash(&prefix)));
                let e = model[*pod].entry(prefix.clone()).or_default();
                if *cpu {
                    e.1 = true
                } else {
                    e.0 = true
                }
            }
            let stored = BlockStored {
                block_hashes: hashes,
                parent_block_hash: parent_hash,
                token_ids: Some(tokens),
                block_size: Some(BS as i64),
                medium: medium(*cpu),
                ..Default::default()
            };
            (*pod, Event::BlockStored(stored))
        }
        Op::Remove { pod, which, cpu } => {
            let known: Vec<Vec<u32>> = model[*pod].keys().cloned().collect();
            let hash = match known.get(*which) {
                Some(p) => {
                    let e = model[*pod].get_mut(p).expect("known");
                    if *cpu {
                        e.1 = false
                    } else {
                        e.0 = false
                    }
                    if !e.0 && !e.1 {
                        model[*pod].remove(p);
                    }
                    engine_hash(p)
                }
                None => 0x1234,
            };
            let removed =
                BlockRemoved { block_hashes: vec![EngineHash::Uint(hash)], medium: medium(*cpu), ..Default::default() };
            (*pod, Event::BlockRemoved(removed))
        }
        Op::Clear { pod } => {
            model[*pod].clear();
            (*pod, Event::AllBlocksCleared { other: vec![] })
        }
    }
}

/// A pod's digest from the reference alone: each held block's residency hash (its key and its
/// parent's), summed per tier, combined by tier name.
fn reference_digest(held: &BTreeMap<Vec<u32>, (bool, bool)>) -> u64 {
    let root = namespace_root(&namespace_of(MODEL, None, None), 0);
    let (mut sums, mut counts) = ([0u64; 2], [0u64; 2]);
    for (prefix, &(gpu, cpu)) in held {
        let n = prefix.len();
        let key = block_key(&prefix[n - BS..], &[]);
        let parent = if n == BS { root } else { block_key(&prefix[n - 2 * BS..n - BS], &[]) };
        let h = residency(parent, key);
        for (t, on) in [gpu, cpu].into_iter().enumerate() {
            if on {
                sums[t] = sums[t].wrapping_add(h);
                counts[t] += 1;
            }
        }
    }
    combine([("GPU", counts[0], sums[0]), ("CPU", counts[1], sums[1])])
}

fn index() -> KvIndex {
    KvIndex::new(KvIndexConfig { block_size: BS, shards: 4, ..Default::default() })
}

fn digest(index: &KvIndex, pod: usize) -> u64 {
    index.pod_digest(&pod_name(pod)).map_or(0, |d| d.digest)
}

fn apply(index: &KvIndex, pod: usize, events: Vec<Event<'static>>) {
    index.apply(&pod_name(pod), MODEL, &EventBatch { ts: 0.0, events, data_parallel_rank: Some(0) });
}

fn check(ops: &[Op], batch: usize) -> Result<(), TestCaseError> {
    let (one, batched) = (index(), index());
    let mut model: Model = vec![BTreeMap::new(); PODS];
    let mut pending: Vec<Vec<Event<'static>>> = vec![Vec::new(); PODS];
    for op in ops {
        let (pod, event) = to_event(&mut model, op);
        apply(&one, pod, vec![event.clone()]);
        pending[pod].push(event);
        if pending[pod].len() >= batch {
            apply(&batched, pod, std::mem::take(&mut pending[pod]));
        }
        prop_assert_eq!(digest(&one, pod), reference_digest(&model[pod]), "pod {} after {:?}", pod, op);
    }
    for (pod, events) in pending.into_iter().enumerate() {
        apply(&batched, pod, events);
    }
    for (pod, held_by_pod) in model.iter().enumerate() {
        let want = reference_digest(held_by_pod);
        prop_assert_eq!(digest(&batched, pod), want, "pod {}: the same events in batches of {}", pod, batch);
        let held = one.pod_digest(&pod_name(pod)).map_or(0, |d| d.blocks);
        prop_assert_eq!(held, held_by_pod.len() as u64);
        // Exported and imported elsewhere: the same residencies, the same digest.
        if let Some(export) = one.export_pod(&pod_name(pod)) {
            let copy = index();
            copy.import_pod(&export);
            prop_assert_eq!(digest(&copy, pod), want, "pod {} through an export", pod);
        }
    }
    Ok(())
}

#[test]
fn a_missed_event_changes_the_digest_and_replaying_it_restores_it() {
    let (a, b) = (index(), index());
    let mut model: Model = vec![BTreeMap::new(); PODS];
    let ops = [
        Op::Store { pod: 0, parent: None, contents: vec![0, 1, 2], cpu: false },
        Op::Store { pod: 0, parent: Some(0), contents: vec![3], cpu: true },
        Op::Remove { pod: 0, which: 2, cpu: false },
    ];
    let events: Vec<Event<'static>> = ops.iter().map(|op| to_event(&mut model, op).1).collect();
    apply(&a, 0, events.clone());
    apply(&b, 0, events[..2].to_vec());
    assert_ne!(digest(&a, 0), digest(&b, 0), "b missed the removal");
    assert_eq!(a.pod_digest("10.0.0.0:8000").unwrap().blocks + 1, b.pod_digest("10.0.0.0:8000").unwrap().blocks);
    apply(&b, 0, events[2..].to_vec());
    assert_eq!(digest(&a, 0), digest(&b, 0));
    assert_eq!(digest(&a, 0), reference_digest(&model[0]));
    assert!(a.pod_digest("nobody").is_none());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn digests_are_a_function_of_what_each_pod_holds(ops in prop::collection::vec(op_strategy(), 1..60), batch in 1usize..6) {
        check(&ops, batch)?;
    }
}
