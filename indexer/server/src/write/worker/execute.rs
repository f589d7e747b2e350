//! Carrying out a stream's sequencer steps on the index, in order: apply a batch (decoded once
//! where the table decoded it), clear the pod, start a replay, count and log the rest. A
//! stream whose pod is being imported or exported for a snapshot holds its steps back until
//! that is done (bounded: past [`MAX_HELD_BACK`] the worker waits for the export).

use std::time::{SystemTime, UNIX_EPOCH};

use metrics::{counter, histogram};

use kvindex::sequencer::{Reason, ReplayOutcome, SourceState, Step};
use kvindex::wire::EventBatch;

use super::staleness::Arrival;
use super::{Steps, Worker};
use crate::index_handle::IndexHandle;
use crate::protocols::{ReplayItem, StreamKey, Work};
use crate::source_series::add;
use crate::telemetry as m;
use crate::write::table::{Batch, RulesReport};
use crate::write::worker::import::start_import;

/// Steps a stream may hold back behind its pod's snapshot export before the worker waits for
/// that export: what a publisher can make us keep while a starved export runs is bounded (the
/// socket's byte lease ends when its message is taken), at the price of a pause for one pod's
/// export, the old behaviour, only when the export falls that far behind.
pub(crate) const MAX_HELD_BACK: usize = 4096;

