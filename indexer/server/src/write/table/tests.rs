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
    /// Registered pods: every rank's pod id → (the pod, dialled).
    ranks: HashMap<String, (String, bool)>,
    /// Whether a source address still holds a connection to the central SUB.
    connected: bool,
    /// Pods with a replay endpoint.
    replay: Vec<String>,
}

impl Fleet for Registry {
    fn generation(&self) -> u64 {
        1
    }
    fn pod_for_topic(&self, id: &str) -> String {
        self.topics.get(id).cloned().unwrap_or_else(|| id.to_string())
    }
    fn has_replay(&self, base: &str, _: u32) -> bool {
        self.replay.iter().any(|p| p == base)
    }
    fn configured(&self, base: &str) -> bool {
        self.ranks.values().any(|(pod, _)| pod == base)
    }
    fn pod_of_registration(&self, pod: &str) -> Option<(String, bool)> {
        self.ranks.get(pod).cloned()
    }
    fn holds_blocks(&self, pod: &str) -> bool {
        !self.empty.iter().any(|p| p == pod)
    }
    fn source_connected(&self, _: &kvindex_zmtp::Source) -> bool {
        self.connected
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
        ranks: HashMap::new(),
        connected: true,
        replay: vec!["dialled".to_string(), "heard".to_string(), "busy".to_string()],
    }
}

fn table(max_streams: usize) -> StreamTable<()> {
    table_naming(max_streams, false)
}

fn table_naming(max_streams: usize, dp_naming_topic: bool) -> StreamTable<()> {
    StreamTable::new(TableConfig {
        topic_filter: "kv@".into(),
        dp_naming_topic,
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
    let msg =
        LiveMessage { origin: &LiveSocket::Central, conn: Some(ConnId(conn)), peer: None, frames, received: None };
    let decoded = t.admit(&registry(), msg, now, &mut new, &mut out);
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
    t.disconnect(&registry(), &LiveSocket::Central, ConnId(1), 3, &mut out);
    assert!(out.is_empty(), "the old connection no longer carries the stream");
    t.disconnect(&registry(), &LiveSocket::Central, ConnId(2), 3, &mut out);
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
        let msg = LiveMessage {
            origin: &LiveSocket::Central,
            conn: Some(ConnId(1)),
            peer: None,
            frames: &frames,
            received: None,
        };
        t.admit(&fleet, msg, now, &mut new, &mut out);
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

/// A publisher at 127.0.0.`last`.
fn peer(last: u8) -> Peer {
    Peer::Tcp(std::net::SocketAddr::from(([127, 0, 0, last], 40000)))
}

/// [`admit`] from `origin` at `peer` (none: no address), in `fleet`.
fn admit_from(
    t: &mut StreamTable<()>,
    fleet: &Registry,
    origin: &LiveSocket,
    peer: Option<&Peer>,
    frames: &[Bytes],
    conn: u64,
    now: u64,
) -> Vec<Effect<()>> {
    let mut out = Vec::new();
    let mut new = |_: &StreamKey, _: &Arc<str>, _: &Arc<str>, _: Mode| ((), None);
    let msg = LiveMessage { origin, conn: Some(ConnId(conn)), peer, frames, received: None };
    t.admit(fleet, msg, now, &mut new, &mut out);
    out
}

/// The pods the table's streams feed, sorted.
fn pods(t: &StreamTable<()>) -> Vec<String> {
    let mut pods: Vec<String> = t.iter().map(|(_, st)| st.pod.to_string()).collect();
    pods.sort();
    pods
}

/// The refusal among `effects`, as (pod, reason).
fn foreign(effects: &[Effect<()>]) -> Option<(String, &'static str)> {
    effects.iter().find_map(|e| match e {
        Effect::Foreign { pod, why, .. } => Some((pod.to_string(), why.reason())),
        _ => None,
    })
}

#[test]
fn a_second_stream_naming_an_owned_pod_is_refused_in_either_dp_naming() {
    let fleet = registry();
    // Port offset: rank 1 of `h:7999` is `h:8000`, which topic `h:8000` owns.
    let mut t = table(16);
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(2)), &frames("kv@h:8000@m", 0, 0), 1, 0);
    for from in [3, 2] {
        let effects =
            admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(from)), &frames("kv@h:7999@m", 0, 1), 2, 1);
        assert_eq!(foreign(&effects), Some(("h:8000".to_string(), "pod_owned")), "from 127.0.0.{from}");
        assert!(!effects.iter().any(|e| matches!(e, Effect::Steps { .. } | Effect::Created { .. })));
    }
    assert_eq!(pods(&t), ["h:8000"]);
    // Topic naming: every rank of a topic names the topic's pod.
    let mut t = table_naming(16, true);
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(2)), &frames("kv@h:8000@m", 0, 0), 1, 0);
    let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(2)), &frames("kv@h:8000@m", 0, 1), 1, 1);
    assert_eq!(foreign(&effects), Some(("h:8000".to_string(), "pod_owned")));
    assert_eq!(pods(&t), ["h:8000"]);
}

