//! One row of the stream table: a stream's sequencer and what names and admits it (its pod,
//! model, connection, central-mode source binding), plus the driver's own part (`ext`: the
//! live worker keeps snapshot import/export state and metric handles there).

use std::sync::Arc;

use kvindex::sequencer::{Sequencer, SourceState, Step};

use super::batch::Batch;
use super::engine_rules::EngineRules;
use super::fleet::Fleet;
use super::naming::Mode;
use crate::protocols::{ConnId, StreamKey};
use kvindex_zmtp::{Peer, Source};

/// Silence after which a stream that was never EXACT may be reclaimed when the table is full.
pub const UNCONFIRMED_RECLAIM_MS: u64 = 1_000;

/// What a driver keeps per stream beside the table's part.
pub trait Ext {
    /// The stream may not be reclaimed now (the live worker: its pod is being imported or
    /// exported for a snapshot).
    fn pinned(&self) -> bool {
        false
    }

    /// The stream has put blocks in the index (the live worker: a batch of it stored some),
    /// so it is never reclaimed for holding none now: an engine that emptied its cache keeps
    /// its place.
    fn stored_blocks(&self) -> bool {
        false
    }
}

impl Ext for () {}

pub struct Stream<X> {
    pub seq: Sequencer<Batch>,
    /// DP-resolved pod id.
    pub pod: Arc<str>,
    pub model: Arc<str>,
    pub mode: Mode,
    /// Central mode: the topic the stream was first named by.
    pub topic: Option<String>,
    pub endpoint: Option<Arc<str>>,
    /// Registry generation `seq`'s replay flag was derived from.
    pub registry_generation: u64,
    /// The live connection the last message came on.
    pub conn: Option<ConnId>,
    /// A snapshot record's cursor, until the sequencer has been resumed from it.
    pub resume_at: Option<u64>,
    /// Central mode: the source address this stream's topic is bound to.
    pub bound: Option<Source>,
    /// This stream's claim on its pod id ([`super::PodOwners`]), given back when it goes.
    pub claim: u64,
    /// Messages dropped because they came from another source.
    pub conflicts: u64,
    /// When the stream was made (the driver's clock), for reclaiming one that never spoke again.
    pub created_at: u64,
    /// Whether the stream was ever EXACT: a stream a peer made up (a topic no engine
    /// publishes) never is, and is the first to go when the table is full.
    pub confirmed: bool,
    /// The engine family whose rules decode and key this stream's payloads (re-read from the
    /// [`Fleet`] on every live message: a re-registration may change them).
    pub rules: EngineRules,
    pub ext: X,
}

/// Why a stream may be reclaimed, in the order they go: never-confirmed streams first, then
/// those whose pod holds nothing, then silent ones (which may hold blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reclaim {
    /// Never EXACT, and silent for [`UNCONFIRMED_RECLAIM_MS`].
    Unconfirmed,
    /// It never stored a block and its pod holds none, however much it talks, and it is at
    /// least [`UNCONFIRMED_RECLAIM_MS`] old: forgetting it forgets nothing the index credits.
    Empty,
    /// Silent for `stale_after_ms`.
    Silent,
    /// Its pod is wanted by another stream, and it may go: its publisher's connection closed
    /// and it would be reclaimed by the rules above, or a registration made since keeps the pod
    /// for its own streams.
    Contested,
}

impl Reclaim {
    pub fn label(self) -> &'static str {
        match self {
            Reclaim::Unconfirmed => "unconfirmed",
            Reclaim::Empty => "empty",
            Reclaim::Silent => "silent",
            Reclaim::Contested => "contested",
        }
    }
}

/// What binding a message's source to its central-mode stream came to.
pub enum Binding {
    Kept,
    /// The bound source holds no connection any more: the new one took the topic over.
    Moved {
        from: Source,
        to: Source,
    },
    /// Another source holds the topic: the message is dropped.
    Conflict {
        bound: Source,
        total: u64,
    },
}

impl<X: Ext> Stream<X> {
    /// Why this stream may be reclaimed now to make room for another, if it may: only streams
    /// no operator or registration configured, not pinned by the driver, that never were
    /// EXACT and said nothing for [`UNCONFIRMED_RECLAIM_MS`], that never stored a block and
    /// whose pod holds none (and that are that old), or that said nothing for `stale_after_ms`.
    /// A stream that stored blocks is never reclaimed while it talks, so a peer churning
    /// made-up topics cannot take a real engine's place. With its last activity, to reclaim
    /// the longest silent first.
    pub fn reclaimable(
        &self,
        fleet: &dyn Fleet,
        key: &StreamKey,
        now: u64,
        stale_after_ms: u64,
    ) -> Option<(Reclaim, u64)> {
        if self.ext.pinned() || fleet.configured(&key.base) {
            return None;
        }
        let last = self.seq.last_data_at().unwrap_or(0).max(self.created_at);
        let silent = now.saturating_sub(last);
        if !self.confirmed && silent >= UNCONFIRMED_RECLAIM_MS {
            Some((Reclaim::Unconfirmed, last))
        } else if now.saturating_sub(self.created_at) >= UNCONFIRMED_RECLAIM_MS
            && !self.ext.stored_blocks()
            && !fleet.holds_blocks(&self.pod)
        {
            Some((Reclaim::Empty, last))
        } else if silent >= stale_after_ms {
            Some((Reclaim::Silent, last))
        } else {
            None
        }
    }

    /// Binds this central-mode stream to the source address of its first publisher. A message
    /// from another address is dropped and counted (never treated as a reconnect, so it can
    /// neither clear the pod nor add blocks to it) while the bound source holds a connection
    /// to the central SUB; once it holds none (an engine rescheduled to a new address), the
    /// next source takes the stream over, which the sequencer sees as a reconnect (resync).
    pub fn bind_source(&mut self, fleet: &dyn Fleet, peer: &Peer) -> Binding {
        let source = peer.source();
        match self.bound {
            None => {
                self.bound = Some(source);
                Binding::Kept
            }
            Some(bound) if bound == source => Binding::Kept,
            Some(bound) if !fleet.source_connected(&bound) => {
                self.bound = Some(source);
                Binding::Moved { from: bound, to: source }
            }
            Some(bound) => {
                self.conflicts += 1;
                Binding::Conflict { bound, total: self.conflicts }
            }
        }
    }

    /// Notes what the sequencer's `steps` say about the stream itself.
    pub(super) fn saw(&mut self, steps: &[Step<Batch>]) {
        self.confirmed |= steps.iter().any(|s| matches!(s, Step::Transition { to: SourceState::Exact, .. }));
    }
}
