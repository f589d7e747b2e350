//! `kvindex replay`: a dump rebuilt into an index offline, by the live worker's own stream table.
//!
//! Each live message goes through the same [`StreamTable`] as in the service (admission,
//! topic → pod naming with `--topic-map`, DP naming, connection tracking, the stream's
//! sequencer, one decode), and its effects are carried out on an index of our own
//! ([`KvIndex::apply`] / clear). A recorded `disconnect` clears the streams its connection
//! carried, and a message on a new connection resyncs its stream, as live. A replay the
//! sequencer asks for is answered from the replay replies recorded for that stream (what the
//! engine's buffer answered then), so a recording with gaps and replays rebuilds to what the
//! live indexer held. The clock is the records' receive time.
//!
//! [`Offline::trace`] scores given prompts after every live record (`--trace-out`), so a
//! recording can be compared with what the live indexer answered batch by batch.
//!
//! [`Offline::explain`] follows one prompt for one pod: after every batch of that pod, which of
//! the prompt's blocks it holds; each change is attributed to the batch (seq, time) that made it.
//!
//! A dump is untrusted input, so what a replay holds besides the index is bounded: each
//! recorded reply answers at most one replay (as it did live; a dump whose seq keeps going
//! back asks for a replay from 0 on every line, and re-applying every reply each time was
//! quadratic), the replies held wait within [`Limits::max_reply_bytes`], pod and model names
//! within the service's bound, and `--explain`'s history within [`Limits::max_history`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use kvindex::sequencer::{SequencerConfig, Step};
use kvindex::wire::{self, parse_topic, Engine, EventBatch, ReplayReply};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery, ScoreResult};
use serde::Serialize;

use super::DumpRecord;
use crate::config::pod as names;
use crate::protocols::{ConnId, LiveSocket, StreamKey};
use crate::write::table::{Batch, Effect, Ext, Fleet, LiveMessage, Mode, ReplayEvent, StreamTable, TableConfig};

/// How the live service named its streams (its `topic_filter`, `dp_naming` and `topic_map`
/// settings): a replay names them the same way.
#[derive(Debug, Clone)]
pub struct NamingSettings {
    pub topic_filter: String,
    /// `dp_naming = "topic"`.
    pub dp_naming_topic: bool,
    /// Topic id → pod.
    pub topic_map: HashMap<String, String>,
    /// Pod → its engine and page size, as its pod entry named them (a dump records frames, not
    /// the fleet's configuration, so `kvindex replay --engine` says it again).
    pub engines: HashMap<String, (Engine, Option<usize>)>,
    /// The engine of every other pod (the service's `default_engine`).
    pub default_engine: Engine,
}

impl Default for NamingSettings {
    fn default() -> Self {
        NamingSettings {
            topic_filter: "kv@".into(),
            dp_naming_topic: false,
            topic_map: HashMap::new(),
            engines: HashMap::new(),
            default_engine: Engine::Vllm,
        }
    }
}

/// What a replay holds besides the index.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of recorded replay replies held until a replay asks for them (each reply's payload
    /// plus [`REPLY_OVERHEAD`]); replies past it are dropped and counted (a replay that needed
    /// them fails: the pod is degraded, never guessed).
    pub max_reply_bytes: u64,
    /// Changes `--explain` keeps in its history (the most recent); each block's last change is
    /// kept regardless.
    pub max_history: usize,
}

/// What one held reply costs besides its payload (map entry, queue), so that many tiny replies
/// are bounded too.
pub const REPLY_OVERHEAD: u64 = 64;

impl Limits {
    pub const DEFAULT_MAX_REPLY_BYTES: u64 = 512 << 20;
    pub const DEFAULT_MAX_HISTORY: usize = 10_000;
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_reply_bytes: Self::DEFAULT_MAX_REPLY_BYTES, max_history: Self::DEFAULT_MAX_HISTORY }
    }
}

/// Where to stop: after a Unix time, or after a seq.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Until {
    Time(f64),
    Seq(u64),
}

impl std::str::FromStr for Until {
    type Err = String;
    /// A number below 10⁹ without a fraction is a seq; anything else is Unix time.
    fn from_str(s: &str) -> Result<Until, String> {
        if let Ok(seq) = s.parse::<u64>() {
            if seq < 1_000_000_000 {
                return Ok(Until::Seq(seq));
            }
        }
        s.parse::<f64>().map(Until::Time).map_err(|_| format!("--until takes a Unix time or a seq, got {s:?}"))
    }
}

