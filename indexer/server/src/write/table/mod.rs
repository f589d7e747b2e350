//! The stream table: every stream of one apply worker (or of `kvindex replay`), from a
//! message's frames to the steps its sequencer asks for. Admission (the topic filter, name
//! bounds, the table's caps and reclaiming, central-mode source binding, one owner per pod id:
//! [`PodOwners`]), naming (topic → pod, DP rank → pod id), connection tracking (`connections`:
//! a new connection catches up or resyncs, a closed one clears) and sequencing happen here,
//! once, and come out as typed [`Effect`]s in order. The live worker (`write::worker`) and the offline
//! replay (`persist::dump::offline`) are two drivers of this table: they carry the effects out on their
//! index (and metrics, logs, snapshots), and cannot drift apart.
//!
//! A live payload is decoded once, here: [`StreamTable::admit`] returns the decoded batch, and
//! an `Apply` in the steps it emits is always that batch (the sequencer applies a live batch in
//! the call that brings it, or holds it; what it held comes out of later calls, decoded then).
//! Decoding is per engine: each stream's payloads are decoded by its source's engine family
//! ([`Fleet::engine`], [`batch::decode`]).
//!
//! Nothing here reads a clock, a socket or a metric: the driver passes `now` and the
//! [`Fleet`] (what the registry knows), which makes the table testable and replayable.

mod batch;
mod connections;
mod engine_rules;
mod fleet;
mod naming;
mod owners;
mod sglang_check;
mod stream;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use kvindex::sequencer::{Item, Sequencer, SequencerConfig, Step};
use kvindex::wire::{self, EventBatch};

pub use batch::{decode, Batch};
pub use engine_rules::{EngineRules, RulesReport, SGLANG_DEFAULT_PAGE_SIZE};
pub use fleet::Fleet;
pub use naming::{Mode, Name, Naming, Unnamed, MAX_TOPIC_LEN};
pub use owners::{Owner, PodOwners};
pub use sglang_check::{SampledPageCheck, MISCONFIGURED_AFTER_PAGES};
pub use stream::{Binding, Ext, Reclaim, Stream, UNCONFIRMED_RECLAIM_MS};

use crate::protocols::{ConnId, LiveSocket, Peer, StreamKey};

/// The table's settings (from the service's config; `kvindex replay` uses the defaults).
#[derive(Debug, Clone)]
pub struct TableConfig {
    pub topic_filter: String,
    /// `dp_naming = "topic"`.
    pub dp_naming_topic: bool,
    /// Streams held at most (this worker's share of `max_sources`).
    pub max_streams: usize,
    /// Central-mode streams one source address may hold (its share of `max_sources_per_address`).
    pub max_streams_per_address: usize,
    /// The index's canonical block, in tokens (each stream's engine rules key to it).
    pub block_size: usize,
    /// Each new stream's sequencer (`replay` is re-read from the [`Fleet`]).
    pub sequencer: SequencerConfig,
}

/// What the [`Fleet`] says a source's streams are keyed and checked by: its engine, page size
/// and SGLang page-hash check.
type SourceRules = (kvindex::wire::Engine, Option<usize>, Option<crate::config::SglangCheckConfig>);