impl Worker {
    /// Carries out the sequencer's steps for one stream, in order. `decoded` is the batch the
    /// table decoded for these steps (from `admit`): their `Apply`, if any, is it.
    pub(super) fn execute(&mut self, key: &StreamKey, steps: &mut Steps, decoded: Option<&EventBatch<'_>>) {
        let context = self.context.clone();
        for step in steps.drain(..) {
            let Some(st) = self.table.get_mut(key) else { return };
            if st.ext.importing.is_some() || st.ext.exporting.is_some() {
                st.ext.waiting.push(step);
                if st.ext.exporting.is_some() && st.ext.waiting.len() >= MAX_HELD_BACK {
                    counter!(m::SNAPSHOT_EXPORT_WAITS).increment(1);
                    self.wait_export(key);
                }
                continue;
            }
            match step {
                Step::Apply { seq, batch } => {
                    super::live::sync_rules(&context, &key.base, &st.pod, &mut st.ext);
                    if let Some(record) = st.ext.restore.take() {
                        // The stream continued from the snapshot's cursor: its residencies hold.
                        // They are imported on the import pool (every core), and this batch and
                        // the stream's next steps wait for them.
                        st.ext.importing = Some(start_import(context.index_handle(), record));
                        st.ext.waiting.push(Step::Apply { seq, batch });
                        self.imports += 1;
                        continue;
                    }
                    self.apply(key, &batch, decoded);
                }
                Step::Clear { reason } => {
                    if st.ext.restore.take().is_some() {
                        st.ext.restore_hold = None;
                        counter!(m::SNAPSHOT_RESTORES, "outcome" => "dropped").increment(1);
                        tracing::warn!(pod = %st.pod, reason = reason.label(), "snapshot record dropped: the stream did not continue from its cursor");
                    }
                    st.rules.clear();
                    let removed = context.index().clear_pod(&st.pod);
                    context.end_speculation(&st.pod, reason.label());
                    counter!(m::CLEARS, "reason" => reason.label()).increment(1);
                    tracing::warn!(pod = %st.pod, reason = reason.label(), entries_removed = removed, "pod cleared");
                }
                Step::RequestReplay { id, from, reason } => {
                    counter!(m::REPLAY_REQUESTS, "reason" => reason.label()).increment(1);
                    let endpoint = context.registry().replay_endpoint(&key.base, key.rank);
                    match endpoint {
                        Some(ep) => {
                            tracing::info!(pod = %st.pod, from, reason = reason.label(), endpoint = %ep, "replay requested");
                            context.start_replay(self.index, key.clone(), id, from, ep);
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
                    if st.ext.startup_sync == Some(id) {
                        st.ext.startup_sync = None;
                        context.readiness().sync_finished();
                    }
                }
                Step::Gap { expected, got } => {
                    add(&st.ext.counters.gaps, 1);
                    tracing::warn!(pod = %st.pod, expected, got, "sequence gap");
                }
                Step::Duplicate { .. } => self.duplicates.increment(1),
                Step::Transition { from, to, reason } => {
                    if to == SourceState::Connecting {
                        // A new publisher process (restart, epoch, reconnect) or none: its
                        // clock is learnt again.
                        st.ext.staleness.reset();
                    }
                    transition(context.index_handle(), &st.pod, from, to, reason)
                }
            }
        }
    }

    /// Applies one batch to `key`'s pod: `decoded` if the table decoded it, else decoded now
    /// (a batch held back behind a replay, an export or an import).
    fn apply(&mut self, key: &StreamKey, batch: &Batch, decoded: Option<&EventBatch<'_>>) {
        let Some(st) = self.table.get_mut(key) else { return };
        let index = self.context.index();
        // The stream's engine rules first (SGLang: servable pages, small pages rewritten).
        let mut kept_out = RulesReport::default();
        let mut apply = |decoded: &EventBatch<'_>| {
            let (applied, report) = st.rules.apply(index, &st.pod, &st.model, decoded);
            kept_out = report;
            applied
        };
        let (mut report, ts) = match decoded {
            Some(decoded) => {
                let r = apply(decoded);
                record_event_to_visible(decoded.ts);
                (r, decoded.ts)
            }
            None => match batch.decode() {
                Ok(decoded) => {
                    let r = apply(&decoded);
                    if batch.received.is_some() {
                        // A live batch held back (behind a replay, an export or an import):
                        // visible only now.
                        record_event_to_visible(decoded.ts);
                    }
                    (r, decoded.ts)
                }
                Err(_) => return, // decoded fine when it was sequenced; cannot happen
            },
        };
        // How far behind its engine the publisher is: live batches only (a replayed one is as
        // old as its gap), dated by when they were read.
        let arrival = batch.received.map(|at| {
            let waited = at.elapsed().as_millis() as u64;
            Arrival { received_ms: self.context.now_ms().saturating_sub(waited), waited_ms: waited }
        });
        st.ext.staleness.observe(arrival, ts);
        for (reason, blocks) in kept_out.skipped() {
            report.skipped[reason as usize] += blocks;
        }
        // SGLang's page-hash check counts where vLLM's does.
        report.hash_check.merge(&kept_out.hash_check);
        if kept_out.newly_misconfigured {
            if let Some(check) = st.rules.page_check() {
                let t = check.totals();
                tracing::warn!(pod = %st.pod, release = %check.release(), format = check.format().as_str(), checked = t.checked, mismatched = t.mismatched,
                    "every sampled SGLang page id mismatches this release's page hash: sglang_release, sglang_event_format or page_size is not what the engine runs (matching is unaffected: keys come from tokens)");
            }
        }
        if report.unweighted_tier_blocks > 0 {
            self.unweighted_tier_blocks.increment(report.unweighted_tier_blocks);
        }
        if let (Some(engine), false) = (report.refused_block_size, st.ext.logged_block_size.0) {
            st.ext.logged_block_size.0 = true;
            tracing::error!(pod = %st.pod, engine_block_size = engine, block_size = self.context.settings().block_size,
                "the engine's block size is not a multiple of block_size: none of its blocks can be indexed (counted in kvindex_skipped_blocks_total, reason block_size_mismatch); start kvindex serve with a --block-size that divides the engine's (vLLM --block-size, SGLang --page-size, TensorRT-LLM tokens_per_block)");
        }
        if report.block_size_changes > 0 {
            self.block_size_changes.increment(report.block_size_changes);
            if !st.ext.logged_block_size.1 {
                st.ext.logged_block_size.1 = true;
                tracing::warn!(pod = %st.pod, stores = report.block_size_changes,
                    "the engine's block size changed within one KV-cache group and tier without a clear: the pod is credited in the least common multiple of its sizes");
            }
        }
        if let Some(at) = batch.received {
            histogram!(m::RECEIVE_TO_VISIBLE).record(at.elapsed().as_secs_f64());
        }
        let counters = &st.ext.counters;
        add(&counters.events[0], report.stored_events);
        add(&counters.events[1], report.removed_events);
        add(&counters.events[2], report.cleared_events);
        if report.cleared_events > 0 {
            self.context.end_speculation(&st.pod, "all_blocks_cleared");
        }
        add(&counters.events[3], report.unknown_events);
        self.blocks_stored.increment(report.stored_blocks);
        st.ext.stored_blocks |= report.stored_blocks > 0;
        self.blocks_removed.increment(report.removed_blocks);
        add(&counters.hash_checked, u64::from(report.hash_check.checked));
        add(&counters.hash_mismatched, u64::from(report.hash_check.mismatched));
        for (c, n) in self.skipped.iter().zip(report.skipped) {
            if n > 0 {
                c.increment(n);
            }
        }
    }

    /// Carries on with the streams whose snapshot import has finished: their waiting steps run.
    pub(super) fn finish_imports(&mut self) {
        let done: Vec<StreamKey> = self
            .table
            .iter()
            .filter(|(_, st)| {
                st.ext.importing.as_ref().is_some_and(|i| {
                    // Disconnected: the import's thread is gone (it cannot be, short of a bug),
                    // and the stream goes on with what was imported.
                    !matches!(i.done.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty))
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in done {
            let Some(st) = self.table.get_mut(&key) else { continue };
            st.ext.importing = None;
            self.imports -= 1;
            self.run_waiting(&key);
            // A sibling's record is in and the steps behind it ran: this stream has caught up.
            if let Some(st) = self.table.get_mut(&key) {
                st.ext.restore_hold = None;
            }
        }
    }

    /// Runs the steps `key`'s stream held back while its pod was imported or exported.
    pub(crate) fn run_waiting(&mut self, key: &StreamKey) {
        let Some(st) = self.table.get_mut(key) else { return };
        let waiting = std::mem::take(&mut st.ext.waiting);
        let mut steps = Vec::new();
        for step in waiting {
            // Held back, not lost: a live batch's wait counts in its receive-to-visible time.
            steps.push(step);
            self.execute(key, &mut steps, None);
        }
    }
}

fn transition(index: &IndexHandle, pod: &str, from: SourceState, to: SourceState, reason: Reason) {
    index.status().transition(pod, from, to);
    if matches!(to, SourceState::Degraded | SourceState::Stale) {
        // A prediction about a pod whose events cannot be trusted would outlive what the index
        // knows of it.
        index.end_speculation(pod, "source_not_exact");
    }
    counter!(m::TRANSITIONS, "from" => from.label(), "to" => to.label(), "reason" => reason.label()).increment(1);
    match to {
        SourceState::Degraded | SourceState::Stale => {
            tracing::warn!(pod, from = from.label(), to = to.label(), reason = reason.label(), "source state")
        }
        _ => tracing::info!(pod, from = from.label(), to = to.label(), reason = reason.label(), "source state"),
    }
}

fn record_event_to_visible(ts: f64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let lat = now - ts;
    // Captured or replayed batches carry old timestamps; only live, plausible ones count.
    if (0.0..60.0).contains(&lat) {
        histogram!(m::EVENT_TO_VISIBLE).record(lat);
    }
}