/// Per-stream figures for the report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStats {
    pub pod: String,
    pub model: String,
    pub state: &'static str,
    pub last_seq: Option<u64>,
    pub blocks: u64,
    pub messages: u64,
    pub applied: u64,
    pub gaps: u64,
    pub duplicates: u64,
    pub restarts: u64,
    pub malformed: u64,
    pub clears: u64,
    pub replays_filled: u64,
    pub replays_failed: u64,
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    /// `AllBlocksCleared` events the engine published (a prefix-cache reset), as opposed to
    /// `clears`, which the stream's sequencer decided (restart, unfillable gap).
    pub engine_clears: u64,
}

/// Whole-dump figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub records: u64,
    pub live: u64,
    pub replay: u64,
    pub undecodable: u64,
    /// Records whose pod or model name is over the service's bound or holds control
    /// characters: skipped.
    pub refused_names: u64,
    /// Recorded replay replies not held: over `max_reply_bytes`.
    pub replies_dropped: u64,
    pub first_t: Option<f64>,
    pub last_t: Option<f64>,
}

/// One change of what a pod holds of the explained prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExplainEvent {
    pub seq: u64,
    pub t: f64,
    /// The prompt's block index.
    pub block: usize,
    /// `stored` or `removed` (a clear is a removal of each block held).
    pub change: &'static str,
    /// What caused it: `batch` or the sequencer's clear reason.
    pub cause: String,
}

/// What the offline driver keeps per stream beside the table's part.
#[derive(Default)]
struct Counts {
    stats: StreamStats,
}

impl Ext for Counts {}

/// The registry as a dump knows it: the topic map given, a replay socket for every stream
/// whose replay replies were recorded (one the service had none for never asked), nothing
/// configured, no central source to bind to; and the blocks its pods hold in the replayed index.
struct DumpFleet<'a> {
    index: &'a KvIndex,
    topic_map: &'a HashMap<String, String>,
    replayable: &'a HashSet<StreamKey>,
    engines: &'a HashMap<String, (Engine, Option<usize>)>,
    default_engine: Engine,
}

impl Fleet for DumpFleet<'_> {
    fn generation(&self) -> u64 {
        0
    }

    fn pod_for_topic(&self, id: &str) -> String {
        self.topic_map.get(id).cloned().unwrap_or_else(|| id.to_string())
    }

    fn has_replay(&self, base: &str, rank: u32) -> bool {
        self.replayable.contains(&StreamKey { base: Arc::from(base), rank })
    }

    fn configured(&self, _base: &str) -> bool {
        false
    }

    fn holds_blocks(&self, pod: &str) -> bool {
        self.index.pod_stats(pod).is_some_and(|s| s.blocks > 0)
    }

    fn source_connected(&self, _source: &kvindex_zmtp::Source) -> bool {
        true
    }

    fn engine(&self, base: &str) -> Engine {
        self.engines.get(base).map_or(self.default_engine, |&(engine, _)| engine)
    }

    fn page_size(&self, base: &str) -> Option<usize> {
        self.engines.get(base).and_then(|&(_, page_size)| page_size)
    }
}

struct Explain {
    pod: String,
    model: String,
    tokens: Vec<u32>,
    held: Vec<bool>,
    /// Each block's last change.
    last: Vec<Option<ExplainEvent>>,
    /// The most recent changes, at most `max_history`.
    events: VecDeque<ExplainEvent>,
    dropped: u64,
}

/// One line of `--trace-out`: what the prompts scored after a live record was carried out.
#[derive(Debug, Clone, Serialize)]
pub struct TraceRow {
    /// The dump line's record number (live and replay records counted, from 1).
    pub record: u64,
    /// The stream the record was for (its DP-resolved pod), and its live seq.
    pub pod: Option<String>,
    pub seq: Option<u64>,
    /// Per prompt, every pod that matched: (pod, matched blocks), by pod.
    pub scores: Vec<Vec<(String, u32)>>,
}

/// The prompts traced after every live record, and where the rows go.
struct Trace {
    probes: Vec<(String, Vec<u32>)>,
    out: Box<dyn Write>,
}

