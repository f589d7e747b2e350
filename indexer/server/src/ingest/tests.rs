//! The stream table on its own: naming (topic map, DP rank), connections, caps. Real frames,
//! a fleet of plain maps, a synthetic clock.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use kvindex::sequencer::{Reason, SequencerConfig, Step};

use super::*;
use crate::test_events::one_block_stored;

struct Registry {
    topics: HashMap<String, String>,
    /// Pods whose entry names SGLang (the rest: vLLM, the default).
    sglang: Vec<String>,
    /// Pods that hold no block in the index (the rest hold some).
    empty: Vec<String>,
}

impl Fleet for Registry {
    fn generation(&self) -> u64 {
        1
    }
    fn pod_for_topic(&self, id: &str) -> String {
        self.topics.get(id).cloned().unwrap_or_else(|| id.to_string())
    }
    fn has_replay(&self, _: &str, _: u32) -> bool {
        false
    }
    fn configured(&self, _: &str) -> bool {
        false
    }
    fn holds_blocks(&self, pod: &str) -> bool {
        !self.empty.iter().any(|p| p == pod)
    }
    fn source_connected(&self, _: &kvindex_zmtp::Source) -> bool {
        true
    }
    fn engine(&self, base: &str) -> kvindex::wire::Engine {
        if self.sglang.iter().any(|p| p == base) {
            kvindex::wire::Engine::Sglang
        } else {
            kvindex::wire::Engine::Vllm
        }
    }
}

fn registry() -> Registry {
    Registry {
        topics: [("eng-a".to_string(), "pod-a".to_string())].into(),
        sglang: vec!["sgl".to_string()],
        empty: Vec::new(),
    }
}

fn table(max_streams: usize) -> StreamTable<()> {
    StreamTable::new(TableConfig {
        topic_filter: "kv@".into(),
        dp_naming_topic: false,
        max_streams,
        max_streams_per_address: usize::MAX,
        block_size: 16,
        sequencer: SequencerConfig { replay: false, ..Default::default() },
    })
}

/// A live message for `topic`'s stream: seq `seq`, one stored block, DP rank `rank`.
fn frames(topic: &str, seq: u64, rank: i64) -> Vec<Bytes> {
    let payload = one_block_stored(seq + 1, None, (0..16).collect(), rank);
    vec![Bytes::from(topic.to_string()), Bytes::copy_from_slice(&seq.to_be_bytes()), Bytes::from(payload)]
}

fn admit(t: &mut StreamTable<()>, frames: &[Bytes], conn: u64, now: u64) -> (bool, Vec<Effect<()>>) {
    let mut out = Vec::new();
    let mut new = |_: &StreamKey, _: &Arc<str>, _: &Arc<str>, _: Mode| ((), None);
    let decoded =
        t.admit(&registry(), &Origin::Central, Some(ConnId(conn)), None, frames, None, now, &mut new, &mut out);
    (decoded.is_some(), out)
}

/// The steps of `effects`, as (stream pod, step) with the pod from the table.
fn steps(t: &StreamTable<()>, effects: &[Effect<()>]) -> Vec<(String, Step<Batch>)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Steps { key, steps } => Some((t.get(key).unwrap().pod.to_string(), steps.clone())),
            _ => None,
        })
        .flat_map(|(pod, steps)| steps.into_iter().map(move |s| (pod.clone(), s)))
        .collect()
}

#[test]
fn the_topic_map_and_the_dp_rank_name_the_stream_and_the_payload_is_decoded_once() {
    let mut t = table(16);
    let (decoded, effects) = admit(&mut t, &frames("kv@eng-a@m", 0, 1), 1, 0);
    assert!(decoded, "the table hands the decoded batch back");
    let key = StreamKey { base: Arc::from("pod-a"), rank: 1 };
    assert!(matches!(&effects[0], Effect::Created { key: k } if *k == key));
    let st = t.get(&key).expect("named by the topic map, ranked by the payload");
    assert_eq!((&*st.pod, &*st.model, st.mode), ("pod-a#dp1", "m", Mode::Central));
    let applied: Vec<u64> = steps(&t, &effects)
        .into_iter()
        .filter_map(|(_, s)| match s {
            Step::Apply { seq, .. } => Some(seq),
            _ => None,
        })
        .collect();
    assert_eq!(applied, [0]);
    // Not ours: dropped before any stream, with the reason.
    let (_, effects) = admit(&mut t, &frames("other@x@m", 0, 0), 1, 0);
    assert!(matches!(effects[..], [Effect::Undecodable { reason: "topic_filtered", .. }]));
    assert_eq!(t.len(), 1);
}