/// What the table's driver must do, in order.
pub enum Effect<X> {
    /// The message was dropped before reaching a stream: not one for us, or undecodable (a
    /// live payload that names its stream but cannot be decoded is still sequenced, as lost).
    Undecodable { reason: &'static str, what: &'static str },
    /// The message would have started a stream we refuse; dropped.
    Refused { reason: &'static str, why: &'static str },
    /// A stream was made: the driver made its `ext` when asked.
    Created { key: StreamKey },
    /// A stream was reclaimed to make room for another: the driver forgets what it held.
    Reclaimed { key: StreamKey, stream: Box<Stream<X>>, why: Reclaim },
    /// The stream's source now names another model.
    ModelSwitched { key: StreamKey, old: Arc<str> },
    /// Central mode: the stream's topic moved to a new source address.
    Moved { key: StreamKey, from: kvindex_zmtp::Source, to: kvindex_zmtp::Source },
    /// Central mode: a message for the stream's topic from another source, dropped.
    Conflict { key: StreamKey, bound: kvindex_zmtp::Source, total: u64 },
    /// The message would start (or feed) a stream for `pod`, which it may not feed: dropped.
    Foreign { key: StreamKey, pod: Arc<str>, why: Foreign },
    /// The stream's publisher came on a new connection: it resyncs from seq 0.
    Reconnected { key: StreamKey },
    /// The stream's connection closed: it is cleared until the next one.
    Disconnected { key: StreamKey, conn: ConnId },
    /// The stream's sequencer steps, in order.
    Steps { key: StreamKey, steps: Vec<Step<Batch>> },
}

/// Why a stream may not feed a pod.
#[derive(Debug, Clone)]
pub enum Foreign {
    /// Another stream owns the pod (`kvindex_sources_refused_total{reason="pod_owned"}`).
    Owned(Owner),
    /// The pod is one of `base`'s, which an operator or a registration configured: a dialled
    /// pod's ranks are fed by its dialers only, a central-mode one's by configured streams only
    /// (`pod_owned` too).
    Registered { base: Arc<str>, dialled: bool },
    /// A DP rank of a topic bound to another source address, which holds a connection
    /// (`kvindex_topic_conflicts_total`).
    BoundTopic(Owner),
}

impl Foreign {
    /// The refusal's reason: `pod_owned` (`kvindex_sources_refused_total`) or `topic_bound`
    /// (counted in `kvindex_topic_conflicts_total`).
    pub fn reason(&self) -> &'static str {
        match self {
            Foreign::Owned(_) | Foreign::Registered { .. } => "pod_owned",
            Foreign::BoundTopic(_) => "topic_bound",
        }
    }
}

/// Whether `key`'s stream, of `mode`, may feed `pod` as the registry stands: a registered pod's
/// rank ids are fed by its own dialers (a dialled pod) or by configured streams (a central-mode
/// pod) only.
fn may_feed(fleet: &dyn Fleet, key: &StreamKey, pod: &str, mode: Mode) -> Result<(), Foreign> {
    let Some((base, dialled)) = fleet.pod_of_registration(pod) else { return Ok(()) };
    let allowed = if dialled { mode == Mode::PerPod && *key.base == *base } else { fleet.configured(&key.base) };
    if allowed {
        Ok(())
    } else {
        Err(Foreign::Registered { base: Arc::from(base.as_str()), dialled })
    }
}

/// A replay's answer, as the table takes it.
#[derive(Debug)]
pub enum ReplayEvent {
    Begun,
    Message { seq: u64, payload: Bytes },
    End,
    Failed { timeout: bool },
}

/// Makes the driver's part of a new stream: (`ext`, a snapshot record's cursor to resume from).
pub type NewExt<'a, X> = dyn FnMut(&StreamKey, &Arc<str>, &Arc<str>, Mode) -> (X, Option<u64>) + 'a;

/// A live message as it arrived: its frames, the listener that read them (`origin`), the
/// connection it came on (none in a dump that did not record it: reconnects are then not seen),
/// its publisher's address (none: no binding) and when it was read (none: not timed).
pub struct LiveMessage<'m> {
    pub origin: &'m LiveSocket,
    pub conn: Option<ConnId>,
    pub peer: Option<&'m Peer>,
    pub frames: &'m [Bytes],
    pub received: Option<Instant>,
}

/// A dialled pod's stream to sync before any live message: its key, model and SUB endpoint.
pub struct PerPodSync<'a> {
    pub key: &'a StreamKey,
    pub model: &'a Arc<str>,
    pub endpoint: &'a Arc<str>,
}