pub struct Offline {
    index: KvIndex,
    table: StreamTable<Counts>,
    topic_map: HashMap<String, String>,
    engines: HashMap<String, (Engine, Option<usize>)>,
    default_engine: Engine,
    /// Recorded replay replies by stream: seq → payloads in dump order, each taken by the first
    /// replay that asks for its seq (a restarted engine's replies of the same seqs wait behind
    /// the earlier process's).
    replies: HashMap<StreamKey, BTreeMap<u64, VecDeque<Vec<u8>>>>,
    /// Streams with a recorded reply: the service had a replay socket for them.
    replayable: HashSet<StreamKey>,
    reply_bytes: u64,
    limits: Limits,
    totals: Totals,
    start_t: Option<f64>,
    explain: Option<Explain>,
    trace: Option<Trace>,
    /// Replays the sequencers asked for, answered from `replies` in order.
    asked: VecDeque<(StreamKey, u64, u64)>,
}

impl Offline {
    pub fn new(config: KvIndexConfig) -> Offline {
        Offline::with_limits(config, Limits::default())
    }

    pub fn with_limits(config: KvIndexConfig, limits: Limits) -> Offline {
        Offline::with_naming(config, limits, NamingSettings::default())
    }

    pub fn with_naming(config: KvIndexConfig, limits: Limits, naming: NamingSettings) -> Offline {
        let table = StreamTable::new(TableConfig {
            topic_filter: naming.topic_filter,
            dp_naming_topic: naming.dp_naming_topic,
            // A dump holds what the service admitted (and what it refused, which the service's
            // own caps bounded): no cap of our own.
            max_streams: usize::MAX,
            max_streams_per_address: usize::MAX,
            block_size: config.block_size,
            sequencer: SequencerConfig::default(),
        });
        Offline {
            index: KvIndex::new(config),
            table,
            topic_map: naming.topic_map,
            engines: naming.engines,
            default_engine: naming.default_engine,
            replies: HashMap::new(),
            replayable: HashSet::new(),
            reply_bytes: 0,
            limits,
            totals: Totals::default(),
            start_t: None,
            explain: None,
            trace: None,
            asked: VecDeque::new(),
        }
    }

    pub fn index(&self) -> &KvIndex {
        &self.index
    }

    pub fn into_index(self) -> KvIndex {
        self.index
    }

    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    /// Follow `tokens` in `model` for `pod` (call before feeding records).
    pub fn explain(&mut self, pod: &str, model: &str, tokens: &[u32]) {
        let blocks = tokens.len() / self.index.block_size();
        let (pod, model, tokens) = (pod.to_string(), model.to_string(), tokens.to_vec());
        let (held, last) = (vec![false; blocks], vec![None; blocks]);
        self.explain = Some(Explain { pod, model, tokens, held, last, events: Default::default(), dropped: 0 });
    }

    /// Score `probes` ((model, tokens)) after every live record and write a [`TraceRow`] line
    /// of JSON to `out` for each (call before feeding records).
    pub fn trace(&mut self, probes: Vec<(String, Vec<u32>)>, out: Box<dyn Write>) {
        self.trace = Some(Trace { probes, out });
    }

    /// Flushes the trace's rows.
    pub fn finish_trace(&mut self) -> std::io::Result<()> {
        self.trace.as_mut().map_or(Ok(()), |t| t.out.flush())
    }

    /// The explained prompt's most recent changes (at most `max_history`), oldest first.
    pub fn explained(&self) -> Vec<&ExplainEvent> {
        self.explain.as_ref().map_or(Vec::new(), |e| e.events.iter().collect())
    }

    /// Each block of the explained prompt: its last change, if any.
    pub fn explained_blocks(&self) -> &[Option<ExplainEvent>] {
        self.explain.as_ref().map_or(&[], |e| &e.last)
    }

    /// Changes of the explained prompt left out of [`Offline::explained`] (older ones).
    pub fn explained_dropped(&self) -> u64 {
        self.explain.as_ref().map_or(0, |e| e.dropped)
    }

