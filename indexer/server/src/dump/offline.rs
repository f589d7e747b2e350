//! `kvindex replay`: a dump rebuilt into an index offline, by the live path's pure core.
//!
//! Each live message goes through the same steps as in the service: frames → `wire` decode →
//! the stream's [`Sequencer`] → [`KvIndex::apply`] / clear. A replay the sequencer asks for is
//! answered from the replay replies recorded for that pod (what the engine's buffer answered
//! then), so a recording with gaps and replays rebuilds to what the live indexer held. The
//! clock is the records' receive time.
//!
//! [`Offline::explain`] follows one prompt for one pod: after every batch of that pod, which of
//! the prompt's blocks it holds; each change is attributed to the batch (seq, time) that made it.
//!
//! A dump is untrusted input, so what a replay holds besides the index is bounded: each
//! recorded reply answers at most one replay (as it did live; a dump whose seq keeps going
//! back asks for a replay from 0 on every line, and re-applying every reply each time was
//! quadratic), the replies held wait within [`Limits::max_reply_bytes`], pod and model names
//! within the service's bound, and `--explain`'s history within [`Limits::max_history`].

use std::collections::{BTreeMap, HashMap, VecDeque};

use kvindex::sequencer::{Item, Sequencer, SequencerConfig, Step};
use kvindex::wire::{self, dp_pod_id, parse_topic, ReplayReply};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery, ScoreResult};
use serde::Serialize;

use super::DumpRecord;
use crate::config::pod as names;

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

struct Stream {
    model: String,
    seq: Sequencer<Vec<u8>>,
    stats: StreamStats,
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

pub struct Offline {
    index: KvIndex,
    streams: BTreeMap<String, Stream>,
    /// Recorded replay replies by pod: seq → payloads in dump order, each taken by the first
    /// replay that asks for its seq (a restarted engine's replies of the same seqs wait behind
    /// the earlier process's).
    replies: HashMap<String, BTreeMap<u64, VecDeque<Vec<u8>>>>,
    reply_bytes: u64,
    limits: Limits,
    totals: Totals,
    start_t: Option<f64>,
    explain: Option<Explain>,
}

impl Offline {
    pub fn new(config: KvIndexConfig) -> Offline {
        Offline::with_limits(config, Limits::default())
    }

