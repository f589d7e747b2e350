//! What the service knows about its sources, for answers and operators: each pod's
//! [`SourceState`] (every ScoreTokens answer carries it) and whether its source is too far
//! behind its engine to be credited ([`PodState::withheld`]), the per-stream debug view behind
//! `/debug/sources`, and the `kvindex_sources{state}` and `kvindex_stale_sources` gauges.
//! Written by the apply workers only.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};
use serde::Serialize;

use kvindex::sequencer::{SequencerStats, SourceState};

use crate::protocols::StreamKey;
use crate::telemetry as m;

/// What `/debug/sources` shows per stream (refreshed by its worker on every tick).
#[derive(Debug, Clone, Serialize)]
pub struct StreamDebug {
    pub pod: String,
    pub base_pod: String,
    pub dp_rank: u32,
    pub mode: &'static str,
    /// The engine family whose rules decode and key the stream (`vllm`, `sglang`, `trtllm`).
    pub engine: &'static str,
    /// SGLang streams: the sampled page-hash cross-check, when it is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_hash_check: Option<PageHashCheckDebug>,
    pub topic: Option<String>,
    pub topic_id: Option<String>,
    pub model: String,
    pub endpoint: Option<String>,
    pub replay_endpoint: Option<String>,
    pub state: &'static str,
    /// The last seq applied to the index (a batch held back behind its pod's snapshot export
    /// or import is not, until it is).
    pub last_seq: Option<u64>,
    pub last_live_seq: Option<u64>,
    pub last_event_age_ms: Option<u64>,
    /// The sequencer's counters (gaps, duplicates, restarts, disconnects, replays, ...), as
    /// fields of the stream's object.
    #[serde(flatten)]
    pub counters: SequencerStats,
    pub replay_in_flight: Option<u64>,
    pub pending: usize,
    /// The age of the oldest live batch received for this stream and not yet visible: held
    /// behind a replay, an export or an import, or waiting in its worker's queue (shared by
    /// that worker's sources). 0 when nothing waits (see `write::worker::lag`).
    pub lag_ms: f64,
    /// How far behind its engine the stream is: `lag_ms` plus the backlog its batches' `ts`
    /// show on the publisher's side (see `write::worker::staleness`).
    pub staleness_ms: f64,
    /// Past `max_source_staleness_ms`: not credited in scores until it is back under it.
    pub stale: bool,
    /// The unit the pod is credited in, in tokens (its engine's block, times its
    /// context-parallel size: what its events' block sizes and its entry's rules say), and
    /// whether one unit is dropped from every hit (EAGLE).
    pub credit_unit_tokens: u32,
    pub eagle: bool,
    /// The digest of what the index holds for the pod at `last_seq` (`kvindex::index::digest`,
    /// hex), comparable with another replica's; none while a snapshot's or a sibling's
    /// record waits to be proven or is being imported.
    #[serde(serialize_with = "hex_digest")]
    pub digest: Option<u64>,
    /// Blocks the pod held when the digest was read.
    pub digest_blocks: u64,
}

/// A digest as 16 hex digits (a JSON number would lose its low bits in most readers).
fn hex_digest<S: serde::Serializer>(digest: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match digest {
        Some(d) => s.serialize_str(&format!("{d:016x}")),
        None => s.serialize_none(),
    }
}

/// What a score needs to know of a pod's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodState {
    pub state: SourceState,
    /// Too far behind its engine (`max_source_staleness_ms`): its matches are withheld.
    pub withheld: bool,
}

/// An SGLang stream's page-hash cross-check in `/debug/sources`.
#[derive(Debug, Clone, Serialize)]
pub struct PageHashCheckDebug {
    /// The release and event format whose rules the check follows.
    pub release: String,
    pub format: &'static str,
    pub checked: u32,
    pub matched: u32,
    pub mismatched: u32,
    pub unverifiable: u32,
    /// Every checked page id mismatched (past a handful): the configured release, format or
    /// page size is not what the engine runs.
    pub all_mismatched: bool,
}

#[derive(Default)]
pub struct SourceStatus {
    /// Source state per (DP-resolved) pod id.
    pods: RwLock<BTreeMap<String, PodState>>,
    streams: RwLock<BTreeMap<StreamKey, StreamDebug>>,
    counts: [AtomicI64; SourceState::ALL.len()],
    withheld: AtomicI64,
}

impl SourceStatus {
    /// The pods' states, read together (one lock for a whole answer).
    pub fn pod_states(&self) -> RwLockReadGuard<'_, BTreeMap<String, PodState>> {
        self.pods.read()
    }

    /// Pods with a source.
    pub fn pods(&self) -> usize {
        self.pods.read().len()
    }

    /// Sets `kvindex_pods` to the pods with a source (the index handle's upkeep calls it).
    pub fn publish_pods(&self) {
        metrics::gauge!(m::PODS).set(self.pods() as f64);
    }

    /// A new stream of `pod` starts CONNECTING.
    pub fn add(&self, pod: &str) {
        self.count(SourceState::Connecting, 1);
        let old =
            self.pods.write().insert(pod.to_string(), PodState { state: SourceState::Connecting, withheld: false });
        if old.is_some_and(|p| p.withheld) {
            self.count_withheld(-1);
        }
    }

    pub fn transition(&self, pod: &str, from: SourceState, to: SourceState) {
        self.count(from, -1);
        self.count(to, 1);
        self.pods.write().entry(pod.to_string()).or_insert(PodState { state: to, withheld: false }).state = to;
    }

    /// `pod`'s source went past `max_source_staleness_ms` (`true`) or back under it.
    pub fn set_withheld(&self, pod: &str, withheld: bool) {
        let changed =
            self.pods.write().get_mut(pod).is_some_and(|p| std::mem::replace(&mut p.withheld, withheld) != withheld);
        if changed {
            self.count_withheld(if withheld { 1 } else { -1 });
        }
    }

    /// A stream is gone (its pod was unregistered).
    pub fn remove(&self, key: &StreamKey, pod: &str, state: SourceState) {
        self.count(state, -1);
        if self.pods.write().remove(pod).is_some_and(|p| p.withheld) {
            self.count_withheld(-1);
        }
        self.streams.write().remove(key);
    }

    /// Replaces the debug view of these streams.
    pub fn publish(&self, views: Vec<(StreamKey, StreamDebug)>) {
        let mut streams = self.streams.write();
        for (key, view) in views {
            streams.insert(key, view);
        }
    }

    /// The debug view of every stream, ordered by stream.
    pub fn streams(&self) -> Vec<StreamDebug> {
        self.streams.read().values().cloned().collect()
    }

    fn count(&self, state: SourceState, delta: i64) {
        let i = SourceState::ALL.iter().position(|s| *s == state).unwrap_or(0);
        let v = self.counts[i].fetch_add(delta, Ordering::Relaxed) + delta;
        metrics::gauge!(m::SOURCES, "state" => state.label()).set(v as f64);
    }

    fn count_withheld(&self, delta: i64) {
        let v = self.withheld.fetch_add(delta, Ordering::Relaxed) + delta;
        metrics::gauge!(m::STALE_SOURCES).set(v as f64);
    }
}