#[test]
fn a_bound_topic_binds_every_rank_to_its_address_until_that_address_is_gone() {
    let mut fleet = registry();
    let mut t = table(16);
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(2)), &frames("kv@h:8000@m", 0, 0), 1, 0);
    let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(3)), &frames("kv@h:8000@m", 0, 1), 2, 1);
    assert_eq!(foreign(&effects), Some(("h:8001".to_string(), "topic_bound")));
    assert_eq!(pods(&t), ["h:8000"], "another address does not take rank 1");
    // The owner's own rank 1 is served.
    let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(2)), &frames("kv@h:8000@m", 0, 1), 3, 2);
    assert_eq!(foreign(&effects), None);
    assert_eq!(pods(&t), ["h:8000", "h:8001"]);
    // Rank 2 from another address, once the bound one holds no connection: a moved engine.
    fleet.connected = false;
    let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(3)), &frames("kv@h:8000@m", 0, 2), 4, 3);
    assert_eq!(foreign(&effects), None);
    assert_eq!(pods(&t), ["h:8000", "h:8001", "h:8002"]);
}

#[test]
fn tables_that_share_owners_refuse_a_second_stream_of_one_pod_and_free_it_when_the_owner_goes() {
    let owners = Arc::new(PodOwners::default());
    let config = table(16).config().clone();
    let (mut a, mut b) = (StreamTable::sharing(config.clone(), owners.clone()), StreamTable::sharing(config, owners));
    let fleet = registry();
    admit_from(&mut a, &fleet, &LiveSocket::Central, None, &frames("kv@h:8000@m", 0, 1), 1, 0);
    // The same pod from another topic, on another worker (another table).
    let effects = admit_from(&mut b, &fleet, &LiveSocket::Central, None, &frames("kv@h:8001@m", 0, 0), 2, 1);
    assert_eq!(foreign(&effects), Some(("h:8001".to_string(), "pod_owned")));
    assert!(b.is_empty());
    a.remove(&StreamKey { base: Arc::from("h:8000"), rank: 1 });
    let effects = admit_from(&mut b, &fleet, &LiveSocket::Central, None, &frames("kv@h:8001@m", 1, 0), 2, 2);
    assert_eq!(foreign(&effects), None, "the owner is gone: the pod is free");
    assert_eq!(pods(&b), ["h:8001"]);
}

#[test]
fn a_contested_pod_is_given_up_once_its_owner_is_disconnected_and_may_be_reclaimed() {
    let fleet = registry();
    let mut t = table(16);
    let owner = StreamKey { base: Arc::from("h:8000"), rank: 1 };
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(2)), &frames("kv@h:8000@m", 0, 1), 1, 0);
    let claim = || frames("kv@h:8001@m", 0, 0);
    let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(3)), &claim(), 2, 10);
    assert_eq!(foreign(&effects), Some(("h:8001".to_string(), "pod_owned")));
    let stale = SequencerConfig::default().stale_after_ms;
    // Silent long enough, but still connected: it keeps the pod.
    let mut out = Vec::new();
    t.tick(&fleet, stale + 100, &mut out);
    assert!(t.get(&owner).is_some(), "a connected owner keeps its pod");
    // Its connection closed: the next tick gives the pod up.
    t.disconnect(&fleet, &LiveSocket::Central, ConnId(1), stale + 150, &mut out);
    out.clear();
    t.tick(&fleet, stale + 200, &mut out);
    assert!(matches!(&out[0], Effect::Reclaimed { why: Reclaim::Contested, key, .. } if *key == owner));
    let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(3)), &claim(), 2, stale + 300);
    assert_eq!(foreign(&effects), None);
    assert_eq!(pods(&t), ["h:8001"]);
}

