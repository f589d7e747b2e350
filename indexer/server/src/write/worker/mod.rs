//! Apply workers: each owns a set of streams (sharded by topic or pod) in its
//! [`StreamTable`], which admits, names and sequences their messages; the worker carries out
//! the table's effects on the index, the metrics and the logs (`execute`), and holds a
//! stream's steps back while its pod is imported or exported for a snapshot
//! (`capture`, `import`). One stream is only ever touched by its worker, so a
//! pod's batches apply in seq order. Workers are threads; they take [`Work`] from their
//! [`Queues`]. `kvindex replay` drives the same table offline (`crate::persist::dump::offline`).

pub mod capture;
pub mod context;
mod execute;
mod foreign;
mod held;
pub mod import;
mod lag;
pub(crate) mod live;
mod report;
mod staleness;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvindex::wire::EventBatch;
use metrics::{counter, Counter};

use kvindex::sequencer::Step;
use kvindex::SkipReason;

use crate::index_handle::Upkeep;
use crate::protocols::{LiveSocket, ReplayItem, StreamKey, Work};
use crate::queue::Receiver;
use crate::telemetry as m;
use crate::write::table::{Batch, Effect, LiveMessage, PerPodSync, ReplayEvent, Stream, StreamTable};
use crate::write::transport::{escape, escape_bytes, ConnId, Peer};
use crate::write::worker::capture::Capture;
use crate::write::worker::context::WorkerContext;
use live::{Live, ServiceFleet};

const TICK: Duration = Duration::from_millis(100);
/// How often a worker looks for finished imports while any is running.
const IMPORT_POLL: Duration = Duration::from_millis(2);

pub struct Worker {
    pub(crate) context: Arc<WorkerContext>,
    index: usize,
    pub(crate) table: StreamTable<Live>,
    deferred: VecDeque<Work>,
    /// The table's effects, carried out as they come (kept to reuse its room).
    effects: Vec<Effect<Live>>,
    blocks_stored: Counter,
    blocks_removed: Counter,
    skipped: Vec<Counter>,
    unweighted_tier_blocks: Counter,
    block_size_changes: Counter,
    live_msgs: Counter,
    replay_msgs: Counter,
    duplicates: Counter,
    refused: u64,
    /// Streams whose snapshot record is being imported.
    pub(crate) imports: usize,
    /// The snapshot this worker is capturing, if one is.
    pub(crate) capture: Option<Capture>,
    /// Worker 0 runs the shared data's upkeep on its tick.
    upkeep: Option<Upkeep>,
}

/// What a live message's effects may name besides the table's own data.
#[derive(Clone, Copy, Default)]
struct Context<'a> {
    topic: &'a [u8],
    peer: Option<&'a Peer>,
    /// The message's payload, decoded once by the table: every `Apply` of its steps is it.
    decoded: Option<&'a EventBatch<'a>>,
}