/// A stream as a message or a sync names it, for [`StreamTable::entry`]: its key and name, a
/// central-mode stream's publisher address, and the rules its source is keyed and checked by.
struct Wanted<'a> {
    key: &'a StreamKey,
    name: &'a Name,
    source: Option<kvindex_zmtp::Source>,
    rules: SourceRules,
}

pub struct StreamTable<X> {
    streams: std::collections::HashMap<StreamKey, Stream<X>>,
    naming: Naming,
    config: TableConfig,
    owners: Arc<PodOwners>,
    /// Central-mode connections that have carried no message yet, with their source address
    /// (see `connections`): at most one entry per open connection.
    fresh: std::collections::HashMap<ConnId, kvindex_zmtp::Source>,
}

impl<X: Ext> StreamTable<X> {
    /// A table whose pods no other table names (`kvindex replay`, tests).
    pub fn new(config: TableConfig) -> StreamTable<X> {
        StreamTable::sharing(config, Arc::default())
    }

    /// A table whose pod ids are owned in `owners`, with every other table of the service.
    pub fn sharing(config: TableConfig, owners: Arc<PodOwners>) -> StreamTable<X> {
        StreamTable {
            streams: Default::default(),
            naming: Naming::new(config.topic_filter.clone(), config.dp_naming_topic),
            config,
            owners,
            fresh: Default::default(),
        }
    }

    pub fn config(&self) -> &TableConfig {
        &self.config
    }

    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    pub fn get(&self, key: &StreamKey) -> Option<&Stream<X>> {
        self.streams.get(key)
    }