#[test]
fn a_dialled_pods_streams_and_rank_ids_are_its_dialers_alone() {
    let mut fleet = registry();
    fleet.ranks = [("d:8000", ("d:8000", true)), ("d:8001", ("d:8000", true)), ("c:9000", ("c:9000", false))]
        .into_iter()
        .map(|(id, (pod, dialled))| (id.to_string(), (pod.to_string(), dialled)))
        .collect();
    let mut t = table(16);
    let dialled =
        LiveSocket::Pod { id: Arc::from("d:8000"), model: Arc::from("m"), endpoint: Arc::from("tcp://d:5557") };
    admit_from(&mut t, &fleet, &dialled, None, &frames("kv@x@m", 0, 0), 1, 0);
    // A topic naming the dialled pod itself, or its rank 1 (not yet heard from), or rank 1 of
    // another base landing on it.
    for (topic, rank, pod) in [("kv@d:8000@m", 0, "d:8000"), ("kv@d:8000@m", 1, "d:8001"), ("kv@d:7999@m", 2, "d:8001")]
    {
        let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(3)), &frames(topic, 0, rank), 2, 1);
        assert_eq!(foreign(&effects), Some((pod.to_string(), "pod_owned")), "{topic} rank {rank}");
    }
    // A configured central-mode pod is fed by configured streams only.
    let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(3)), &frames("kv@c:8999@m", 0, 1), 2, 1);
    assert_eq!(foreign(&effects), Some(("c:9000".to_string(), "pod_owned")));
    let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(2)), &frames("kv@c:9000@m", 0, 0), 3, 1);
    assert_eq!(foreign(&effects), None);
    // The dialled pod's rank 1 is its own.
    admit_from(&mut t, &fleet, &dialled, None, &frames("kv@x@m", 0, 1), 4, 2);
    assert_eq!(pods(&t), ["c:9000", "d:8000", "d:8001"]);
}

#[test]
fn a_topic_id_with_a_port_spelled_otherwise_or_a_dp_suffix_names_no_stream() {
    let mut t = table(16);
    for topic in ["kv@h:07999@m", "kv@h:+7999@m", "kv@pod-a#dp1@m"] {
        let (_, effects) = admit(&mut t, &frames(topic, 0, 1), 1, 0);
        assert!(matches!(effects[..], [Effect::Refused { reason: "name", .. }]), "{topic}");
    }
    assert!(t.is_empty());
}

#[test]
fn a_registration_made_after_another_stream_took_its_pod_takes_it_back() {
    let mut fleet = registry();
    let mut t = table(16);
    // A central topic names `d:8000` before anyone registers it.
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(3)), &frames("kv@d:8000@m", 0, 0), 1, 0);
    fleet.ranks = [("d:8000".to_string(), ("d:8000".to_string(), true))].into();
    let dialled =
        LiveSocket::Pod { id: Arc::from("d:8000"), model: Arc::from("m"), endpoint: Arc::from("tcp://d:5557") };
    let effects = admit_from(&mut t, &fleet, &dialled, None, &frames("kv@x@m", 0, 0), 2, 1);
    assert_eq!(foreign(&effects), Some(("d:8000".to_string(), "pod_owned")), "the other mode's stream owns it");
    // Connected and talking, the central stream still goes: the registration keeps the pod.
    let mut out = Vec::new();
    t.tick(&fleet, 2, &mut out);
    assert!(matches!(&out[0], Effect::Reclaimed { why: Reclaim::Contested, .. }));
    let effects = admit_from(&mut t, &fleet, &dialled, None, &frames("kv@x@m", 1, 0), 2, 3);
    assert_eq!(foreign(&effects), None);
    assert_eq!(t.get(&StreamKey { base: Arc::from("d:8000"), rank: 0 }).map(|st| st.mode), Some(Mode::PerPod));
    let effects = admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(3)), &frames("kv@d:8000@m", 1, 0), 1, 4);
    assert_eq!(foreign(&effects), Some(("d:8000".to_string(), "pod_owned")));
}

