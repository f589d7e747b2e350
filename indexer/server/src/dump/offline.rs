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

use std::collections::{BTreeMap, HashMap};

use kvindex::sequencer::{Item, Sequencer, SequencerConfig, Step};
use kvindex::wire::{self, dp_pod_id, parse_topic, ReplayReply};
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery, ScoreResult};
use serde::Serialize;

use super::DumpRecord;

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
    events: Vec<ExplainEvent>,
}

pub struct Offline {
    index: KvIndex,
    streams: BTreeMap<String, Stream>,
    /// Recorded replay replies by pod: seq → payload.
    replies: HashMap<String, BTreeMap<u64, Vec<u8>>>,
    totals: Totals,
    start_t: Option<f64>,
    explain: Option<Explain>,
}

impl Offline {
    pub fn new(config: KvIndexConfig) -> Offline {
        Offline {
            index: KvIndex::new(config),
            streams: BTreeMap::new(),
            replies: HashMap::new(),
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
        let held = vec![false; tokens.len() / self.index.block_size()];
        let (pod, model, tokens) = (pod.to_string(), model.to_string(), tokens.to_vec());
        self.explain = Some(Explain { pod, model, tokens, held, events: Vec::new() });
    }

    pub fn explained(&self) -> &[ExplainEvent] {
        self.explain.as_ref().map_or(&[], |e| &e.events)
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
        let rank = wire::decode_batch(msg.payload).ok().and_then(|b| b.data_parallel_rank);
        self.replies.entry(dp_pod_id(&pod, rank)).or_default().insert(msg.seq, msg.payload.to_vec());
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
                    // What the engine's buffer answered: the recorded replies from `from` on.
                    let mut out = Vec::new();
                    let replies: Vec<(u64, Vec<u8>)> = self
                        .replies
                        .get(pod)
                        .map(|r| r.range(from..).map(|(s, p)| (*s, p.clone())).collect())
                        .unwrap_or_default();
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
                ex.events.push(ExplainEvent { seq, t, block: i, change, cause: cause.to_string() });
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