    pub fn get_mut(&mut self, key: &StreamKey) -> Option<&mut Stream<X>> {
        self.streams.get_mut(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&StreamKey, &Stream<X>)> {
        self.streams.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&StreamKey, &mut Stream<X>)> {
        self.streams.iter_mut()
    }

    pub fn keys(&self) -> Vec<StreamKey> {
        self.streams.keys().cloned().collect()
    }

    /// Every stream of `pod`: its rank-0 id or a rank's own.
    pub fn keys_of(&self, pod: &str) -> Vec<StreamKey> {
        self.streams.iter().filter(|(k, s)| &*k.base == pod || &*s.pod == pod).map(|(k, _)| k.clone()).collect()
    }

    /// Takes `key`'s stream out of the table (the driver forgets what it held); its pod is free.
    pub fn remove(&mut self, key: &StreamKey) -> Option<Stream<X>> {
        let st = self.streams.remove(key)?;
        self.owners.release(&st.pod, st.claim);
        Some(st)
    }

    /// A live message ([`LiveMessage`]): named, decoded and sequenced into each of its streams'
    /// steps. Returns the payload decoded, which every `Apply` of the emitted steps is.
    pub fn admit<'f>(
        &mut self,
        fleet: &dyn Fleet,
        msg: LiveMessage<'f>,
        now: u64,
        new_ext: &mut NewExt<'_, X>,
        out: &mut Vec<Effect<X>>,
    ) -> Option<EventBatch<'f>> {
        if let Some(conn) = msg.conn {
            self.carried(conn);
        }
        let (raw, name) = self.read_live(fleet, &msg, out)?;
        // `parse_live` took three frames: the payload is the last.
        let payload = &msg.frames[2];
        let engine = fleet.engine(&name.base);
        let rules: SourceRules = (engine, fleet.page_size(&name.base), fleet.sglang_check(&name.base));
        let decoded = decode(engine, payload);
        let generation = fleet.generation();
        for rank in self.ranks_of(&decoded, &name.base, out) {
            let key = StreamKey { base: name.base.clone(), rank };
            if !self.may_feed_stream(fleet, &key, &name, msg.peer, now, out) {
                continue;
            }
            let source = msg.peer.filter(|_| name.mode == Mode::Central).map(Peer::source);
            let owners = self.owners.clone();
            let wanted = Wanted { key: &key, name: &name, source, rules };
            let Some(st) = self.entry(fleet, wanted, now, new_ext, out) else { continue };
            if name.mode == Mode::Central && !bind_publisher(st, fleet, &owners, &key, msg.peer, out) {
                continue;
            }
            follow_source(st, fleet, &key, msg.conn, generation, out);
            let mut steps = Vec::new();
            if let Some(cursor) = st.resume_at.take() {
                st.seq.resume(cursor, now, &mut steps);
            }
            if st.topic.is_none() && name.mode == Mode::Central {
                st.topic = Some(String::from_utf8_lossy(raw.topic.unwrap_or_default()).into_owned());
            }
            if st.endpoint.is_none() {
                st.endpoint = name.endpoint.clone();
            }
            let item = match decoded {
                Ok(_) => Item::Batch(Batch { bytes: payload.clone(), received: msg.received, engine }),
                Err(_) => Item::Malformed,
            };
            // A 24-byte seq frame's epoch: a new one is a new publisher process, a clear.
            st.seq.on_epoch(raw.epoch, &mut steps);
            st.seq.on_live(raw.seq, item, now, &mut steps);
            st.saw(&steps);
            out.push(Effect::Steps { key, steps });
        }
        decoded.ok()
    }

    /// A live message's frames, read, and the source they name; or the effect that says why
    /// the message goes no further.
    fn read_live<'f>(
        &mut self,
        fleet: &dyn Fleet,
        msg: &LiveMessage<'f>,
        out: &mut Vec<Effect<X>>,
    ) -> Option<(wire::RawMessage<'f>, Name)> {
        let refs: Vec<&'f [u8]> = msg.frames.iter().map(|f| f.as_ref()).collect();
        let raw = match wire::parse_live(&refs) {
            Ok(raw) => raw,
            Err(e) => {
                out.push(Effect::Undecodable { reason: e.reason(), what: "live frames" });
                return None;
            }
        };
        if raw.seq == wire::END_OF_REPLAY_SEQ {
            // The replay end marker is never a live seq.
            out.push(Effect::Undecodable { reason: "seq_end_marker", what: "live message with the end-of-replay seq" });
            return None;
        }
        let topic = raw.topic.unwrap_or_default();
        match self.naming.name(fleet, msg.origin, topic) {
            Ok(name) => Some((raw, name)),
            Err(Unnamed::Undecodable { reason, what }) => {
                out.push(Effect::Undecodable { reason, what });
                None
            }
            Err(Unnamed::Refused { reason, why }) => {
                out.push(Effect::Refused { reason, why });
                None
            }
        }
    }

    /// The DP ranks a payload is for: the one it names, or, when it cannot be decoded (its
    /// rank unknown), every stream of the source, which all take the loss.
    fn ranks_of(
        &self,
        decoded: &Result<EventBatch<'_>, wire::WireError>,
        base: &Arc<str>,
        out: &mut Vec<Effect<X>>,
    ) -> Vec<u32> {
        match decoded {
            Ok(batch) => vec![batch.data_parallel_rank.unwrap_or(0).clamp(0, i64::from(u16::MAX)) as u32],
            Err(e) => {
                out.push(Effect::Undecodable { reason: e.reason(), what: "live payload" });
                let mut ranks: Vec<u32> = self.streams.keys().filter(|k| k.base == *base).map(|k| k.rank).collect();
                if ranks.is_empty() {
                    ranks.push(0);
                }
                ranks
            }
        }
    }

    /// Whether `name`'s message may feed `key`'s stream: one of the other mode may not, and a
    /// new one must find its topic unbound elsewhere and room in the table (per address, then
    /// in all, reclaiming a stream if one may go). A refusal is pushed to `out`.
    fn may_feed_stream(
        &mut self,
        fleet: &dyn Fleet,
        key: &StreamKey,
        name: &Name,
        peer: Option<&Peer>,
        now: u64,
        out: &mut Vec<Effect<X>>,
    ) -> bool {
        if let Some(st) = self.streams.get(key).filter(|st| st.mode != name.mode) {
            // A dialled pod's stream is fed by its dialer only, a topic's by the SUB only.
            self.refuse_other_mode(key, st, out);
            return false;
        }
        if self.streams.contains_key(key) {
            return true;
        }
        if let (Mode::Central, Some(source)) = (name.mode, peer.map(Peer::source)) {
            // A bound topic binds all its ranks: another address cannot start one.
            let connected = |s: &kvindex_zmtp::Source| fleet.source_connected(s);
            if let Some(owner) = self.owners.bound_elsewhere(&key.base, source, connected) {
                let pod = self.naming.pod_id(name.mode, key);
                out.push(Effect::Foreign { key: key.clone(), pod, why: Foreign::BoundTopic(owner) });
                return false;
            }
        }
        if name.mode == Mode::Central {
            // One address cannot take the table: its streams are capped.
            let source = peer.map(Peer::source);
            if source.is_some()
                && self.streams.values().filter(|st| st.bound == source).count() >= self.config.max_streams_per_address
            {
                out.push(Effect::Refused { reason: "max_sources_per_address", why: "max_sources_per_address reached" });
                return false;
            }
        }
        if self.streams.len() >= self.config.max_streams && !self.reclaim_one(fleet, now, out) {
            out.push(Effect::Refused { reason: "max_sources", why: "max_sources reached" });
            return false;
        }
        true
    }

    /// The `wanted` stream, made if new and its pod id is free for it (the driver makes its
    /// part), its model switched if the source now names another.
    fn entry(
        &mut self,
        fleet: &dyn Fleet,
        wanted: Wanted<'_>,
        now: u64,
        new_ext: &mut NewExt<'_, X>,
        out: &mut Vec<Effect<X>>,
    ) -> Option<&mut Stream<X>> {
        let Wanted { key, name, source, rules: (engine, page_size, check) } = wanted;
        if !self.streams.contains_key(key) {
            let pod = self.naming.pod_id(name.mode, key);
            let claim = match self.claim(fleet, key, &pod, name.mode, source) {
                Ok(claim) => claim,
                Err(why) => {
                    out.push(Effect::Foreign { key: key.clone(), pod, why });
                    return None;
                }
            };
            let (ext, resume_at) = new_ext(key, &pod, &name.model, name.mode);
            let seq = Sequencer::new(self.config.sequencer.clone());
            self.streams.insert(
                key.clone(),
                Stream {
                    seq,
                    pod,
                    model: name.model.clone(),
                    mode: name.mode,
                    topic: None,
                    endpoint: None,
                    registry_generation: u64::MAX,
                    conn: None,
                    resume_at,
                    bound: None,
                    claim,
                    conflicts: 0,
                    created_at: now,
                    confirmed: false,
                    rules: EngineRules::new(engine, page_size, check, self.config.block_size),
                    ext,
                },
            );
            out.push(Effect::Created { key: key.clone() });
        }
        let st = self.streams.get_mut(key)?;
        if !st.rules.is_for(engine, page_size) {
            st.rules = EngineRules::new(engine, page_size, check, self.config.block_size);
        } else {
            st.rules.follow_check(check);
        }
        if st.model != name.model {
            let old = std::mem::replace(&mut st.model, name.model.clone());
            out.push(Effect::ModelSwitched { key: key.clone(), old });
        }
        Some(st)
    }

    /// `pod` for `key`'s new stream: the claim to keep, or why it may not feed the pod.
    fn claim(
        &self,
        fleet: &dyn Fleet,
        key: &StreamKey,
        pod: &Arc<str>,
        mode: Mode,
        source: Option<kvindex_zmtp::Source>,
    ) -> Result<u64, Foreign> {
        may_feed(fleet, key, pod, mode)?;
        self.owners.claim(pod, key, mode, source).map_err(Foreign::Owned)
    }

    /// Another mode's message for `key`'s stream `st`: refused, and `st`'s pod contested.
    fn refuse_other_mode(&self, key: &StreamKey, st: &Stream<X>, out: &mut Vec<Effect<X>>) {
        let owner = self.owners.contest(&st.pod).unwrap_or_else(|| Owner {
            claim: st.claim,
            key: key.clone(),
            mode: st.mode,
            source: st.bound,
        });
        out.push(Effect::Foreign { key: key.clone(), pod: st.pod.clone(), why: Foreign::Owned(owner) });
    }

    /// Makes room in a full table: reclaims the longest-silent stream that may go
    /// ([`Stream::reclaimable`]), never-confirmed ones first. False when none may.
    fn reclaim_one(&mut self, fleet: &dyn Fleet, now: u64, out: &mut Vec<Effect<X>>) -> bool {
        let stale = self.config.sequencer.stale_after_ms;
        let pick = self
            .streams
            .iter()
            .filter_map(|(k, st)| st.reclaimable(fleet, k, now, stale).map(|(why, last)| (why, last, k)))
            .min_by_key(|(why, last, _)| (*why, *last))
            .map(|(why, _, k)| (k.clone(), why));
        let Some((key, why)) = pick else { return false };
        let Some(stream) = self.remove(&key) else { return false };
        out.push(Effect::Reclaimed { key, stream: Box::new(stream), why });
        true
    }

    /// Gives up the contested pods of this table whose streams may go: their publisher's
    /// connection closed and they may be reclaimed ([`Stream::reclaimable`]), or a registration
    /// made since keeps their pod for its own streams.
    fn yield_contested(&mut self, fleet: &dyn Fleet, now: u64, out: &mut Vec<Effect<X>>) {
        let stale = self.config.sequencer.stale_after_ms;
        for (key, claim) in self.owners.contested() {
            let Some(st) = self.streams.get(&key).filter(|st| st.claim == claim) else { continue };
            // Silent as reclaiming counts it: a closed connection cleared the pod, so holding no
            // block (`Empty`) says nothing of whether its engine is coming back.
            let departed = st.conn.is_none()
                && st.reclaimable(fleet, &key, now, stale).is_some_and(|(why, _)| why != Reclaim::Empty);
            if !departed && may_feed(fleet, &key, &st.pod, st.mode).is_ok() {
                continue;
            }
            if let Some(stream) = self.remove(&key) {
                out.push(Effect::Reclaimed { key, stream: Box::new(stream), why: Reclaim::Contested });
            }
        }
    }

    /// A per-pod source with a replay socket, before any live message: a replay from 0 (or
    /// from a snapshot record's cursor), so the index is complete before the service is ready.
    pub fn initial_sync(
        &mut self,
        fleet: &dyn Fleet,
        pod: PerPodSync<'_>,
        now: u64,
        new_ext: &mut NewExt<'_, X>,
        out: &mut Vec<Effect<X>>,
    ) {
        let PerPodSync { key, model, endpoint } = pod;
        let name = Name { base: key.base.clone(), model: model.clone(), mode: Mode::PerPod, endpoint: None };
        if let Some(st) = self.streams.get(key).filter(|st| st.mode != Mode::PerPod) {
            self.refuse_other_mode(key, st, out);
            return;
        }
        let replay = fleet.has_replay(&key.base, key.rank);
        let rules = (fleet.engine(&key.base), fleet.page_size(&key.base), fleet.sglang_check(&key.base));
        let Some(st) = self.entry(fleet, Wanted { key, name: &name, source: None, rules }, now, new_ext, out) else {
            return;
        };
        st.endpoint = Some(endpoint.clone());
        st.seq.set_replay(replay);
        let mut steps = Vec::new();
        match st.resume_at.take() {
            Some(cursor) => st.seq.resume(cursor, now, &mut steps),
            None => st.seq.start_initial_sync(now, &mut steps),
        }
        st.saw(&steps);
        out.push(Effect::Steps { key: key.clone(), steps });
    }

    /// A replay's answer for `key`'s stream (none: the stream is gone, nothing to do). A
    /// message is decoded to learn whether it is one; it applies decoded again (a replayed
    /// batch is usually held before it applies).
    pub fn replay(&mut self, key: &StreamKey, id: u64, event: ReplayEvent, now: u64, out: &mut Vec<Effect<X>>) {
        let Some(st) = self.streams.get_mut(key) else { return };
        let mut steps = Vec::new();
        match event {
            ReplayEvent::Message { seq, payload } => {
                let engine = st.rules.engine();
                let item = match decode(engine, &payload) {
                    // Received live already and held: it is visible only now, so its wait
                    // counts from that receive.
                    Ok(_) => Item::Batch(Batch {
                        received: st.seq.held_at(seq).and_then(|b| b.received),
                        bytes: payload,
                        engine,
                    }),
                    Err(e) => {
                        out.push(Effect::Undecodable { reason: e.reason(), what: "replay payload" });
                        Item::Malformed
                    }
                };
                st.seq.on_replay_message(id, seq, item, now, &mut steps);
            }
            ReplayEvent::Begun => st.seq.on_replay_begun(id, now),
            ReplayEvent::End => st.seq.on_replay_end(id, now, &mut steps),
            ReplayEvent::Failed { timeout } => st.seq.on_replay_failed(id, timeout, now, &mut steps),
        }
        st.saw(&steps);
        out.push(Effect::Steps { key: key.clone(), steps });
    }

    /// The clock moved: replay timeouts, staleness, contested pods given up.
    pub fn tick(&mut self, fleet: &dyn Fleet, now: u64, out: &mut Vec<Effect<X>>) {
        self.yield_contested(fleet, now, out);
        for (key, st) in &mut self.streams {
            let mut steps = Vec::new();
            st.seq.on_tick(now, &mut steps);
            if !steps.is_empty() {
                st.saw(&steps);
                out.push(Effect::Steps { key: key.clone(), steps });
            }
        }
    }
}

