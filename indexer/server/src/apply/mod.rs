//! Apply workers: each owns a set of streams (sharded by topic or pod), decodes their
//! messages, runs them through the per-stream [`Sequencer`] and carries out its steps on the
//! index. One stream is only ever touched by its worker, so a pod's batches apply in seq order.
//! Workers are threads; they take [`Work`] from their [`Queues`].

mod lag;
mod queue;
mod work;

pub use queue::{Queues, Receiver};
pub use work::{Origin, ReplayItem, StreamKey, Work};

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use metrics::{counter, gauge, histogram, Counter};

use kvindex::sequencer::{Item, Reason, ReplayOutcome, Sequencer, SequencerConfig, SourceState, Step};
use kvindex::wire::{self, EventBatch};
use kvindex::wire::{dp_pod_id, parse_topic};
use kvindex::SkipReason;

use crate::config::pod;
use crate::snapshot::format::{self, StreamRecord};
use crate::snapshot::{Captured, HeldMap};
use crate::state::ServiceState;
use crate::status::StreamDebug;
use crate::telemetry as m;
use crate::transport::{escape, escape_bytes, ConnId, Peer, Source};
use lag::Batch;

const TICK: Duration = Duration::from_millis(100);
/// How often `kvindex_index_bytes` is measured (the other gauges follow every tick).
const BYTES_EVERY: Duration = Duration::from_secs(5);
/// How often a worker looks for finished imports while any is running.
const IMPORT_POLL: Duration = Duration::from_millis(2);
/// Steps a stream may hold back behind its pod's snapshot export before the worker waits for
/// that export: what a publisher can make us keep while a starved export runs is bounded (the
/// socket's byte lease ends when its message is taken), at the price of a pause for one pod's
/// export, the old behaviour, only when the export falls that far behind.
const MAX_HELD_BACK: usize = 4096;

/// A pod's snapshot record being imported off the worker (see `start_import`).
struct Importing {
    /// The record's cursor (a snapshot meanwhile keeps the stored record).
    cursor: u64,
    done: std::sync::mpsc::Receiver<()>,
}

struct Stream {
    seq: Sequencer<Batch>,
    /// DP-resolved pod id.
    pod: Arc<str>,
    model: Arc<str>,
    mode: &'static str,
    topic: Option<String>,
    endpoint: Option<Arc<str>>,
    /// The initial replay counts for readiness until it is done.
    startup_sync: Option<u64>,
    /// Registry generation `seq`'s replay flag was derived from.
    registry_generation: u64,
    /// The live connection the last message came on.
    conn: Option<ConnId>,
    events: [Counter; 4],
    gaps: Counter,
    /// The pod's snapshot record, imported once the stream continues from its cursor.
    restore: Option<StreamRecord>,
    /// The record's cursor, until the sequencer has been resumed from it.
    resume_at: Option<u64>,
    /// The record, being imported on the import pool: until it is done, this stream's steps
    /// wait in `waiting`, in order, so nothing touches the pod before its record is in.
    importing: Option<Importing>,
    /// The pod is being exported for a snapshot at this cursor (see [`Capture`]): like an
    /// import, its steps wait in `waiting` until the export is done.
    exporting: Option<u64>,
    /// Steps held back by an import or an export, in order (a live batch's carries its
    /// receive time: the wait counts in its lag).
    waiting: Vec<Step<Batch>>,
    /// Central mode: the source address this stream's topic is bound to.
    bound: Option<Source>,
    /// Messages dropped because they came from another source.
    conflicts: u64,
    /// When the stream was made (service clock), for reclaiming one that never spoke again.
    created_at: u64,
    /// Whether the stream was ever EXACT: a stream a peer made up (a topic no engine
    /// publishes) never is, and is the first to go when the table is full.
    confirmed: bool,
}

impl Stream {
    fn new(state: &ServiceState, key: &StreamKey, model: Arc<str>, mode: &'static str) -> Self {
        let c = state.config();
        // A central-mode topic may already name the rank's own pod (engines whose topic is
        // templated per rank); `dp_naming = "topic"` then keeps it as is.
        let offset = !(mode == "central" && c.dp_naming_topic);
        let rank = (offset && key.rank > 0).then_some(i64::from(key.rank));
        let pod: Arc<str> = Arc::from(dp_pod_id(&key.base, rank).as_str());
        let seq = Sequencer::new(SequencerConfig {
            replay: false,
            stale_after_ms: c.stale_after_ms,
            replay_timeout_ms: c.replay_timeout_ms,
            replay_queue_timeout_ms: c.replay_queue_timeout_ms,
            replay_cooldown_ms: c.replay_cooldown_ms,
            max_pending: c.max_pending,
        });
        let ev = |t: &'static str| counter!(m::EVENTS, "type" => t, "source" => pod.to_string());
        state.status().add(&pod);
        tracing::info!(pod = %pod, model = %model, mode, "new source");
        // A record for another model is of no use: the pod's blocks are in another namespace.
        let restore = state.restored().take(&pod).filter(|r| r.model() == &*model && r.rank == key.rank);
        let resume_at = restore.as_ref().map(|r| r.cursor);
        Stream {
            seq,
            events: [ev("BlockStored"), ev("BlockRemoved"), ev("AllBlocksCleared"), ev("unknown")],
            gaps: counter!(m::GAPS, "source" => pod.to_string()),
            pod,
            model,
            mode,
            topic: None,
            endpoint: None,
            startup_sync: None,
            registry_generation: u64::MAX,
            conn: None,
            bound: None,
            conflicts: 0,
            restore,
            resume_at,
            importing: None,
            exporting: None,
            waiting: Vec::new(),
            created_at: state.now_ms(),
            confirmed: false,
        }
    }

    /// Why this stream may be reclaimed now to make room for another, if it may: only streams
    /// no operator or registration configured, not being imported or exported, that never were
    /// EXACT and said nothing for [`UNCONFIRMED_RECLAIM_MS`], or that said nothing for
    /// `stale_after_ms`. With its last activity, to reclaim the longest silent first.
    fn reclaimable(&self, state: &ServiceState, key: &StreamKey, now: u64) -> Option<(Reclaim, u64)> {
        if self.importing.is_some() || self.exporting.is_some() || state.registry().origin_of(&key.base).is_some() {
            return None;
        }
        let last = self.seq.last_data_at().unwrap_or(0).max(self.created_at);
        let silent = now.saturating_sub(last);
        if !self.confirmed && silent >= UNCONFIRMED_RECLAIM_MS {
            Some((Reclaim::Unconfirmed, last))
        } else if silent >= state.config().stale_after_ms {
            Some((Reclaim::Silent, last))
        } else {
            None
        }
    }