    /// Notes a recorded replay reply (call for every replay record before the live ones).
    pub fn add_reply(&mut self, record: &DumpRecord, frames: &[Vec<u8>]) {
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let Ok(ReplayReply::Message(msg)) = wire::parse_replay(&refs) else { return };
        // The recorder names the stream's rank-0 pod; a reply captured elsewhere names its topic.
        let pod = record.pod.clone().or_else(|| {
            let topic = std::str::from_utf8(msg.topic?).ok()?;
            Some(
                self.topic_map.get(parse_topic(topic).id).cloned().unwrap_or_else(|| parse_topic(topic).id.to_string()),
            )
        });
        let Some(pod) = pod else { return };
        if names::name(&pod).is_err() {
            self.totals.refused_names += 1;
            return;
        }
        let size = msg.payload.len() as u64 + REPLY_OVERHEAD;
        if self.reply_bytes.saturating_add(size) > self.limits.max_reply_bytes {
            self.totals.replies_dropped += 1;
            return;
        }
        let engine = self.engines.get(&pod).map_or(self.default_engine, |&(engine, _)| engine);
        let rank = crate::write::table::decode(engine, msg.payload).ok().and_then(|b| b.data_parallel_rank);
        let rank = rank.unwrap_or(0).clamp(0, i64::from(u16::MAX)) as u32;
        let key = StreamKey { base: Arc::from(pod.as_str()), rank };
        self.replayable.insert(key.clone());
        self.replies.entry(key).or_default().entry(msg.seq).or_default().push_back(msg.payload.to_vec());
        self.reply_bytes += size;
    }

    /// Whether `record` lies beyond `until` (replay stops there).
    pub fn beyond(record: &DumpRecord, frames: &[Vec<u8>], until: Until) -> bool {
        match until {
            Until::Time(t) => record.t > t,
            Until::Seq(s) => {
                !record.is_replay()
                    && frames
                        .get(1)
                        .and_then(|f| <[u8; 8]>::try_from(f.as_slice()).ok())
                        .is_some_and(|b| u64::from_be_bytes(b) > s)
            }
        }
    }

    /// Carries one record out as the live worker did.
    pub fn feed(&mut self, record: &DumpRecord, frames: &[Vec<u8>]) {
        self.totals.records += 1;
        self.totals.first_t.get_or_insert(record.t);
        self.totals.last_t = Some(record.t);
        if record.is_replay() {
            self.totals.replay += 1;
            return; // answered from `replies` when the sequencer asks
        }
        let origin = match (&record.pod, &record.model) {
            (Some(pod), Some(model)) => {
                if names::name(pod).is_err() || names::name(model).is_err() {
                    self.totals.refused_names += 1;
                    return;
                }
                let endpoint = record.source.as_deref().unwrap_or_default();
                LiveSocket::Pod {
                    id: Arc::from(pod.as_str()),
                    model: Arc::from(model.as_str()),
                    endpoint: Arc::from(endpoint),
                }
            }
            _ => LiveSocket::Central,
        };
        let now = self.clock(record.t);
        let mut effects = Vec::new();
        let fleet = DumpFleet {
            index: &self.index,
            topic_map: &self.topic_map,
            replayable: &self.replayable,
            engines: &self.engines,
            default_engine: self.default_engine,
        };
        if record.is_disconnect() {
            if let Some(conn) = record.conn {
                self.table.disconnect(&fleet, &origin, ConnId(conn), now, &mut effects);
                self.carry_out(effects, None, record.t, now);
            }
            return;
        }
        self.totals.live += 1;
        let frames: Vec<Bytes> = frames.iter().map(|f| Bytes::copy_from_slice(f)).collect();
        let mut new = |_: &StreamKey, pod: &Arc<str>, model: &Arc<str>, _: Mode| {
            let stats = StreamStats { pod: pod.to_string(), model: model.to_string(), ..Default::default() };
            (Counts { stats }, None)
        };
        let conn = record.conn.map(ConnId);
        let msg = LiveMessage { origin: &origin, conn, peer: None, frames: &frames, received: None };
        let decoded = self.table.admit(&fleet, msg, now, &mut new, &mut effects);
        let mut traced = None;
        for effect in &effects {
            match effect {
                Effect::Undecodable { .. } => self.totals.undecodable += 1,
                Effect::Refused { reason: "name", .. } => self.totals.refused_names += 1,
                Effect::Steps { key, .. } => {
                    if let Some(st) = self.table.get_mut(key) {
                        st.ext.stats.messages += 1;
                        st.ext.stats.model = st.model.to_string();
                        traced = Some(st.pod.to_string());
                    }
                }
                _ => {}
            }
        }
        self.carry_out(effects, decoded.as_ref(), record.t, now);
        if self.trace.is_some() {
            let seq = frames.get(1).and_then(|f| <[u8; 8]>::try_from(f.as_ref()).ok()).map(u64::from_be_bytes);
            self.write_trace(traced, seq);
        }
    }