/// A central-mode stream's publisher address, bound to `peer` (or moved to it, or refused as a
/// conflict). False: the message goes no further.
fn bind_publisher<X: Ext>(
    st: &mut Stream<X>,
    fleet: &dyn Fleet,
    owners: &PodOwners,
    key: &StreamKey,
    peer: Option<&Peer>,
    out: &mut Vec<Effect<X>>,
) -> bool {
    let Some(peer) = peer else { return true };
    match st.bind_source(fleet, peer) {
        Binding::Kept => {}
        Binding::Moved { from, to } => {
            owners.rebind(&st.pod, st.claim, to);
            out.push(Effect::Moved { key: key.clone(), from, to })
        }
        Binding::Conflict { bound, total } => {
            out.push(Effect::Conflict { key: key.clone(), bound, total });
            return false;
        }
    }
    true
}

/// What the stream follows of its source before a message is sequenced: the connection it came
/// on (another one is a reconnect) and, after a registration changed, its replay endpoint.
fn follow_source<X: Ext>(
    st: &mut Stream<X>,
    fleet: &dyn Fleet,
    key: &StreamKey,
    conn: Option<ConnId>,
    generation: u64,
    out: &mut Vec<Effect<X>>,
) {
    if let Some(conn) = conn {
        if st.conn != Some(conn) {
            if st.conn.is_some() {
                out.push(Effect::Reconnected { key: key.clone() });
                st.seq.on_reconnect();
            }
            st.conn = Some(conn);
        }
    }
    if st.registry_generation != generation {
        // A registration changed: is there a replay endpoint for this stream now?
        st.seq.set_replay(fleet.has_replay(&key.base, key.rank));
        st.registry_generation = generation;
    }
}