    /// The last seq applied to the index: the sequencer's, unless its steps are held back
    /// behind an import or a snapshot export, whose cursor then is what the index holds.
    fn applied_seq(&self) -> Option<u64> {
        self.exporting.or(self.importing.as_ref().map(|i| i.cursor)).or(self.seq.last_seq())
    }

    /// Binds this central-mode stream to the source address of its first publisher. A message
    /// from another address is dropped and counted (never treated as a reconnect, so it can
    /// neither clear the pod nor add blocks to it) while the bound source holds a connection
    /// to the central SUB; once it holds none (an engine rescheduled to a new address), the
    /// next source takes the stream over, which the sequencer sees as a reconnect (resync).
    fn bind_source(&mut self, state: &ServiceState, peer: &Peer) -> bool {
        let source = peer.source();
        match self.bound {
            None => self.bound = Some(source),
            Some(bound) if bound == source => {}
            Some(bound) if !state.central_source_connected(&bound) => {
                tracing::warn!(pod = %escape(&self.pod), from = %bound, to = %source, "topic moved to a new source address");
                self.bound = Some(source);
            }
            Some(bound) => {
                self.conflicts += 1;
                counter!(m::TOPIC_CONFLICTS).increment(1);
                if self.conflicts.is_power_of_two() {
                    tracing::warn!(
                        pod = %escape(&self.pod),
                        bound = %bound,
                        foreign = %peer,
                        dropped_total = self.conflicts,
                        "message for a topic bound to another source address dropped"
                    );
                }
                return false;
            }
        }
        true
    }
}

/// Silence after which a stream that was never EXACT may be reclaimed when the table is full.
const UNCONFIRMED_RECLAIM_MS: u64 = 1_000;

/// Why a stream may be reclaimed, in the order they go: never-confirmed streams first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reclaim {
    /// Never EXACT, and silent for [`UNCONFIRMED_RECLAIM_MS`].
    Unconfirmed,
    /// Silent for `stale_after_ms`.
    Silent,
}

impl Reclaim {
    fn label(self) -> &'static str {
        match self {
            Reclaim::Unconfirmed => "unconfirmed",
            Reclaim::Silent => "silent",
        }
    }
}

/// Longest topic accepted: `kv@` + an id and a model of [`pod::MAX_NAME_LEN`] each.
const MAX_TOPIC_LEN: usize = 2 * pod::MAX_NAME_LEN + 8;

/// Topics seen by a worker, resolved once per registry generation: (generation, pod, model).
type TopicCache = HashMap<Vec<u8>, (u64, Arc<str>, Arc<str>)>;
const TOPIC_CACHE_MAX: usize = 100_000;

pub struct Worker {
    state: Arc<ServiceState>,
    index: usize,
    streams: HashMap<StreamKey, Stream>,
    topics: TopicCache,
    deferred: VecDeque<Work>,
    steps: Vec<Step<Batch>>,
    blocks_stored: Counter,
    blocks_removed: Counter,
    skipped: Vec<Counter>,
    live_msgs: Counter,
    replay_msgs: Counter,
    duplicates: Counter,
    /// This worker's share of `max_sources`.
    max_streams: usize,
    /// This worker's share of `max_sources_per_address` (central mode).
    max_streams_per_address: usize,
    refused: u64,
    /// Streams whose snapshot record is being imported.
    imports: usize,
    /// The snapshot this worker is capturing, if one is.
    capture: Option<Capture>,
    /// When worker 0 next measures the index's bytes: a walk of every segment under each
    /// shard's writer lock, too dear for every tick of a large index.
    bytes_due: Instant,
}

impl Worker {
    pub fn new(state: Arc<ServiceState>, index: usize) -> Self {
        Worker {
            index,
            streams: HashMap::new(),
            topics: HashMap::new(),
            deferred: VecDeque::new(),
            steps: Vec::new(),
            blocks_stored: counter!(m::BLOCKS, "op" => "stored"),
            blocks_removed: counter!(m::BLOCKS, "op" => "removed"),
            skipped: SkipReason::ALL.iter().map(|r| counter!(m::SKIPPED, "reason" => r.label())).collect(),
            live_msgs: counter!(m::MESSAGES, "socket" => "SUB"),
            replay_msgs: counter!(m::MESSAGES, "socket" => "DEALER"),
            duplicates: counter!(m::DUPLICATES),
            max_streams: state.config().max_sources.div_ceil(state.config().apply_workers),
            max_streams_per_address: state.config().max_sources_per_address.div_ceil(state.config().apply_workers),
            refused: 0,
            imports: 0,
            capture: None,
            bytes_due: Instant::now(),
            state,
        }
    }

    /// Drops a message that would start a source we refuse; counts it, logs now and then.
    fn refuse_source(&mut self, reason: &'static str, why: &'static str, topic: &[u8]) {
        counter!(m::SOURCES_REFUSED, "reason" => reason).increment(1);
        self.refused += 1;
        if self.refused.is_power_of_two() {
            tracing::warn!(reason, topic = %escape_bytes(topic), refused_total = self.refused, "{why}: message dropped");
        }
    }