    pub fn with_limits(config: KvIndexConfig, limits: Limits) -> Offline {
        Offline {
            index: KvIndex::new(config),
            streams: BTreeMap::new(),
            replies: HashMap::new(),
            reply_bytes: 0,
            limits,
            totals: Totals::default(),
            start_t: None,
            explain: None,
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
        let pod = record.pod.clone().or_else(|| {
            let topic = std::str::from_utf8(msg.topic?).ok()?;
            Some(parse_topic(topic).id.to_string())
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
        let rank = wire::decode_batch(msg.payload).ok().and_then(|b| b.data_parallel_rank);
        self.replies
            .entry(dp_pod_id(&pod, rank))
            .or_default()
            .entry(msg.seq)
            .or_default()
            .push_back(msg.payload.to_vec());
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

    /// Applies one record through the live path.
    pub fn feed(&mut self, record: &DumpRecord, frames: &[Vec<u8>]) {
        self.totals.records += 1;
        self.totals.first_t.get_or_insert(record.t);
        self.totals.last_t = Some(record.t);
        if record.is_replay() {
            self.totals.replay += 1;
            return; // answered from `replies` when the sequencer asks
        }
        self.totals.live += 1;
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let Ok(raw) = wire::parse_live(&refs) else {
            self.totals.undecodable += 1;
            return;
        };
        let topic = raw.topic.and_then(|t| std::str::from_utf8(t).ok()).map(parse_topic);
        let (base, model) = match (&record.pod, &record.model, topic) {
            (Some(pod), Some(model), _) => (pod.clone(), model.clone()),
            (_, _, Some(t)) if !t.id.is_empty() => (t.id.to_string(), t.model.to_string()),
            _ => {
                self.totals.undecodable += 1;
                return;
            }
        };
        if names::name(&base).is_err() || names::name(&model).is_err() {
            self.totals.refused_names += 1;
            return;
        }
        let decoded = wire::decode_batch(raw.payload);
        let rank = decoded.as_ref().ok().and_then(|b| b.data_parallel_rank);
        if decoded.is_err() {
            self.totals.undecodable += 1;
        }
        let pod = dp_pod_id(&base, rank);
        let now = self.clock(record.t);
        let item = if decoded.is_ok() { Item::Batch(raw.payload.to_vec()) } else { Item::Malformed };
        let stream = self.streams.entry(pod.clone()).or_insert_with(|| Stream {
            model: model.clone(),
            seq: Sequencer::new(SequencerConfig { replay: true, ..Default::default() }),
            stats: StreamStats { pod: pod.clone(), model: model.clone(), ..Default::default() },
        });
        stream.model = model;
        stream.stats.messages += 1;
        let mut steps = Vec::new();
        stream.seq.on_live(raw.seq, item, now, &mut steps);
        self.execute(&pod, steps, record.t, now);
    }

    fn clock(&mut self, t: f64) -> u64 {
        let start = *self.start_t.get_or_insert(t);
        ((t - start).max(0.0) * 1000.0) as u64
    }

    fn execute(&mut self, pod: &str, steps: Vec<Step<Vec<u8>>>, t: f64, now: u64) {
        let mut queue: std::collections::VecDeque<Step<Vec<u8>>> = steps.into();
        while let Some(step) = queue.pop_front() {
            let Some(stream) = self.streams.get_mut(pod) else { return };
            match step {
                Step::Apply { seq, batch } => {
                    if let Ok(b) = wire::decode_batch(&batch) {
                        let r = self.index.apply(pod, &stream.model, &b);
                        stream.stats.applied += 1;
                        stream.stats.stored_blocks += r.stored_blocks;
                        stream.stats.removed_blocks += r.removed_blocks;
                        stream.stats.engine_clears += r.cleared_events;
                        self.note(pod, seq, t, "batch");
                    }
                }
                Step::Clear { reason } => {
                    self.index.clear_pod(pod);
                    stream.stats.clears += 1;
                    let seq = stream.seq.last_seq().unwrap_or(0);
                    self.note(pod, seq, t, reason.label());
                }
                Step::RequestReplay { id, from } => {
                    // What the engine's buffer answered: the recorded replies from `from` on,
                    // taken, so each answers one replay, as live (and the work is linear).
                    let mut out = Vec::new();
                    let replies = take_replies(self.replies.get_mut(pod), from);
                    self.reply_bytes -= replies.iter().map(|(_, p)| p.len() as u64 + REPLY_OVERHEAD).sum::<u64>();
                    if replies.is_empty() {
                        stream.seq.on_replay_failed(id, false, now, &mut out);
                    } else {
                        for (seq, payload) in replies {
                            let item = if wire::decode_batch(&payload).is_ok() {
                                Item::Batch(payload)
                            } else {
                                Item::Malformed
                            };
                            stream.seq.on_replay_message(id, seq, item, now, &mut out);
                        }
                        stream.seq.on_replay_end(id, now, &mut out);
                    }
                    queue.extend(out);
                }
                Step::ReplayDone { .. } | Step::Duplicate { .. } | Step::Transition { .. } | Step::Gap { .. } => {}
            }
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
        self.streams
            .values()
            .map(|s| {
                let q = s.seq.stats();
                StreamStats {
                    state: s.seq.state().label(),
                    last_seq: s.seq.last_seq(),
                    blocks: self.index.pod_stats(&s.stats.pod).map_or(0, |p| p.blocks),
                    gaps: q.gaps,
                    duplicates: q.duplicates,
                    restarts: q.restarts,
                    malformed: q.malformed,
                    clears: q.clears,
                    replays_filled: q.replays_filled,
                    replays_failed: q.replays_failed,
                    ..s.stats.clone()
                }
            })
            .collect()
    }

    /// The state label of `pod`'s stream.
    pub fn state_of(&self, pod: &str) -> Option<&'static str> {
        self.streams.get(pod).map(|s| s.seq.state().label())
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