    fn clock(&mut self, t: f64) -> u64 {
        let start = *self.start_t.get_or_insert(t);
        ((t - start).max(0.0) * 1000.0) as u64
    }

    /// Carries the table's effects out on the index, then answers the replays they asked for
    /// from the recorded replies (whose effects are carried out in turn).
    fn carry_out(&mut self, effects: Vec<Effect<Counts>>, decoded: Option<&EventBatch<'_>>, t: f64, now: u64) {
        for effect in effects {
            if let Effect::Steps { key, steps } = effect {
                self.execute(&key, steps, decoded, t);
            }
        }
        while let Some((key, id, from)) = self.asked.pop_front() {
            // What the engine's buffer answered: the recorded replies from `from` on, taken,
            // so each answers one replay, as live (and the work is linear).
            let replies = take_replies(self.replies.get_mut(&key), from);
            self.reply_bytes -= replies.iter().map(|(_, p)| p.len() as u64 + REPLY_OVERHEAD).sum::<u64>();
            let mut out = Vec::new();
            if replies.is_empty() {
                self.table.replay(&key, id, ReplayEvent::Failed { timeout: false }, now, &mut out);
            } else {
                for (seq, payload) in replies {
                    self.table.replay(
                        &key,
                        id,
                        ReplayEvent::Message { seq, payload: Bytes::from(payload) },
                        now,
                        &mut out,
                    );
                }
                self.table.replay(&key, id, ReplayEvent::End, now, &mut out);
            }
            for effect in out {
                match effect {
                    Effect::Undecodable { .. } => {}
                    Effect::Steps { key, steps } => self.execute(&key, steps, None, t),
                    _ => {}
                }
            }
        }
    }

    fn execute(&mut self, key: &StreamKey, steps: Vec<Step<Batch>>, decoded: Option<&EventBatch<'_>>, t: f64) {
        for step in steps {
            let Some(stream) = self.table.get_mut(key) else { return };
            let pod = stream.pod.clone();
            match step {
                Step::Apply { seq, batch } => {
                    let owned;
                    let b = match decoded {
                        Some(b) => b,
                        None => match batch.decode() {
                            Ok(b) => {
                                owned = b;
                                &owned
                            }
                            Err(_) => continue,
                        },
                    };
                    // The stream's engine rules, as the live worker applies them.
                    let (r, _) = stream.rules.apply(&self.index, &pod, &stream.model, b);
                    let stats = &mut stream.ext.stats;
                    stats.applied += 1;
                    stats.stored_blocks += r.stored_blocks;
                    stats.removed_blocks += r.removed_blocks;
                    stats.engine_clears += r.cleared_events;
                    self.note(&pod, seq, t, "batch");
                }
                Step::Clear { reason } => {
                    stream.rules.clear();
                    self.index.clear_pod(&pod);
                    stream.ext.stats.clears += 1;
                    let seq = stream.seq.last_seq().unwrap_or(0);
                    self.note(&pod, seq, t, reason.label());
                }
                Step::RequestReplay { id, from, .. } => self.asked.push_back((key.clone(), id, from)),
                Step::ReplayDone { .. } | Step::Duplicate { .. } | Step::Transition { .. } | Step::Gap { .. } => {}
            }
        }
    }

    /// Writes a trace row: every traced prompt's scores now.
    fn write_trace(&mut self, pod: Option<String>, seq: Option<u64>) {
        let Some(trace) = self.trace.as_ref() else { return };
        let scores = trace
            .probes
            .iter()
            .map(|(model, tokens)| {
                let r = self.score(model, tokens);
                let mut m: Vec<(String, u32)> = r
                    .matches
                    .iter()
                    .filter(|m| m.matched_blocks > 0)
                    .map(|m| {
                        (self.index.pods().name(m.pod).map(|p| p.to_string()).unwrap_or_default(), m.matched_blocks)
                    })
                    .collect();
                m.sort();
                m
            })
            .collect();
        let row = TraceRow { record: self.totals.records, pod, seq, scores };
        let Some(trace) = self.trace.as_mut() else { return };
        let mut line = serde_json::to_vec(&row).expect("a trace row serializes");
        line.push(b'\n');
        if trace.out.write_all(&line).is_err() {
            // The trace is a view; a failing output ends it, not the replay.
            self.trace = None;
        }
    }