impl Worker {
    pub fn new(context: Arc<WorkerContext>, index: usize) -> Self {
        Worker {
            index,
            table: StreamTable::sharing(context.settings().table.clone(), context.pod_owners()),
            deferred: VecDeque::new(),
            effects: Vec::new(),
            blocks_stored: counter!(m::BLOCKS, "op" => "stored"),
            blocks_removed: counter!(m::BLOCKS, "op" => "removed"),
            skipped: SkipReason::ALL.iter().map(|r| counter!(m::SKIPPED, "reason" => r.label())).collect(),
            unweighted_tier_blocks: counter!(m::UNWEIGHTED_TIER_BLOCKS),
            block_size_changes: counter!(m::BLOCK_SIZE_CHANGES),
            live_msgs: counter!(m::MESSAGES, "socket" => "SUB"),
            replay_msgs: counter!(m::MESSAGES, "socket" => "DEALER"),
            duplicates: counter!(m::DUPLICATES),
            refused: 0,
            imports: 0,
            capture: None,
            upkeep: (index == 0).then(Upkeep::default),
            context,
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

    pub(crate) fn handle(&mut self, work: Work) {
        match work {
            Work::Live { origin, conn, peer, frames, lease, at } => {
                self.live(origin, conn, &peer, frames, at);
                drop(lease); // the socket may read again
            }
            Work::Replay { stream, id, item } => self.replay(stream, id, item),
            Work::InitialSync { stream, model, endpoint, startup } => {
                let context = self.context.clone();
                let mut effects = std::mem::take(&mut self.effects);
                let mut new =
                    |k: &StreamKey, p: &Arc<str>, m: &Arc<str>, mode| live::new_stream(&context, k, p, m, mode);
                let now = context.now_ms();
                let pod = PerPodSync { key: &stream, model: &model, endpoint: &endpoint };
                self.table.initial_sync(&ServiceFleet(&context), pod, now, &mut new, &mut effects);
                if startup {
                    let sync = effects.iter().find_map(|e| match e {
                        Effect::Steps { steps, .. } => steps.iter().find_map(|s| match s {
                            Step::RequestReplay { id, .. } => Some(*id),
                            _ => None,
                        }),
                        _ => None,
                    });
                    if let Some(st) = self.table.get_mut(&stream) {
                        st.ext.startup_sync = sync;
                    }
                    if sync.is_none() {
                        context.readiness().sync_finished();
                    }
                }
                self.carry_out(&mut effects, Context::default());
                self.effects = effects;
            }
            Work::Connected { origin, conn, peer } => {
                let context = self.context.clone();
                let mut effects = std::mem::take(&mut self.effects);
                let fleet = ServiceFleet(&context);
                self.table.connected(&fleet, &origin, conn, Some(&peer), context.now_ms(), &mut effects);
                self.carry_out(&mut effects, Context::default());
                self.effects = effects;
            }
            Work::Disconnected { origin, conn } => {
                let context = self.context.clone();
                let mut effects = std::mem::take(&mut self.effects);
                self.table.disconnect(&ServiceFleet(&context), &origin, conn, context.now_ms(), &mut effects);
                self.carry_out(&mut effects, Context::default());
                self.effects = effects;
                if let Some(recorder) = self.context.recorder() {
                    let (pod, model, source) = recorded_origin(&origin);
                    recorder.record("disconnect", pod, model, source, Some(conn.0), &[]);
                }
            }
            Work::RemovePod { pod, done } => {
                let keys = self.table.keys_of(&pod);
                let mut any = !keys.is_empty();
                for k in keys {
                    any |= self.drop_stream(&k, "removed");
                }
                any |= self.context.index().remove_pod(&pod);
                self.context.end_speculation(&pod, "removed");
                let _ = done.send(any);
            }
            Work::Snapshot { held, sink, reply } => self.start_capture(held, sink, reply),
            Work::Stop => {}
        }
    }

    /// Forgets `key`'s stream and everything its pod holds. Returns whether the index held
    /// anything of it.
    fn drop_stream(&mut self, key: &StreamKey, why: &'static str) -> bool {
        // Its export (a snapshot's) must not land after the pod is gone either.
        self.wait_export(key);
        let Some(st) = self.table.remove(key) else { return false };
        self.forget(key, st, why)
    }

    /// Forgets what a stream taken out of the table held: its import, its readiness share, its
    /// status row, its pod in the index, its pod's speculative credits.
    fn forget(&mut self, key: &StreamKey, st: Stream<Live>, why: &'static str) -> bool {
        if let Some(import) = &st.ext.importing {
            // The import must not land after the pod is gone.
            let _ = import.done.recv();
            self.imports -= 1;
        }
        if st.ext.startup_sync.is_some() {
            self.context.readiness().sync_finished();
        }
        self.context.status().remove(key, &st.pod, st.seq.state());
        let held = self.context.index().remove_pod(&st.pod);
        self.context.end_speculation(&st.pod, why);
        held
    }

    fn live(&mut self, origin: LiveSocket, conn: ConnId, peer: &Peer, frames: Vec<Bytes>, at: Instant) {
        self.live_msgs.increment(1);
        if let Some(recorder) = self.context.recorder() {
            let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
            let (pod, model, source) = recorded_origin(&origin);
            recorder.record("live", pod, model, source, Some(conn.0), &refs);
        }
        let context = self.context.clone();
        let mut effects = std::mem::take(&mut self.effects);
        let mut new = |k: &StreamKey, p: &Arc<str>, m: &Arc<str>, mode| live::new_stream(&context, k, p, m, mode);
        let now = context.now_ms();
        let fleet = ServiceFleet(&context);
        let msg =
            LiveMessage { origin: &origin, conn: Some(conn), peer: Some(peer), frames: &frames, received: Some(at) };
        let decoded = self.table.admit(&fleet, msg, now, &mut new, &mut effects);
        let topic = frames.first().map_or(&[][..], |f| f.as_ref());
        self.carry_out(&mut effects, Context { topic, peer: Some(peer), decoded: decoded.as_ref() });
        self.effects = effects;
    }

    fn replay(&mut self, key: StreamKey, id: u64, item: ReplayItem) {
        let Some(st) = self.table.get(&key) else { return };
        if let (Some(recorder), ReplayItem::Message { seq, payload, .. }) = (self.context.recorder(), &item) {
            // The replay reply as a DEALER sees it (vLLM 0.26+ layout, topic left empty).
            let seq = seq.to_be_bytes();
            recorder.record("replay", Some(&key.base), Some(&st.model), None, None, &[b"", b"", &seq, payload]);
        }
        let event = match item {
            ReplayItem::Message { seq, payload, lease: _taken } => {
                self.replay_msgs.increment(1);
                ReplayEvent::Message { seq, payload }
            }
            ReplayItem::Begun => ReplayEvent::Begun,
            ReplayItem::End => ReplayEvent::End,
            ReplayItem::Failed { timeout } => ReplayEvent::Failed { timeout },
        };
        let mut effects = std::mem::take(&mut self.effects);
        self.table.replay(&key, id, event, self.context.now_ms(), &mut effects);
        self.carry_out(&mut effects, Context::default());
        self.effects = effects;
    }

    /// Carries out the table's effects, in order.
    fn carry_out(&mut self, effects: &mut Vec<Effect<Live>>, cx: Context<'_>) {
        for effect in effects.drain(..) {
            match effect {
                Effect::Undecodable { reason, what } => decode_error(reason, what),
                Effect::Refused { reason, why } => self.refuse_source(reason, why, cx.topic),
                Effect::Created { .. } => {}
                Effect::Reclaimed { key, stream, why } => {
                    let pod = stream.pod.clone();
                    self.forget(&key, *stream, "reclaimed");
                    counter!(m::SOURCES_RECLAIMED, "reason" => why.label()).increment(1);
                    tracing::info!(pod = %escape(&pod), reason = why.label(), "source reclaimed to make room for a new one");
                }
                Effect::ModelSwitched { key, old } => {
                    if let Some(st) = self.table.get(&key) {
                        tracing::info!(pod = %st.pod, old = %old, new = %st.model, "source switched model");
                    }
                }
                Effect::Moved { key, from, to } => {
                    if let Some(st) = self.table.get(&key) {
                        tracing::warn!(pod = %escape(&st.pod), from = %from, to = %to, "topic moved to a new source address");
                    }
                }
                Effect::Conflict { key, bound, total } => {
                    counter!(m::TOPIC_CONFLICTS).increment(1);
                    if let (true, Some(st), Some(peer)) = (total.is_power_of_two(), self.table.get(&key), cx.peer) {
                        tracing::warn!(
                            pod = %escape(&st.pod),
                            bound = %bound,
                            foreign = %peer,
                            dropped_total = total,
                            "message for a topic bound to another source address dropped"
                        );
                    }
                }
                Effect::Reconnected { key } => {
                    if let Some(st) = self.table.get(&key) {
                        tracing::info!(pod = %st.pod, "publisher reconnected: resync from seq 0");
                    }
                }
                Effect::Disconnected { key, conn } => {
                    if let Some(st) = self.table.get(&key) {
                        tracing::info!(pod = %st.pod, %conn, "publisher disconnected: pod cleared until its next connection");
                    }
                }
                Effect::Foreign { key, pod, why } => self.refuse_foreign(&key, &pod, &why, cx),
                Effect::Steps { key, mut steps } => self.execute(&key, &mut steps, cx.decoded),
            }
        }
    }

    fn tick(&mut self, lane: &Receiver) {
        let now = self.context.now_ms();
        let mut effects = std::mem::take(&mut self.effects);
        self.table.tick(&ServiceFleet(&self.context), now, &mut effects);
        self.carry_out(&mut effects, Context::default());
        self.effects = effects;
        self.publish_status(lane, now);
        // The data every worker shares keeps itself; worker 0's tick is when: the index's
        // gauges and credit sweep, the queue's depth, readiness.
        if let Some(upkeep) = self.upkeep.as_mut() {
            self.context.index_handle().upkeep(upkeep);
            self.context.queues().publish_depth();
            self.context.readiness().publish();
        }
    }
}

pub(crate) fn decode_error(reason: &'static str, what: &'static str) {
    counter!(m::DECODE_ERRORS, "reason" => reason).increment(1);
    tracing::debug!(reason, what, "message not decoded");
}

/// What a dump records of a message's origin: (pod, model, source).
fn recorded_origin(origin: &LiveSocket) -> (Option<&str>, Option<&str>, Option<&str>) {
    match origin {
        LiveSocket::Central => (None, None, Some("central")),
        LiveSocket::Pod { id, model, endpoint } => (Some(id), Some(model), Some(endpoint)),
    }
}

/// A step held back behind an import or export, or one to run now.
type Steps = Vec<Step<Batch>>;