/// The catch-up replays `effects` ask, as (pod, from).
fn catch_ups(t: &StreamTable<()>, effects: &[Effect<()>]) -> Vec<(String, u64)> {
    steps(t, effects)
        .into_iter()
        .filter_map(|(pod, s)| match s {
            Step::RequestReplay { from, reason: Reason::CatchUp, .. } => Some((pod, from)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_dialled_pods_connection_catches_up_the_streams_of_its_endpoint() {
    let mut t = table(16);
    let mut new = |_: &StreamKey, _: &Arc<str>, _: &Arc<str>, _: Mode| ((), None);
    let model: Arc<str> = Arc::from("m");
    let mut out = Vec::new();
    for (pod, endpoint) in [("dialled", "tcp://e:1"), ("dialled", "tcp://e:2"), ("other", "tcp://o:1")] {
        let key = StreamKey { base: Arc::from(pod), rank: u32::from(endpoint.ends_with('2')) };
        let endpoint: Arc<str> = Arc::from(endpoint);
        let sync = PerPodSync { key: &key, model: &model, endpoint: &endpoint };
        t.initial_sync(&registry(), sync, 0, &mut new, &mut out);
    }
    // The start-up replay of rank 0 was refused (the engine was not up); the cooldown passes.
    let key = StreamKey { base: Arc::from("dialled"), rank: 0 };
    let (id, _) = t.get(&key).unwrap().seq.replay_in_flight().unwrap();
    t.replay(&key, id, ReplayEvent::Failed { timeout: false }, 1, &mut out);
    let origin = LiveSocket::Pod { id: Arc::from("dialled"), model, endpoint: Arc::from("tcp://e:1") };
    let later = SequencerConfig::default().replay_cooldown_ms + 10;
    let mut out = Vec::new();
    t.connected(&registry(), &origin, ConnId(7), Some(&peer(1)), later, &mut out);
    assert_eq!(
        catch_ups(&t, &out),
        [("dialled".to_string(), 0)],
        "rank 1 and the other pod have endpoints of their own"
    );
    assert_eq!(t.get(&key).unwrap().conn, Some(ConnId(7)), "the connection carries the stream: its close clears it");
}

#[test]
fn a_central_connection_catches_up_the_silent_streams_its_address_published() {
    let (mut t, fleet) = (table(16), registry());
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(1)), &frames("kv@heard@m", 0, 0), 1, 0);
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(1)), &frames("kv@busy@m", 0, 0), 2, 0);
    // No replay endpoint:
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(1)), &frames("kv@p@m", 0, 0), 3, 0);
    let mut out = Vec::new();
    t.disconnect(&fleet, &LiveSocket::Central, ConnId(1), 0, &mut out);
    t.disconnect(&fleet, &LiveSocket::Central, ConnId(3), 0, &mut out);
    // Another address: none of its streams.
    let mut out = Vec::new();
    t.connected(&fleet, &LiveSocket::Central, ConnId(8), Some(&peer(2)), 10, &mut out);
    assert!(out.is_empty());
    // The address again: only the stream whose connection closed and that can replay (the busy
    // one still holds its own connection).
    t.connected(&fleet, &LiveSocket::Central, ConnId(9), Some(&peer(1)), 10, &mut out);
    assert_eq!(catch_ups(&t, &out), [("heard".to_string(), 0)]);
    let conn = |t: &StreamTable<()>, pod: &str| t.get(&StreamKey { base: Arc::from(pod), rank: 0 }).unwrap().conn;
    assert_eq!((conn(&t, "heard"), conn(&t, "busy"), conn(&t, "p")), (Some(ConnId(9)), Some(ConnId(2)), None));
    // It now carries the stream: a second connection from the address leaves it alone.
    let mut out = Vec::new();
    t.connected(&fleet, &LiveSocket::Central, ConnId(10), Some(&peer(1)), 10, &mut out);
    assert!(out.is_empty());
}

#[test]
fn a_new_central_connection_seen_before_the_old_ones_close_still_catches_up() {
    let (mut t, fleet) = (table(16), registry());
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(1)), &frames("kv@heard@m", 0, 0), 1, 0);
    // The restarted engine's connection (2) and another engine's on the same host (3, which
    // then speaks) are reported before the old connection's close.
    let mut out = Vec::new();
    t.connected(&fleet, &LiveSocket::Central, ConnId(3), Some(&peer(1)), 1, &mut out);
    t.connected(&fleet, &LiveSocket::Central, ConnId(2), Some(&peer(1)), 1, &mut out);
    assert!(out.is_empty(), "the stream is still on its old connection");
    admit_from(&mut t, &fleet, &LiveSocket::Central, Some(&peer(1)), &frames("kv@p@m", 0, 0), 3, 1);
    let mut out = Vec::new();
    t.disconnect(&fleet, &LiveSocket::Central, ConnId(1), 2, &mut out);
    assert!(steps_of(&out).iter().any(|s| matches!(s, Step::Clear { reason: Reason::Disconnect })));
    assert_eq!(catch_ups(&t, &out), [("heard".to_string(), 0)], "caught up on the fresh connection");
    assert_eq!(t.get(&StreamKey { base: Arc::from("heard"), rank: 0 }).unwrap().conn, Some(ConnId(2)));
    // The fresh connection's close clears it again; nothing fresh is left to catch up on.
    let mut out = Vec::new();
    t.disconnect(&fleet, &LiveSocket::Central, ConnId(2), 3, &mut out);
    assert!(matches!(&out[0], Effect::Disconnected { conn: ConnId(2), .. }));
    assert!(catch_ups(&t, &out).is_empty());
}
