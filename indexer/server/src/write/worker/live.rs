//! The live worker's side of the stream table: what it keeps per stream beside the table's
//! part ([`Live`]: snapshot import/export state, steps held back behind them, metric handles),
//! and the registry as the table asks it ([`ServiceFleet`]).

use std::sync::Arc;

use kvindex::sequencer::Step;

use super::staleness::Staleness;
use crate::persist::snapshot::format::StreamRecord;
use crate::protocols::StreamKey;
use crate::readiness::HoldPart;
use crate::source_series::{SourceSeries, StreamCounters};
use crate::write::table::{Batch, Ext, Fleet, Mode, Stream};
use crate::write::worker::context::WorkerContext;
use crate::write::worker::import::Importing;

/// What the live worker keeps per stream.
pub struct Live {
    /// Its source's per-source series (events by type, gaps, the hash check), rendered while
    /// a stream of the source holds them.
    pub counters: Arc<StreamCounters>,
    /// The initial replay counts for readiness until it is done.
    pub startup_sync: Option<u64>,
    /// The pod's snapshot record, imported once the stream continues from its cursor.
    pub restore: Option<StreamRecord>,
    /// A sibling's record's part of `/readyz`'s wait: done (dropped) once the record is
    /// imported and the stream's held-back steps have run, or the record is dropped.
    pub restore_hold: Option<HoldPart>,
    /// The record, being imported on the import pool: until it is done, this stream's steps
    /// wait in `waiting`, in order, so nothing touches the pod before its record is in.
    pub importing: Option<Importing>,
    /// The pod is being exported for a snapshot at this cursor (see `write::worker::capture`):
    /// like an import, its steps wait in `waiting` until the export is done.
    pub exporting: Option<u64>,
    /// Steps held back by an import or an export, in order (a live batch's carries its
    /// receive time: the wait counts in its lag).
    pub waiting: Vec<Step<Batch>>,
    /// How far behind its engine the publisher is (its batches' `ts`, see `write::worker::staleness`).
    pub staleness: Staleness,
    /// Whether the stream is withheld from scores now (past `max_source_staleness_ms`).
    pub withheld: bool,
    /// Whether a batch of the stream stored blocks in the index (never reclaimed for holding
    /// none now, see `write::table::Reclaim::Empty`).
    pub stored_blocks: bool,
    /// The operator's rules for the pod's engine (EAGLE, context parallelism) last given to the
    /// index, with the registry generation they were read at.
    pub rules: Option<(u64, kvindex::PodRules)>,
    /// Whether the stream's refused engine block size (not a multiple of `block_size`), and a
    /// change of its block size, were logged (once per stream each).
    pub logged_block_size: (bool, bool),
}

impl Ext for Live {
    fn pinned(&self) -> bool {
        self.importing.is_some() || self.exporting.is_some()
    }

    fn stored_blocks(&self) -> bool {
        self.stored_blocks
    }
}

/// The last seq applied to the index: the sequencer's, unless its steps are held back behind
/// an import or a snapshot export, whose cursor then is what the index holds.
pub fn applied_seq(st: &Stream<Live>) -> Option<u64> {
    st.ext.exporting.or(st.ext.importing.as_ref().map(|i| i.cursor)).or(st.seq.last_seq())
}

/// A new stream's live part: its status row, its metric handles, and its pod's snapshot record
/// if one was restored for this model and rank (with its cursor, to resume from).
pub fn new_stream(
    context: &WorkerContext,
    key: &StreamKey,
    pod: &Arc<str>,
    model: &Arc<str>,
    mode: Mode,
) -> (Live, Option<u64>) {
    context.status().add(pod);
    tracing::info!(pod = %pod, model = %model, mode = mode.label(), "new source");
    // A record for another model is of no use: the pod's blocks are in another namespace; one
    // of another stream is another engine's.
    let (restore, restore_hold) = match context.restored().take(pod) {
        Some((r, hold)) if r.model() == &**model && r.rank == key.rank && r.base == *key.base => (Some(r), hold),
        _ => (None, None),
    };
    let resume_at = restore.as_ref().map(|r| r.cursor);
    let live = Live {
        counters: SourceSeries::global().stream(pod),
        startup_sync: None,
        restore,
        restore_hold,
        importing: None,
        exporting: None,
        waiting: Vec::new(),
        staleness: Staleness::default(),
        withheld: false,
        stored_blocks: false,
        rules: None,
        logged_block_size: (false, false),
    };
    (live, resume_at)
}

/// Gives the index the operator's rules for `pod` (the stream's DP-resolved pod) from the
/// registry entry of its base pod, when they may have changed: before anything of the pod is
/// applied or imported, so none of its blocks is scored under rules it was not declared with.
/// A pod nobody declared has the default rules.
pub fn sync_rules(context: &WorkerContext, base: &str, pod: &str, live: &mut Live) {
    let registry = context.registry();
    let generation = registry.generation();
    if live.rules.is_some_and(|(g, _)| g == generation) {
        return;
    }
    let rules = registry.get(base).map(|p| p.cfg.rules()).unwrap_or_default();
    drop(registry);
    if live.rules.map(|(_, r)| r) != Some(rules) {
        // Validated when the pod was registered: a refusal cannot happen, and would leave the
        // rules the index had.
        if let Err(e) = context.index().set_pod_rules(pod, rules) {
            tracing::error!(pod, error = %e, "pod rules not applied");
        }
    }
    live.rules = Some((generation, rules));
}

/// The registry and the central SUB, as the stream table asks them.
pub struct ServiceFleet<'a>(pub &'a WorkerContext);

impl Fleet for ServiceFleet<'_> {
    fn generation(&self) -> u64 {
        self.0.registry().generation()
    }

    fn pod_for_topic(&self, id: &str) -> String {
        self.0.registry().pod_for_topic(id).to_string()
    }

    fn has_replay(&self, base: &str, rank: u32) -> bool {
        self.0.registry().replay_endpoint(base, rank).is_some()
    }

    fn configured(&self, base: &str) -> bool {
        self.0.registry().origin_of(base).is_some()
    }

    fn holds_blocks(&self, pod: &str) -> bool {
        self.0.index().pod_stats(pod).is_some_and(|s| s.blocks > 0)
    }

    fn pod_of_registration(&self, pod: &str) -> Option<(String, bool)> {
        self.0.registry().pod_of_rank_id(pod)
    }

    fn source_connected(&self, source: &kvindex_zmtp::Source) -> bool {
        self.0.central_source_connected(source)
    }

    fn engine(&self, base: &str) -> kvindex::wire::Engine {
        self.0.registry().engine_of(base).unwrap_or(self.0.settings().default_engine)
    }

    fn page_size(&self, base: &str) -> Option<usize> {
        self.0.registry().get(base).and_then(|p| p.cfg.page_size).map(|p| p as usize)
    }

    fn sglang_check(&self, base: &str) -> Option<crate::config::SglangCheckConfig> {
        let defaults = self.0.settings().sglang_check;
        let reg = self.0.registry();
        let pod = reg.get(base).map(|p| &p.cfg);
        Some(crate::config::SglangCheckConfig {
            release: pod.and_then(|p| p.sglang_release).unwrap_or(defaults.release),
            format: pod.and_then(|p| p.sglang_event_format).unwrap_or(defaults.format),
            every: defaults.every,
        })
    }
}