    /// Records changes of the explained prompt's blocks for `pod` after a step.
    fn note(&mut self, pod: &str, seq: u64, t: f64, cause: &str) {
        let Some(ex) = self.explain.as_mut().filter(|e| e.pod == pod) else { return };
        // The chain tree answers held prefixes: a block counts as held while the pod holds it
        // and every block before it (what a request would reuse).
        let pods = [pod];
        let q = ScoreQuery {
            model: &ex.model,
            lora_name: None,
            cache_salt: None,
            token_ids: &ex.tokens,
            pods: Some(&pods),
        };
        let matched = self.index.score(&q).matches.first().map_or(0, |m| m.matched_blocks as usize);
        for i in 0..ex.held.len() {
            let now = i < matched;
            if now != ex.held[i] {
                ex.held[i] = now;
                let change = if now { "stored" } else { "removed" };
                let event = ExplainEvent { seq, t, block: i, change, cause: cause.to_string() };
                ex.last[i] = Some(event.clone());
                ex.events.push_back(event);
                if ex.events.len() > self.limits.max_history {
                    ex.events.pop_front();
                    ex.dropped += 1;
                }
            }
        }
    }

    /// Per-stream statistics, by pod.
    pub fn stream_stats(&self) -> Vec<StreamStats> {
        let mut stats: Vec<StreamStats> = self
            .table
            .iter()
            .map(|(_, s)| {
                let q = s.seq.stats();
                StreamStats {
                    pod: s.pod.to_string(),
                    state: s.seq.state().label(),
                    last_seq: s.seq.last_seq(),
                    blocks: self.index.pod_stats(&s.pod).map_or(0, |p| p.blocks),
                    gaps: q.gaps,
                    duplicates: q.duplicates,
                    restarts: q.restarts,
                    malformed: q.malformed,
                    clears: q.clears,
                    replays_filled: q.replays_filled,
                    replays_failed: q.replays_failed,
                    ..s.ext.stats.clone()
                }
            })
            .collect();
        stats.sort_by(|a, b| a.pod.cmp(&b.pod));
        stats
    }

    /// The state label of `pod`'s stream.
    pub fn state_of(&self, pod: &str) -> Option<&'static str> {
        self.table.iter().find(|(_, s)| &*s.pod == pod).map(|(_, s)| s.seq.state().label())
    }

    pub fn score(&self, model: &str, tokens: &[u32]) -> ScoreResult {
        self.index.score(&ScoreQuery { model, lora_name: None, cache_salt: None, token_ids: tokens, pods: None })
    }
}

/// The first waiting reply of every seq from `from` on, taken out of `replies`. Every entry
/// visited gives one up (emptied entries are removed), so all replays of a dump together cost
/// what its replies number, however often a seq that keeps going back asks from 0.
fn take_replies(replies: Option<&mut BTreeMap<u64, VecDeque<Vec<u8>>>>, from: u64) -> Vec<(u64, Vec<u8>)> {
    let Some(replies) = replies else { return Vec::new() };
    let mut taken = Vec::new();
    let mut emptied = Vec::new();
    for (seq, waiting) in replies.range_mut(from..) {
        if let Some(payload) = waiting.pop_front() {
            taken.push((*seq, payload));
        }
        if waiting.is_empty() {
            emptied.push(*seq);
        }
    }
    for seq in emptied {
        replies.remove(&seq);
    }
    taken
}

#[cfg(test)]
mod dump_offline_tests {
    use std::collections::{BTreeMap, VecDeque};

    use super::take_replies;

    #[test]
    fn dump_replies_answer_one_replay_each_in_recorded_order() {
        let mut replies: BTreeMap<u64, VecDeque<Vec<u8>>> = BTreeMap::new();
        for (seq, p) in [(0, 1), (1, 2), (0, 3), (5, 4)] {
            replies.entry(seq).or_default().push_back(vec![p]);
        }
        assert_eq!(take_replies(Some(&mut replies), 1), [(1, vec![2]), (5, vec![4])]);
        assert_eq!(take_replies(Some(&mut replies), 0), [(0, vec![1])]);
        assert_eq!(take_replies(Some(&mut replies), 0), [(0, vec![3])]);
        assert!(replies.is_empty(), "{replies:?}");
        assert!(take_replies(Some(&mut replies), 0).is_empty());
        assert!(take_replies(None, 0).is_empty());
    }
}
