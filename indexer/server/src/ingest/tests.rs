//! The stream table on its own: naming (topic map, DP rank), connections, caps. Real frames,
//! a fleet of plain maps, a synthetic clock.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use kvindex::sequencer::{Reason, SequencerConfig, Step};

use super::*;

struct Registry {
    topics: HashMap<String, String>,
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
    fn source_connected(&self, _: &kvindex_zmtp::Source) -> bool {
        true
    }
}

fn registry() -> Registry {
    Registry { topics: [("eng-a".to_string(), "pod-a".to_string())].into() }
}

fn table(max_streams: usize) -> StreamTable<()> {
    StreamTable::new(TableConfig {
        topic_filter: "kv@".into(),
        dp_naming_topic: false,
        max_streams,
        max_streams_per_address: usize::MAX,
        sequencer: SequencerConfig { replay: false, ..Default::default() },
    })
}

#[derive(serde::Serialize)]
struct Stored {
    #[serde(rename = "type")]
    ty: &'static str,
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: Vec<u32>,
    block_size: u32,
    lora_id: Option<i64>,
    medium: &'static str,
}

/// A live message for `topic`'s stream: seq `seq`, one stored block, DP rank `rank`.
fn frames(topic: &str, seq: u64, rank: i64) -> Vec<Bytes> {
    let event = Stored {
        ty: "BlockStored",
        block_hashes: vec![seq + 1],
        parent_block_hash: None,
        token_ids: (0..16).collect(),
        block_size: 16,
        lora_id: None,
        medium: "GPU",
    };
    let payload = rmp_serde::to_vec_named(&(1.0f64, vec![event], rank)).unwrap();
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