#[test]
fn a_new_connection_resyncs_its_stream_and_only_the_carrying_connection_clears_it() {
    let mut t = table(16);
    admit(&mut t, &frames("kv@p@m", 0, 0), 1, 0);
    admit(&mut t, &frames("kv@p@m", 1, 0), 1, 1);
    let (_, effects) = admit(&mut t, &frames("kv@p@m", 2, 0), 2, 2);
    assert!(matches!(&effects[0], Effect::Reconnected { .. }), "a new connection is a reconnect");
    let steps = steps(&t, &effects);
    assert!(steps.iter().any(|(_, s)| matches!(s, Step::Clear { reason: Reason::Reconnect })), "{steps:?}");
    let mut out = Vec::new();
    t.disconnect(&Origin::Central, ConnId(1), &mut out);
    assert!(out.is_empty(), "the old connection no longer carries the stream");
    t.disconnect(&Origin::Central, ConnId(2), &mut out);
    assert!(matches!(&out[0], Effect::Disconnected { conn: ConnId(2), .. }));
    let steps = steps_of(&out);
    assert!(steps.iter().any(|s| matches!(s, Step::Clear { .. })), "{steps:?}");
}

fn steps_of(effects: &[Effect<()>]) -> Vec<Step<Batch>> {
    effects
        .iter()
        .flat_map(|e| match e {
            Effect::Steps { steps, .. } => steps.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn a_full_table_refuses_a_new_stream_until_one_may_be_reclaimed() {
    let mut t = table(1);
    admit(&mut t, &frames("kv@x@m", 0, 0), 1, 0);
    let (_, effects) = admit(&mut t, &frames("kv@y@m", 0, 0), 2, 10);
    assert!(matches!(effects[..], [Effect::Refused { reason: "max_sources", .. }]));
    // x said nothing for longer than `stale_after_ms`: it makes room.
    let later = SequencerConfig::default().stale_after_ms + 10;
    let (_, effects) = admit(&mut t, &frames("kv@y@m", 0, 0), 2, later);
    assert!(matches!(&effects[0], Effect::Reclaimed { why: Reclaim::Silent, stream, .. } if &*stream.pod == "x"));
    assert!(t.get(&StreamKey { base: Arc::from("y"), rank: 0 }).is_some());
    assert_eq!(t.len(), 1);
}

#[test]
fn a_full_table_reclaims_a_talking_stream_whose_pod_holds_nothing_never_one_that_holds_blocks() {
    let mut t = table(2);
    let fleet = Registry { empty: vec!["talker".into()], ..registry() };
    let admit = |t: &mut StreamTable<()>, topic: &str, seq: u64, now: u64| {
        let mut out = Vec::new();
        let mut new = |_: &StreamKey, _: &Arc<str>, _: &Arc<str>, _: Mode| ((), None);
        let frames = frames(topic, seq, 0);
        t.admit(&fleet, &Origin::Central, Some(ConnId(1)), None, &frames, None, now, &mut new, &mut out);
        out
    };
    // Both EXACT and talking every 100 ms; "engine" holds blocks, "talker" none.
    for seq in 0..20 {
        admit(&mut t, "kv@engine@m", seq, seq * 100);
        admit(&mut t, "kv@talker@m", seq, seq * 100);
    }
    assert!(t.iter().all(|(_, st)| st.confirmed));
    let effects = admit(&mut t, "kv@newcomer@m", 0, 2_000);
    assert!(
        matches!(&effects[0], Effect::Reclaimed { why: Reclaim::Empty, stream, .. } if &*stream.pod == "talker"),
        "the stream that holds nothing makes room"
    );
    assert!(t.get(&StreamKey { base: Arc::from("newcomer"), rank: 0 }).is_some());
    // The newcomer is under a second old and holds blocks; the engine holds blocks: nothing
    // more may go while they talk.
    let effects = admit(&mut t, "kv@another@m", 0, 2_100);
    assert!(matches!(effects[..], [Effect::Refused { reason: "max_sources", .. }]), "{}", effects.len());
    assert!(t.get(&StreamKey { base: Arc::from("engine"), rank: 0 }).is_some());
}

/// `frames` with a 24-byte seq frame: the seq, then the publisher's 16-byte epoch.
fn with_epoch(mut frames: Vec<Bytes>, epoch: u8) -> Vec<Bytes> {
    let mut seq = frames[1].to_vec();
    seq.extend_from_slice(&[epoch; 16]);
    frames[1] = Bytes::from(seq);
    frames
}

#[test]
fn a_new_publisher_epoch_clears_the_stream_whatever_its_seq() {
    let mut t = table(16);
    admit(&mut t, &with_epoch(frames("kv@p@m", 0, 0), 1), 1, 0);
    let (_, effects) = admit(&mut t, &with_epoch(frames("kv@p@m", 1, 0), 1), 1, 1);
    assert!(!steps_of(&effects).iter().any(|s| matches!(s, Step::Clear { .. })), "the same epoch goes on");
    // Seq 2 follows seq 1, but from a new process: only the epoch tells.
    let (decoded, effects) = admit(&mut t, &with_epoch(frames("kv@p@m", 2, 0), 2), 1, 2);
    assert!(decoded);
    let steps = steps_of(&effects);
    assert!(steps.iter().any(|s| matches!(s, Step::Clear { reason: Reason::Epoch })), "{steps:?}");
    let clear = steps.iter().position(|s| matches!(s, Step::Clear { .. }));
    let apply = steps.iter().position(|s| matches!(s, Step::Apply { .. }));
    assert!(apply.is_none() || apply > clear, "nothing of the new process applies before the clear: {steps:?}");
}

/// An SGLang 0.5.6 array-form store of `pages` pages of 1 token: 6 slots, a negative id.
fn sglang_frames(topic: &str, seq: u64, pages: usize) -> Vec<Bytes> {
    #[derive(serde::Serialize)]
    struct ArrayStored(&'static str, Vec<i64>, Option<i64>, Vec<u32>, u32, Option<i64>);
    let event = ArrayStored(
        "BlockStored",
        (0..pages as i64).map(|i| -1 - i).collect(),
        None,
        (0..pages as u32).collect(),
        1,
        None,
    );
    let payload = rmp_serde::to_vec(&(1.0f64, vec![event], 0i64)).unwrap();
    vec![Bytes::from(topic.to_string()), Bytes::copy_from_slice(&seq.to_be_bytes()), Bytes::from(payload)]
}

#[test]
fn each_stream_is_decoded_and_keyed_by_its_sources_engine() {
    let mut t = table(16);
    let (decoded, _) = admit(&mut t, &sglang_frames("kv@sgl@m", 0, 32), 1, 0);
    assert!(decoded, "SGLang's array form decodes by SGLang's rules");
    let st = t.get(&StreamKey { base: Arc::from("sgl"), rank: 0 }).expect("the SGLang stream");
    assert_eq!(st.rules.engine(), kvindex::wire::Engine::Sglang);
    // vLLM's rules take the same 6-slot array as vLLM's own fields: not a store of 1-token
    // pages, so nothing of it would credit; SGLang's rules make 2 canonical blocks of it.
    let payload = sglang_frames("kv@sgl@m", 0, 32).pop().unwrap();
    let st = t.get_mut(&StreamKey { base: Arc::from("sgl"), rank: 0 }).unwrap();
    let decoded = super::decode(st.rules.engine(), &payload).unwrap();
    let (prepared, report) = st.rules.prepare(&decoded);
    let prepared = prepared.expect("SGLang's rules rewrite the batch");
    let kvindex::wire::Event::BlockStored(store) = &prepared.events[0] else { panic!("{prepared:?}") };
    assert_eq!((store.block_hashes.len(), store.block_size), (2, Some(16)), "{report:?}");
    // A vLLM stream's batch goes to the index as it came.
    admit(&mut t, &frames("kv@p@m", 0, 0), 1, 0);
    let st = t.get_mut(&StreamKey { base: Arc::from("p"), rank: 0 }).unwrap();
    assert_eq!(st.rules.engine(), kvindex::wire::Engine::Vllm);
    let payload = frames("kv@p@m", 0, 0).pop().unwrap();
    assert!(st.rules.prepare(&super::decode(st.rules.engine(), &payload).unwrap()).0.is_none());
}