    pub fn run(mut self, rx: Receiver) {
        let mut next_tick = Instant::now() + TICK;
        loop {
            while let Some(w) = self.deferred.pop_front() {
                self.handle(w);
            }
            let mut timeout = next_tick.saturating_duration_since(Instant::now());
            if self.imports > 0 {
                self.finish_imports();
            }
            if self.capture.is_some() {
                self.advance_capture();
            }
            if self.imports > 0 || self.capture.is_some() {
                timeout = timeout.min(IMPORT_POLL);
            }
            match rx.recv_timeout(timeout) {
                Ok(Work::Stop) => return,
                Ok(w) => self.handle(w),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if Instant::now() >= next_tick {
                self.tick(&rx);
                next_tick = Instant::now() + TICK;
            }
        }
    }

    fn handle(&mut self, work: Work) {
        match work {
            Work::Live { origin, conn, peer, frames, lease, at } => {
                self.live(origin, conn, &peer, frames, at);
                drop(lease); // the socket may read again
            }
            Work::Replay { stream, id, item } => self.replay(stream, id, item),
            Work::InitialSync { stream, model, endpoint, startup } => {
                let now = self.state.now_ms();
                let replay = self.state.registry().replay_endpoint(&stream.base, stream.rank).is_some();
                let mut steps = std::mem::take(&mut self.steps);
                let st = self.stream(&stream, &model, "per-pod");
                st.endpoint = Some(endpoint);
                st.seq.set_replay(replay);
                match st.resume_at.take() {
                    Some(cursor) => st.seq.resume(cursor, now, &mut steps),
                    None => st.seq.start_initial_sync(now, &mut steps),
                }
                if startup {
                    st.startup_sync = steps.iter().find_map(|s| match s {
                        Step::RequestReplay { id, .. } => Some(*id),
                        _ => None,
                    });
                    if st.startup_sync.is_none() {
                        self.state.readiness().sync_finished();
                    }
                }
                self.execute(&stream, &mut steps, None);
                self.steps = steps;
            }
            Work::Disconnected { origin, conn } => self.disconnected(&origin, conn),
            Work::RemovePod { pod, done } => {
                let keys: Vec<StreamKey> = self
                    .streams
                    .iter()
                    .filter(|(k, s)| &*k.base == pod.as_str() || &*s.pod == pod.as_str())
                    .map(|(k, _)| k.clone())
                    .collect();
                let mut any = !keys.is_empty();
                for k in keys {
                    any |= self.drop_stream(&k, "removed");
                }
                any |= self.state.index().remove_pod(&pod);
                self.state.end_speculation(&pod, "removed");
                let _ = done.send(any);
            }
            Work::Snapshot { held, reply } => {
                // One capture at a time (`snapshot::take` waits for every reply); were another
                // still running, it is finished first.
                while self.capture.is_some() {
                    self.wait_export_any();
                    self.advance_capture();
                }
                let queue = self.streams.keys().cloned().collect();
                let (done_tx, done) = std::sync::mpsc::channel();
                self.capture = Some(Capture { held, queue, running: 0, out: Vec::new(), reply, done_tx, done });
                self.advance_capture();
            }
            Work::Stop => {}
        }
    }

    /// Forgets `key`'s stream and everything its pod holds. Returns whether the index held
    /// anything of it.
    fn drop_stream(&mut self, key: &StreamKey, why: &'static str) -> bool {
        // Its export (a snapshot's) must not land after the pod is gone either.
        self.wait_export(key);
        let Some(st) = self.streams.remove(key) else { return false };
        if let Some(import) = &st.importing {
            // The import must not land after the pod is gone.
            let _ = import.done.recv();
            self.imports -= 1;
        }
        if st.startup_sync.is_some() {
            self.state.readiness().sync_finished();
        }
        self.state.status().remove(key, &st.pod, st.seq.state());
        let held = self.state.index().remove_pod(&st.pod);
        self.state.end_speculation(&st.pod, why);
        held
    }

    /// Makes room in a full stream table: reclaims the longest-silent stream that may go
    /// ([`Stream::reclaimable`]), never-confirmed ones first. False when none may.
    fn reclaim_one(&mut self, now: u64) -> bool {
        let state = self.state.clone();
        let pick = self
            .streams
            .iter()
            .filter_map(|(k, st)| st.reclaimable(&state, k, now).map(|(why, last)| (why, last, k)))
            .min_by_key(|(why, last, _)| (*why, *last))
            .map(|(why, _, k)| (k.clone(), why.label()));
        let Some((key, why)) = pick else { return false };
        let pod = self.streams.get(&key).map(|st| st.pod.clone());
        self.drop_stream(&key, "reclaimed");
        counter!(m::SOURCES_RECLAIMED, "reason" => why).increment(1);
        if let Some(pod) = pod {
            tracing::info!(pod = %escape(&pod), reason = why, "source reclaimed to make room for a new one");
        }
        true
    }

    /// Clears every stream the closed connection `conn` carried: a restarted engine publishes
    /// nothing until it serves a request, so the old process's blocks must not wait for that.
    fn disconnected(&mut self, origin: &Origin, conn: ConnId) {
        let keys: Vec<StreamKey> = self
            .streams
            .iter()
            .filter(|(key, st)| match st.conn {
                Some(c) => c == conn,
                // A dialled pod's stream filled by its start-up replay before any live message
                // came: the dialer's connection is the only one that pod has.
                None => match origin {
                    Origin::Pod { id, endpoint, .. } => {
                        key.base == *id
                            && st.endpoint.as_ref() == Some(endpoint)
                            && st.seq.state() != SourceState::Connecting
                    }
                    Origin::Central => false,
                },
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in keys {
            let mut steps = std::mem::take(&mut self.steps);
            if let Some(st) = self.streams.get_mut(&key) {
                st.conn = None;
                st.seq.on_disconnect(&mut steps);
                tracing::info!(pod = %st.pod, %conn, "publisher disconnected: pod cleared until its next connection");
            }
            self.execute(&key, &mut steps, None);
            self.steps = steps;
        }
    }

    fn stream(&mut self, key: &StreamKey, model: &Arc<str>, mode: &'static str) -> &mut Stream {
        let state = &self.state;
        let st = self.streams.entry(key.clone()).or_insert_with(|| Stream::new(state, key, model.clone(), mode));
        if st.model != *model {
            tracing::info!(pod = %st.pod, old = %st.model, new = %model, "source switched model");
            st.model = model.clone();
        }
        st
    }

    fn live(&mut self, origin: Origin, conn: ConnId, peer: &Peer, frames: Vec<Bytes>, at: Instant) {
        self.live_msgs.increment(1);
        if let Some(recorder) = self.state.recorder() {
            let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
            match &origin {
                Origin::Central => recorder.record("live", None, None, Some("central"), &refs),
                Origin::Pod { id, model, endpoint } => {
                    recorder.record("live", Some(id), Some(model), Some(endpoint), &refs)
                }
            }
        }
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
        let raw = match wire::parse_live(&refs) {
            Ok(raw) => raw,
            Err(e) => return decode_error(e.reason(), "live frames"),
        };
        if raw.seq == wire::END_OF_REPLAY_SEQ {
            // The replay end marker is never a live seq.
            return decode_error("seq_end_marker", "live message with the end-of-replay seq");
        }
        let filter = self.state.config().topic_filter.as_bytes();
        let topic = raw.topic.unwrap_or_default();
        if !topic.starts_with(filter) {
            // The publisher filters for us; this is the local safety net.
            return decode_error("topic_filtered", "topic does not match the filter");
        }
        if topic.len() > MAX_TOPIC_LEN {
            return self.refuse_source("name", "topic too long", topic);
        }
        let generation = self.state.registry().generation();
        let (base, model, mode, endpoint): (Arc<str>, Arc<str>, &'static str, Option<Arc<str>>) = match &origin {
            Origin::Central => match self.topics.get(topic) {
                Some((g, base, model)) if *g == generation => (base.clone(), model.clone(), "central", None),
                _ => {
                    let Ok(text) = std::str::from_utf8(topic) else {
                        return decode_error("topic_utf8", "topic is not UTF-8");
                    };
                    let t = parse_topic(text);
                    if t.id.is_empty() {
                        return decode_error("topic_empty", "topic names no pod");
                    }
                    if pod::name(t.id).is_err() || pod::name(t.model).is_err() {
                        return self.refuse_source(
                            "name",
                            "topic id or model too long or with control characters",
                            topic,
                        );
                    }
                    let base: Arc<str> = Arc::from(self.state.registry().pod_for_topic(t.id));
                    let model: Arc<str> = Arc::from(t.model);
                    if self.topics.len() >= TOPIC_CACHE_MAX {
                        self.topics.clear();
                    }
                    self.topics.insert(topic.to_vec(), (generation, base.clone(), model.clone()));
                    (base, model, "central", None)
                }
            },
            Origin::Pod { id, model, endpoint } => (id.clone(), model.clone(), "per-pod", Some(endpoint.clone())),
        };
        let payload = frames[2].clone();
        let seq_no = raw.seq;
        let decoded = wire::decode_batch(&payload);
        let ranks: Vec<u32> = match &decoded {
            Ok(batch) => vec![batch.data_parallel_rank.unwrap_or(0).clamp(0, i64::from(u16::MAX)) as u32],
            Err(e) => {
                decode_error(e.reason(), "live payload");
                // The rank is unknown: every stream of this source takes the loss.
                let mut ranks: Vec<u32> = self.streams.keys().filter(|k| k.base == base).map(|k| k.rank).collect();
                if ranks.is_empty() {
                    ranks.push(0);
                }
                ranks
            }
        };
        for rank in ranks {
            let key = StreamKey { base: base.clone(), rank };
            let now = self.state.now_ms();
            if !self.streams.contains_key(&key) {
                if mode == "central" {
                    // One address cannot take the table: its streams are capped.
                    let source = Some(peer.source());
                    if self.streams.values().filter(|st| st.bound == source).count() >= self.max_streams_per_address {
                        self.refuse_source("max_sources_per_address", "max_sources_per_address reached", topic);
                        continue;
                    }
                }
                if self.streams.len() >= self.max_streams && !self.reclaim_one(now) {
                    self.refuse_source("max_sources", "max_sources reached", topic);
                    continue;
                }
            }
            let mut steps = std::mem::take(&mut self.steps);
            let state = self.state.clone();
            let st = self.stream(&key, &model, mode);
            if mode == "central" && !st.bind_source(&state, peer) {
                self.steps = steps;
                continue;
            }
            if st.conn != Some(conn) {
                if st.conn.is_some() {
                    tracing::info!(pod = %st.pod, "publisher reconnected: resync from seq 0");
                    st.seq.on_reconnect();
                }
                st.conn = Some(conn);
            }
            if st.registry_generation != generation {
                // A registration changed: is there a replay endpoint for this stream now?
                st.seq.set_replay(state.registry().replay_endpoint(&base, rank).is_some());
                st.registry_generation = generation;
            }
            if let Some(cursor) = st.resume_at.take() {
                st.seq.resume(cursor, now, &mut steps);
            }
            if st.topic.is_none() && mode == "central" {
                st.topic = Some(String::from_utf8_lossy(topic).into_owned());
            }
            if st.endpoint.is_none() {
                st.endpoint = endpoint.clone();
            }
            let item = if decoded.is_ok() { Item::Batch(Batch::live(payload.clone(), at)) } else { Item::Malformed };
            st.seq.on_live(seq_no, item, now, &mut steps);
            let current = decoded.as_ref().ok().map(|b| (&payload, b));
            self.execute(&key, &mut steps, current);
            self.steps = steps;
        }
    }

    fn replay(&mut self, key: StreamKey, id: u64, item: ReplayItem) {
        let now = self.state.now_ms();
        let Some(st) = self.streams.get_mut(&key) else { return };
        if let (Some(recorder), ReplayItem::Message { seq, payload, .. }) = (self.state.recorder(), &item) {
            // The replay reply as a DEALER sees it (vLLM 0.26+ layout, topic left empty).
            let seq = seq.to_be_bytes();
            recorder.record("replay", Some(&key.base), Some(&st.model), None, &[b"", b"", &seq, payload]);
        }
        let mut steps = std::mem::take(&mut self.steps);
        match item {
            ReplayItem::Message { seq, payload, lease: _taken } => {
                self.replay_msgs.increment(1);
                let item = match wire::decode_batch(&payload) {
                    // Received live already and held: it is visible only now, so its wait
                    // counts from that receive.
                    Ok(_) => Item::Batch(Batch {
                        bytes: payload.clone(),
                        received: st.seq.held_at(seq).and_then(|b| b.received),
                    }),
                    Err(e) => {
                        decode_error(e.reason(), "replay payload");
                        Item::Malformed
                    }
                };
                st.seq.on_replay_message(id, seq, item, now, &mut steps);
            }
            ReplayItem::Begun => st.seq.on_replay_begun(id, now),
            ReplayItem::End => st.seq.on_replay_end(id, now, &mut steps),
            ReplayItem::Failed { timeout } => st.seq.on_replay_failed(id, timeout, now, &mut steps),
        }
        self.execute(&key, &mut steps, None);
        self.steps = steps;
    }

    /// Carries out the sequencer's steps for one stream, in order.
    fn execute(&mut self, key: &StreamKey, steps: &mut Vec<Step<Batch>>, current: Option<(&Bytes, &EventBatch<'_>)>) {
        let state = self.state.clone();
        for step in steps.drain(..) {
            let Some(st) = self.streams.get_mut(key) else { return };
            if st.importing.is_some() || st.exporting.is_some() {
                st.waiting.push(step);
                if st.exporting.is_some() && st.waiting.len() >= MAX_HELD_BACK {
                    counter!(m::SNAPSHOT_EXPORT_WAITS).increment(1);
                    self.wait_export(key);
                }
                continue;
            }
            match step {
                Step::Apply { seq, batch } => {
                    if let Some(record) = st.restore.take() {
                        // The stream continued from the snapshot's cursor: its residencies hold.
                        // They are imported on the import pool (every core), and this batch and
                        // the stream's next steps wait for them.
                        st.importing = Some(start_import(&state, record));
                        st.waiting.push(Step::Apply { seq, batch });
                        self.imports += 1;
                        continue;
                    }
                    let report = match decoded_here(current, &batch.bytes) {
                        // The batch this call decoded: do not decode it again.
                        Some(decoded) => {
                            let r = state.index().apply(&st.pod, &st.model, decoded);
                            record_event_to_visible(decoded.ts);
                            r
                        }
                        _ => match wire::decode_batch(&batch.bytes) {
                            Ok(decoded) => {
                                let r = state.index().apply(&st.pod, &st.model, &decoded);
                                if batch.received.is_some() {
                                    // A live batch held back (behind a replay, an export or an
                                    // import): visible only now.
                                    record_event_to_visible(decoded.ts);
                                }
                                r
                            }
                            Err(_) => continue, // decoded fine before; cannot happen
                        },
                    };
                    if let Some(at) = batch.received {
                        histogram!(m::RECEIVE_TO_VISIBLE).record(at.elapsed().as_secs_f64());
                    }
                    st.events[0].increment(report.stored_events);
                    st.events[1].increment(report.removed_events);
                    st.events[2].increment(report.cleared_events);
                    if report.cleared_events > 0 {
                        state.end_speculation(&st.pod, "all_blocks_cleared");
                    }
                    st.events[3].increment(report.unknown_events);
                    self.blocks_stored.increment(report.stored_blocks);
                    self.blocks_removed.increment(report.removed_blocks);
                    if report.hash_check.checked > 0 {
                        counter!(m::HASH_CHECKED, "source" => st.pod.to_string())
                            .increment(u64::from(report.hash_check.checked));
                    }
                    if report.hash_check.mismatched > 0 {
                        counter!(m::HASH_MISMATCHES, "source" => st.pod.to_string())
                            .increment(u64::from(report.hash_check.mismatched));
                    }
                    for (c, n) in self.skipped.iter().zip(report.skipped) {
                        if n > 0 {
                            c.increment(n);
                        }
                    }
                }
                Step::Clear { reason } => {
                    if st.restore.take().is_some() {
                        counter!(m::SNAPSHOT_RESTORES, "outcome" => "dropped").increment(1);
                        tracing::warn!(pod = %st.pod, reason = reason.label(), "snapshot record dropped: the stream did not continue from its cursor");
                    }
                    let removed = state.index().clear_pod(&st.pod);
                    state.end_speculation(&st.pod, reason.label());
                    counter!(m::CLEARS, "reason" => reason.label()).increment(1);
                    tracing::warn!(pod = %st.pod, reason = reason.label(), entries_removed = removed, "pod cleared");
                }
                Step::RequestReplay { id, from } => {
                    let endpoint = state.registry().replay_endpoint(&key.base, key.rank);
                    match endpoint {
                        Some(ep) => {
                            tracing::info!(pod = %st.pod, from, endpoint = %ep, "replay requested");
                            state.spawn(crate::replay::run(state.clone(), self.index, key.clone(), id, from, ep));
                        }
                        None => self.deferred.push_back(Work::Replay {
                            stream: key.clone(),
                            id,
                            item: ReplayItem::Failed { timeout: false },
                        }),
                    }
                }
                Step::ReplayDone { id, outcome } => {
                    counter!(m::REPLAYS, "outcome" => outcome.label()).increment(1);
                    if outcome == ReplayOutcome::Filled {
                        tracing::info!(pod = %st.pod, id, outcome = outcome.label(), "replay done");
                    } else {
                        tracing::warn!(pod = %st.pod, id, outcome = outcome.label(), "replay failed");
                    }
                    if st.startup_sync == Some(id) {
                        st.startup_sync = None;
                        state.readiness().sync_finished();
                    }
                }
                Step::Gap { expected, got } => {
                    st.gaps.increment(1);
                    tracing::warn!(pod = %st.pod, expected, got, "sequence gap");
                }
                Step::Duplicate { .. } => self.duplicates.increment(1),
                Step::Transition { from, to, reason } => {
                    st.confirmed |= to == SourceState::Exact;
                    transition(&state, &st.pod, from, to, reason);
                }
            }
        }
    }

    /// Carries on with the streams whose snapshot import has finished: their waiting steps run.
    fn finish_imports(&mut self) {
        let done: Vec<StreamKey> = self
            .streams
            .iter()
            .filter(|(_, st)| {
                st.importing.as_ref().is_some_and(|i| {
                    // Disconnected: the import's thread is gone (it cannot be, short of a bug),
                    // and the stream goes on with what was imported.
                    !matches!(i.done.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty))
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in done {
            let Some(st) = self.streams.get_mut(&key) else { continue };
            st.importing = None;
            self.imports -= 1;
            self.run_waiting(&key);
        }
    }

    /// Runs the steps `key`'s stream held back while its pod was imported or exported.
    fn run_waiting(&mut self, key: &StreamKey) {
        let Some(st) = self.streams.get_mut(key) else { return };
        let waiting = std::mem::take(&mut st.waiting);
        let mut steps = std::mem::take(&mut self.steps);
        for step in waiting {
            // Held back, not lost: a live batch's wait counts in its receive-to-visible time.
            steps.push(step);
            self.execute(key, &mut steps, None);
        }
        self.steps = steps;
    }

    fn tick(&mut self, lane: &Receiver) {
        let now = self.state.now_ms();
        let keys: Vec<StreamKey> = self.streams.keys().cloned().collect();
        for key in &keys {
            let mut steps = std::mem::take(&mut self.steps);
            if let Some(st) = self.streams.get_mut(key) {
                st.seq.on_tick(now, &mut steps);
            }
            self.execute(key, &mut steps, None);
            self.steps = steps;
        }
        // Refresh what /debug/sources shows.
        let reg = self.state.registry();
        let mut snapshot = Vec::with_capacity(self.streams.len());
        let (instant, lane_oldest) = (Instant::now(), lane.oldest_live());
        let mut worst = lag::source_lag(instant, lane_oldest, None);
        for (key, st) in &self.streams {
            let s = st.seq.stats();
            let lag = lag::source_lag(instant, lane_oldest, lag::oldest_held(st.seq.held(), &st.waiting));
            worst = worst.max(lag);
            snapshot.push((
                key.clone(),
                StreamDebug {
                    pod: st.pod.to_string(),
                    base_pod: key.base.to_string(),
                    dp_rank: key.rank,
                    mode: st.mode,
                    topic: st.topic.clone(),
                    topic_id: st.topic.as_deref().map(|t| parse_topic(t).id.to_string()),
                    model: st.model.to_string(),
                    endpoint: st.endpoint.as_deref().map(str::to_string),
                    replay_endpoint: reg.replay_endpoint(&key.base, key.rank),
                    state: st.seq.state().label(),
                    last_seq: st.applied_seq(),
                    last_live_seq: st.seq.last_live_seq(),
                    last_event_age_ms: st.seq.last_data_at().map(|at| now.saturating_sub(at)),
                    gaps: s.gaps,
                    duplicates: s.duplicates,
                    restarts: s.restarts,
                    disconnects: s.disconnects,
                    malformed: s.malformed,
                    clears: s.clears,
                    replays_started: s.replays_started,
                    replays_filled: s.replays_filled,
                    replays_failed: s.replays_failed,
                    replay_in_flight: st.seq.replay_in_flight().map(|(_, from)| from),
                    pending: st.seq.pending(),
                    lag_ms: lag.as_secs_f64() * 1e3,
                },
            ));
        }
        drop(reg);
        self.state.status().publish(snapshot);
        lane.set_lag(worst);
        gauge!(m::SOURCE_LAG).set(self.state.queues().max_lag().as_secs_f64());
        if self.index == 0 {
            let table = self.state.index().table();
            gauge!(m::INDEX_ENTRIES).set(table.entries() as f64);
            gauge!(m::INDEX_KEYS).set(table.keys() as f64);
            if Instant::now() >= self.bytes_due {
                gauge!(m::INDEX_BYTES).set(table.approx_bytes() as f64);
                self.bytes_due = Instant::now() + BYTES_EVERY;
            }
            gauge!(m::QUEUE_DEPTH).set(self.state.queues().depth().max(0) as f64);
            gauge!(m::READY).set(if self.state.readiness().is_ready() { 1.0 } else { 0.0 });
            gauge!(m::PODS).set(self.state.status().pods() as f64);
            let speculative = self.state.speculative();
            // Expired credits are already ignored by scoring; sweeping reclaims their memory.
            speculative.sweep_every(1_000, self.state.now_ms());
            gauge!(m::SPECULATIVE_ENTRIES).set(speculative.entries() as f64);
            gauge!(m::SPECULATIVE_BYTES).set(speculative.approx_bytes() as f64);
        }
    }
}

/// A snapshot being captured by a worker: its streams are taken one at a time, each at a point
/// between two of its own batches, so each record is exact at its cursor. A stream that needs
/// an export is handed to the snapshot pool, at most one per pool thread at once, and only that
/// stream's steps wait meanwhile; the worker goes on applying every other stream's.
struct Capture {
    /// What the store holds: a stream whose record is still exact is kept, not exported.
    held: Arc<HeldMap>,
    /// Streams not taken yet.
    queue: Vec<StreamKey>,
    /// Exports on the pool.
    running: usize,
    out: Vec<Captured>,
    reply: tokio::sync::oneshot::Sender<Vec<Captured>>,
    done_tx: std::sync::mpsc::Sender<(StreamKey, Option<Captured>)>,
    done: std::sync::mpsc::Receiver<(StreamKey, Option<Captured>)>,
}

/// What a stream gives a snapshot at this point of its sequence.
enum Part {
    /// Nothing: it has applied no batch yet.
    Nothing,
    Now(Captured),
    /// Its pod's residencies must be exported: (store key, pod, model, cursor, pod version).
    Export(String, Arc<str>, Arc<str>, u64, Option<u64>),
}

impl Worker {
    /// Finished exports in; then streams out to the pool while it has threads free, or taken
    /// at once where no export is needed. Answers the snapshot when every stream is in.
    fn advance_capture(&mut self) {
        let Some(capture) = self.capture.as_mut() else { return };
        let mut finished = Vec::new();
        while let Ok(done) = capture.done.try_recv() {
            finished.push(done);
        }
        for (key, captured) in finished {
            self.export_finished(&key, captured);
        }
        let Some(capture) = self.capture.as_mut() else { return };
        while capture.running < crate::snapshot::pool::threads() {
            let Some(key) = capture.queue.pop() else { break };
            let Some(st) = self.streams.get_mut(&key) else { continue };
            match stream_part(&key, st, &capture.held, self.state.index()) {
                Part::Nothing => {}
                Part::Now(captured) => capture.out.push(captured),
                Part::Export(skey, pod, model, cursor, version) => {
                    st.exporting = Some(cursor);
                    capture.running += 1;
                    let (tx, state) = (capture.done_tx.clone(), self.state.clone());
                    crate::snapshot::pool::pool().spawn(move || {
                        let export = || {
                            let export = state.index().export_pod(&pod).unwrap_or_else(|| kvindex::PodExport {
                                pod: pod.to_string(),
                                model: model.to_string(),
                                ..Default::default()
                            });
                            (export.model == *model).then(|| {
                                let record = StreamRecord::new(&key.base, key.rank, cursor, export);
                                Captured::Fresh { key: skey, version, record: Box::new(record) }
                            })
                        };
                        // Always answered, so the stream's held-back steps always run: an export
                        // that panicked (it never should) leaves the pod out of this snapshot.
                        let captured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(export))
                            .unwrap_or_else(|_| {
                                tracing::error!(pod = %pod, "snapshot export failed: the pod is left out of this snapshot");
                                None
                            });
                        // The service state goes first, as the snapshot write lets go of the
                        // store: nothing of the service outlives the answer on a pool thread.
                        drop(state);
                        let _ = tx.send((key, captured));
                    });
                }
            }
        }
        if capture.running == 0 && capture.queue.is_empty() {
            if let Some(capture) = self.capture.take() {
                let _ = capture.reply.send(capture.out);
            }
        }
    }

    /// A stream's export is in: counted in the snapshot, and the stream's held-back steps run.
    fn export_finished(&mut self, key: &StreamKey, captured: Option<Captured>) {
        if let Some(capture) = self.capture.as_mut() {
            capture.running -= 1;
            capture.out.extend(captured);
        }
        if let Some(st) = self.streams.get_mut(key) {
            st.exporting = None;
            if st.importing.is_none() {
                self.run_waiting(key);
            }
        }
    }

    /// Blocks until one running export of the capture is in (none running: returns at once).
    fn wait_export_any(&mut self) {
        let Some(capture) = self.capture.as_ref() else { return };
        if capture.running == 0 {
            return;
        }
        match capture.done.recv() {
            Ok((key, captured)) => self.export_finished(&key, captured),
            // The capture keeps a sender, so this is only reachable if that changes: what was
            // held back runs, and the snapshot is answered without those streams.
            Err(_) => {
                let exporting: Vec<StreamKey> =
                    self.streams.iter().filter(|(_, st)| st.exporting.is_some()).map(|(k, _)| k.clone()).collect();
                for key in exporting {
                    self.export_finished(&key, None);
                }
                if let Some(capture) = self.capture.as_mut() {
                    capture.running = 0;
                }
            }
        }
    }

    /// Blocks until `key`'s stream is not being exported.
    fn wait_export(&mut self, key: &StreamKey) {
        while self.streams.get(key).is_some_and(|st| st.exporting.is_some()) && self.capture.is_some() {
            self.wait_export_any();
        }
    }
}

/// What `st` gives a snapshot now: the pod's residencies at its last applied seq or, for a
/// stream still waiting to prove its snapshot record, that record again. A stream whose stored
/// record (`held`) is still exact (same cursor, the pod unchanged since it was exported) is
/// kept, not exported again.
fn stream_part(key: &StreamKey, st: &Stream, held: &HeldMap, index: &kvindex::KvIndex) -> Part {
    let skey = format::stream_key(&key.base, key.rank);
    let stored = held.get(&skey);
    if let Some(import) = &st.importing {
        // Its record is going in: the stored one stands (none is, if it was not stored).
        return if stored.is_some_and(|h| h.cursor == import.cursor) {
            Part::Now(Captured::Kept { key: skey })
        } else {
            Part::Nothing
        };
    }
    if let Some(record) = &st.restore {
        return Part::Now(if stored.is_some_and(|h| h.cursor == record.cursor) {
            Captured::Kept { key: skey }
        } else {
            Captured::Fresh { key: skey, version: None, record: Box::new(record.clone()) }
        });
    }
    let Some(cursor) = st.seq.last_seq() else { return Part::Nothing };
    // Read before the export: a change in between makes the next snapshot export again.
    let version = index.pod_version(&st.pod);
    if stored.is_some_and(|h| h.cursor == cursor && version.is_some() && h.version == version) {
        return Part::Now(Captured::Kept { key: skey });
    }
    Part::Export(skey, st.pod.clone(), st.model.clone(), cursor, version)
}

/// `batch` decoded, if it is the batch the caller of `execute` decoded (the same bytes, not a
/// copy: a step released later carries another).
fn decoded_here<'a, 'b>(current: Option<(&Bytes, &'a EventBatch<'b>)>, batch: &Bytes) -> Option<&'a EventBatch<'b>> {
    current.filter(|(bytes, _)| bytes.as_ptr() == batch.as_ptr() && bytes.len() == batch.len()).map(|(_, d)| d)
}

/// Imports a pod's snapshot record on the import pool (rayon's: one thread per core), so that
/// the pods of one worker's streams come back on every core, and the worker goes on with its
/// other streams meanwhile. The receiver hears when it is done.
fn start_import(state: &Arc<ServiceState>, record: StreamRecord) -> Importing {
    let (tx, done) = std::sync::mpsc::channel();
    let cursor = record.cursor;
    let state = state.clone();
    rayon::spawn(move || {
        let pod = record.pod().to_string();
        // An import never panics; if it did, the pool must not take the process down: the pod
        // is cleared instead (it under-reports until its blocks come again).
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| restore_pod(&state, record))).is_err() {
            state.index().clear_pod(&pod);
            tracing::error!(pod = %pod, "snapshot record import failed: pod cleared");
        }
        let _ = tx.send(());
    });
    Importing { cursor, done }
}

/// Imports a pod's snapshot record into the index (its stream has just proven continuity).
fn restore_pod(state: &ServiceState, record: StreamRecord) {
    let (pod, cursor) = (record.pod().to_string(), record.cursor);
    let report = state.index().import_pod(&record.into_export());
    counter!(m::SNAPSHOT_RESTORES, "outcome" => "imported").increment(1);
    tracing::info!(
        pod = %pod,
        cursor,
        blocks = report.blocks,
        refused = report.refused,
        "snapshot record restored: the stream continued from its cursor"
    );
}

fn transition(state: &ServiceState, pod: &str, from: SourceState, to: SourceState, reason: Reason) {
    state.status().transition(pod, from, to);
    if matches!(to, SourceState::Degraded | SourceState::Stale) {
        // A prediction about a pod whose events cannot be trusted would outlive what the index
        // knows of it.
        state.end_speculation(pod, "source_not_exact");
    }
    counter!(m::TRANSITIONS, "from" => from.label(), "to" => to.label(), "reason" => reason.label()).increment(1);
    match to {
        SourceState::Degraded | SourceState::Stale => {
            tracing::warn!(pod, from = from.label(), to = to.label(), reason = reason.label(), "source state")
        }
        _ => tracing::info!(pod, from = from.label(), to = to.label(), reason = reason.label(), "source state"),
    }
}

fn decode_error(reason: &'static str, what: &'static str) {
    counter!(m::DECODE_ERRORS, "reason" => reason).increment(1);
    tracing::debug!(reason, what, "message not decoded");
}

fn record_event_to_visible(ts: f64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let lat = now - ts;
    // Captured or replayed batches carry old timestamps; only live, plausible ones count.
    if (0.0..60.0).contains(&lat) {
        histogram!(m::EVENT_TO_VISIBLE).record(lat);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};
    use kvindex_zmtp::Budget;

    use super::*;
    use crate::config::Config;
    use crate::snapshot::pool;
    use crate::transport::Peer;

    const MODEL: &str = "m";

    /// A vLLM `BlockStored` in the map form (the wire decoder's vectors cover the forms; this
    /// test is about the worker's scheduling).
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

    fn tokens(pod: usize, seq: u64) -> Vec<u32> {
        (0..16).map(|t| pod as u32 * 100_000 + seq as u32 * 16 + t).collect()
    }

    fn hash(pod: usize, seq: u64) -> u64 {
        1_000 * (pod as u64 + 1) + seq
    }

    /// Pod `pod`'s live batch `seq`: one block continuing the block of `seq - 1`.
    fn live(pods: &[String], pod: usize, seq: u64) -> Work {
        let event = Stored {
            ty: "BlockStored",
            block_hashes: vec![hash(pod, seq)],
            parent_block_hash: seq.checked_sub(1).map(|s| hash(pod, s)),
            token_ids: tokens(pod, seq),
            block_size: 16,
            lora_id: None,
            medium: "GPU",
        };
        let payload = rmp_serde::to_vec_named(&(1.0f64, vec![event], 0i64)).unwrap();
        Work::Live {
            origin: Origin::Central,
            conn: ConnId(pod as u64 + 1),
            peer: Arc::new(Peer::Tcp(format!("127.0.0.{}:5557", pod + 1).parse().unwrap())),
            frames: vec![
                Bytes::from(format!("kv@{}@{MODEL}", pods[pod])),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                Bytes::from(payload),
            ],
            lease: Budget::new(1 << 20).lease(),
            at: Instant::now(),
        }
    }

    /// Blocks of pod `pod`'s chain (batches 0 and 1) the index credits it.
    fn matched(state: &ServiceState, pods: &[String], pod: usize) -> u32 {
        let tokens: Vec<u32> = [tokens(pod, 0), tokens(pod, 1)].concat();
        let query = ScoreQuery { model: MODEL, lora_name: None, cache_salt: None, token_ids: &tokens, pods: None };
        let score = state.index().score(&query);
        let id = state.index().pods().get(&pods[pod]);
        score.matches.iter().find(|m| Some(m.pod) == id).map_or(0, |m| m.matched_blocks)
    }

    /// A worker on a service state of its own, and one pod more than the snapshot pool has
    /// threads (that one is not exported while they are busy), each with batch 0 applied.
    fn worker_with_pods() -> (tokio::runtime::Runtime, Arc<ServiceState>, Worker, Vec<String>) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let entered = runtime.enter();
        let config = Config::from_args(["--block-size", "16"]).unwrap();
        let (queues, _receivers) = Queues::new(1, 64);
        let index = KvIndex::new(KvIndexConfig { block_size: 16, ..Default::default() });
        let state = Arc::new(ServiceState::new(config, index, queues));
        let mut worker = Worker::new(state.clone(), 0);
        let pods: Vec<String> = (0..=pool::threads()).map(|i| format!("10.0.0.{}:8000", i + 1)).collect();
        for pod in 0..pods.len() {
            worker.handle(live(&pods, pod, 0));
            assert_eq!(matched(&state, &pods, pod), 1);
        }
        drop(entered);
        (runtime, state, worker, pods)
    }

    /// Holds every snapshot pool thread at a gate until the returned senders are dropped: the
    /// exports a capture hands out cannot run meanwhile.
    fn close_the_pool() -> Vec<mpsc::Sender<()>> {
        let (started_tx, started) = mpsc::channel();
        let gates: Vec<mpsc::Sender<()>> = (0..pool::threads())
            .map(|_| {
                let (gate, wait) = mpsc::channel::<()>();
                let started_tx = started_tx.clone();
                pool::pool().spawn(move || {
                    started_tx.send(()).unwrap();
                    let _ = wait.recv();
                });
                gate
            })
            .collect();
        for _ in 0..gates.len() {
            started.recv_timeout(Duration::from_secs(10)).expect("every pool thread reaches its gate");
        }
        gates
    }

    /// The pods out for export.
    fn exporting(worker: &Worker, pods: &[String]) -> Vec<usize> {
        (0..pods.len())
            .filter(|&p| worker.streams.values().any(|st| *st.pod == *pods[p] && st.exporting.is_some()))
            .collect()
    }

    #[test]
    fn a_snapshot_holds_back_only_the_pods_it_is_exporting() {
        let (runtime, state, mut worker, pods) = worker_with_pods();
        let _entered = runtime.enter();
        let threads = pool::threads();
        let gates = close_the_pool();
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        worker.handle(Work::Snapshot { held: Arc::new(HeldMap::new()), reply });
        let exporting = exporting(&worker, &pods);
        assert_eq!(exporting.len(), threads, "one pod per pool thread is out for export, no more");

        // Batch 1 of every pod, while the exports wait.
        for pod in 0..pods.len() {
            worker.handle(live(&pods, pod, 1));
        }
        for pod in 0..pods.len() {
            let st = worker.streams.values().find(|st| *st.pod == *pods[pod]).unwrap();
            if exporting.contains(&pod) {
                assert_eq!(matched(&state, &pods, pod), 1, "a pod being exported waits for its export");
                assert_eq!(st.applied_seq(), Some(0), "its status says what is applied");
            } else {
                assert_eq!(matched(&state, &pods, pod), 2, "the worker goes on with the other pods");
                assert_eq!(st.applied_seq(), Some(1));
            }
        }
        assert!(answer.try_recv().is_err(), "the snapshot is not answered before its exports");

        drop(gates);
        let deadline = Instant::now() + Duration::from_secs(20);
        let captured = loop {
            worker.advance_capture();
            match answer.try_recv() {
                Ok(captured) => break captured,
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                    assert!(Instant::now() < deadline, "the snapshot was never answered");
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => panic!("the capture dropped its answer: {e}"),
            }
        };
        for pod in 0..pods.len() {
            assert_eq!(matched(&state, &pods, pod), 2, "held-back batches apply once the export is done");
        }
        // Each record is its pod at its cursor: the exported ones before batch 1, the other after.
        assert_eq!(captured.len(), pods.len());
        for c in captured {
            let Captured::Fresh { record, .. } = c else { panic!("nothing was stored: every stream is fresh") };
            let pod = pods.iter().position(|p| **p == *record.pod()).unwrap();
            let cursor = if exporting.contains(&pod) { 0 } else { 1 };
            assert_eq!(record.cursor, cursor);
            assert_eq!(record.residencies(), cursor + 1, "the record holds exactly the blocks up to its cursor");
        }
    }

    #[test]
    fn a_pod_held_back_too_long_makes_the_worker_wait_for_its_export() {
        let (runtime, state, mut worker, pods) = worker_with_pods();
        let _entered = runtime.enter();
        let gates = close_the_pool();
        let (reply, _answer) = tokio::sync::oneshot::channel();
        worker.handle(Work::Snapshot { held: Arc::new(HeldMap::new()), reply });
        let held = exporting(&worker, &pods)[0];
        let stream = |w: &Worker| {
            w.streams
                .values()
                .find(|st| *st.pod == *pods[held])
                .map(|st| (st.exporting, st.waiting.len(), st.applied_seq()))
                .unwrap()
        };
        for seq in 1..MAX_HELD_BACK as u64 {
            worker.handle(live(&pods, held, seq));
        }
        assert_eq!(stream(&worker), (Some(0), MAX_HELD_BACK - 1, Some(0)), "held back, up to the bound");
        // The pool may run again; the batch that reaches the bound waits for the pod's export.
        drop(gates);
        worker.handle(live(&pods, held, MAX_HELD_BACK as u64));
        assert_eq!(
            stream(&worker),
            (None, 0, Some(MAX_HELD_BACK as u64)),
            "the export is done and every batch applied"
        );
        assert_eq!(matched(&state, &pods, held), 2);
    }
}
