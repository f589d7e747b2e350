//! The per-source sequencer: one state machine per (source, data-parallel rank) stream.
//!
//! It decides, for every message a publisher's stream delivers, whether it is applied, dropped
//! as a duplicate, held while a replay fills a gap, or whether the pod must be cleared. It is
//! pure: messages, replay replies and clock ticks come in as values (time is a number of
//! milliseconds chosen by the caller), and [`Step`]s come out for the shell to carry out in
//! order. No sockets, no clocks, no threads, so every path is driven step by step in tests.
//!
//! ```text
//! CONNECTING ──seq 0──▶ EXACT ──gap──▶ REPLAYING ──filled──▶ EXACT
//!      │                  │                 └──not covered / failed / timeout──▶ DEGRADED (pod cleared)
//!      └──seq > 0──▶ replay from 0 (or DEGRADED without replay)
//!                         ├──seq goes back (restart), or a new connection──▶ clear, replay from 0 ──▶ EXACT | DEGRADED
//!                         ├──its connection closes──▶ clear ──▶ CONNECTING (from any state)
//!                         └──silent > stale_after──▶ STALE (back on data)
//! a live connection opens (any state) ──▶ catch-up replay from the cursor (from 0 when CONNECTING)
//! DEGRADED keeps applying new batches (scores only under-report) and becomes EXACT again only
//! after a full resync: a replay from seq 0 whose first reply is seq 0 (after a restart).
//! ```
//!
//! The one rule: never guess. A seq that can no longer be obtained (dropped beyond the replay
//! buffer, replay unavailable, malformed payload) clears the pod and marks it DEGRADED.

mod catch_up;
mod resume;
mod state;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

pub use state::{Reason, ReplayOutcome, SourceState};

/// Milliseconds on a clock the caller chooses (monotonic in the service, synthetic in tests).
pub type Millis = u64;

/// A message's content as far as sequencing cares: a decoded batch, or a payload that
/// could not be decoded (its seq is consumed, its content is lost).
#[derive(Debug, Clone, PartialEq)]
pub enum Item<P> {
    Batch(P),
    Malformed,
}

/// What the shell must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Step<P> {
    /// Apply this batch to the pod's index state.
    Apply { seq: u64, batch: P },
    /// Drop everything the pod holds.
    Clear { reason: Reason },
    /// Ask the publisher's replay socket for every buffered batch from `from`; answer with
    /// [`Sequencer::on_replay_message`] / [`Sequencer::on_replay_end`] /
    /// [`Sequencer::on_replay_failed`] carrying the same `id`. `reason` says why it is asked
    /// (`InitialSync`, `Gap`, `CatchUp`), for the shell to count.
    RequestReplay { id: u64, from: u64, reason: Reason },
    /// The replay `id` is over (no more messages for it will be accepted).
    ReplayDone { id: u64, outcome: ReplayOutcome },
    /// A seq gap: `expected` was next, `got` arrived.
    Gap { expected: u64, got: u64 },
    /// A message already applied (replay overlapping live) was dropped.
    Duplicate { seq: u64 },
    /// The state changed.
    Transition { from: SourceState, to: SourceState, reason: Reason },
}

/// Knobs of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequencerConfig {
    /// Whether the publisher has a replay socket.
    pub replay: bool,
    /// Silence after which the stream is STALE.
    pub stale_after_ms: Millis,
    /// A replay without its end marker this long after it began (see
    /// [`Sequencer::on_replay_begun`]) has failed.
    pub replay_timeout_ms: Millis,
    /// A requested replay may wait this long for the shell to begin it (replays run a few at
    /// a time; under load the others queue): so a burst of gaps costs lag, not state. A shell
    /// that never reports the begin gets `replay_timeout_ms` from the request on as before,
    /// when this is not longer.
    pub replay_queue_timeout_ms: Millis,
    /// After a failed replay, gaps are not replayed (but cleared) for this long.
    pub replay_cooldown_ms: Millis,
    /// Live messages held during a replay; past it the replay is abandoned.
    pub max_pending: usize,
}

impl Default for SequencerConfig {
    fn default() -> Self {
        SequencerConfig {
            replay: true,
            stale_after_ms: 30_000,
            replay_timeout_ms: 5_000,
            replay_queue_timeout_ms: 60_000,
            replay_cooldown_ms: 5_000,
            max_pending: 100_000,
        }
    }
}

/// Counters of one stream, for the debug endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SequencerStats {
    pub applied: u64,
    pub gaps: u64,
    pub duplicates: u64,
    pub restarts: u64,
    /// Live connections that closed while the stream held their state.
    pub disconnects: u64,
    pub malformed: u64,
    pub clears: u64,
    pub replays_started: u64,
    pub replays_filled: u64,
    pub replays_failed: u64,
}

#[derive(Debug, Clone)]
struct ActiveReplay {
    id: u64,
    from: u64,
    started_at: Millis,
    /// Whether the shell began it (see [`Sequencer::on_replay_begun`]); until then it is queued
    /// and `replay_queue_timeout_ms` bounds it.
    begun: bool,
    first_seen: Option<u64>,
    /// `next` when the replay started, to tell progress from a replay that brought nothing.
    next_at_start: Option<u64>,
    /// Why it was asked (a failed catch-up may be tried again, see `catch_up`).
    reason: Reason,
}

/// The state machine of one (source, DP rank) stream. `P` is the decoded batch (opaque here).
#[derive(Debug)]
pub struct Sequencer<P> {
    config: SequencerConfig,
    state: SourceState,
    /// The pod's index state is incomplete (cleared after a loss).
    degraded: bool,
    /// Why it is: the last loss's reason (what a filled replay that leaves it DEGRADED names).
    lost_by: Option<Reason>,
    /// Next seq to apply; `None` until the stream knows where it starts.
    next: Option<u64>,
    /// Highest seq seen on the live socket (restart detection).
    last_live: Option<u64>,
    last_data_at: Option<Millis>,
    replay: Option<ActiveReplay>,
    replay_ids: u64,
    cooldown_until: Millis,
    pending: VecDeque<(u64, Item<P>)>,
    /// The live connection changed since the last live message.
    reconnected: bool,
    /// Restored from a snapshot's cursor and no batch applied since (see `resume`).
    resumed: bool,
    /// The start-up replay was asked before any live connection: if it is answered before one
    /// opens, what it brought came from a process the first connection may not reach (see
    /// `catch_up`).
    synced_unconnected: bool,
    /// The publisher epoch of the last live message that had one (24-byte seq frames).
    epoch: Option<[u8; 16]>,
    /// A live connection opened and nothing has come on it yet: its catch-up replay is still
    /// to be asked (see `catch_up`).
    catch_up: bool,
    /// Catch-up replays asked since the connection opened.
    catch_up_tries: u8,
    stats: SequencerStats,
}

impl<P> Sequencer<P> {
    pub fn new(config: SequencerConfig) -> Self {
        Sequencer {
            config,
            state: SourceState::Connecting,
            degraded: false,
            lost_by: None,
            next: None,
            last_live: None,
            last_data_at: None,
            replay: None,
            replay_ids: 0,
            cooldown_until: 0,
            pending: VecDeque::new(),
            reconnected: false,
            resumed: false,
            synced_unconnected: false,
            epoch: None,
            catch_up: false,
            catch_up_tries: 0,
            stats: SequencerStats::default(),
        }
    }

    pub fn state(&self) -> SourceState {
        self.state
    }

    /// The last applied seq.
    pub fn last_seq(&self) -> Option<u64> {
        self.next.and_then(|n| n.checked_sub(1))
    }

    pub fn last_live_seq(&self) -> Option<u64> {
        self.last_live
    }

    pub fn last_data_at(&self) -> Option<Millis> {
        self.last_data_at
    }

    pub fn is_degraded(&self) -> bool {
        self.degraded
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The batches held while a replay fills a gap, in the order they came (for the shell to
    /// date how long they wait).
    pub fn held(&self) -> impl Iterator<Item = &P> {
        self.pending.iter().filter_map(|(_, item)| match item {
            Item::Batch(batch) => Some(batch),
            Item::Malformed => None,
        })
    }

    /// The live batch held for `seq`, if one is: a replay brings it again, and the live copy
    /// is then dropped as a duplicate, so the shell can date the replayed one by it.
    pub fn held_at(&self, seq: u64) -> Option<&P> {
        // Held in seq order: a seq that goes back is a restart, which drops what is held.
        let i = self.pending.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        match &self.pending[i].1 {
            Item::Batch(batch) => Some(batch),
            Item::Malformed => None,
        }
    }

    /// `(id, from)` of the replay in flight.
    pub fn replay_in_flight(&self) -> Option<(u64, u64)> {
        self.replay.as_ref().map(|r| (r.id, r.from))
    }

    pub fn stats(&self) -> &SequencerStats {
        &self.stats
    }

    pub fn config(&self) -> &SequencerConfig {
        &self.config
    }

    /// Enables or disables replay (a replay endpoint was registered or removed).
    pub fn set_replay(&mut self, replay: bool) {
        self.config.replay = replay;
    }

    /// The state scores settle on when nothing is in flight.
    fn settled(&self) -> SourceState {
        if self.degraded {
            SourceState::Degraded
        } else {
            SourceState::Exact
        }
    }

    fn set_state(&mut self, to: SourceState, reason: Reason, out: &mut Vec<Step<P>>) {
        if self.state != to {
            out.push(Step::Transition { from: self.state, to, reason });
            self.state = to;
        }
    }

    fn clear(&mut self, reason: Reason, out: &mut Vec<Step<P>>) {
        self.stats.clears += 1;
        out.push(Step::Clear { reason });
    }

    /// An unrecoverable loss: the pod's state is dropped, later batches still apply.
    fn lose(&mut self, reason: Reason, out: &mut Vec<Step<P>>) {
        self.clear(reason, out);
        self.degraded = true;
        self.lost_by = Some(reason);
        if self.replay.is_none() {
            self.set_state(SourceState::Degraded, reason, out);
        }
    }

    fn can_replay(&self, now: Millis) -> bool {
        self.config.replay && now >= self.cooldown_until
    }

    fn why_no_replay(&self) -> Reason {
        if self.config.replay {
            Reason::ReplayCooldown
        } else {
            Reason::ReplayUnavailable
        }
    }

    fn start_replay(&mut self, from: u64, now: Millis, reason: Reason, out: &mut Vec<Step<P>>) {
        self.replay_ids += 1;
        let id = self.replay_ids;
        let next_at_start = self.next;
        self.next = Some(from);
        self.replay =
            Some(ActiveReplay { id, from, started_at: now, begun: false, first_seen: None, next_at_start, reason });
        self.stats.replays_started += 1;
        out.push(Step::RequestReplay { id, from, reason });
        self.set_state(SourceState::Replaying, reason, out);
    }

    /// Applies `item` at `seq` == `next`.
    fn apply(&mut self, seq: u64, item: Item<P>, out: &mut Vec<Step<P>>) {
        // u64::MAX is vLLM's end-of-replay marker, never a live seq; a peer sending it must not
        // overflow the cursor (it only makes later batches look like duplicates: under-report).
        self.next = Some(seq.saturating_add(1));
        self.resumed = false;
        match item {
            Item::Batch(batch) => {
                self.stats.applied += 1;
                out.push(Step::Apply { seq, batch });
            }
            Item::Malformed => {
                self.stats.malformed += 1;
                self.lose(Reason::Malformed, out);
            }
        }
    }

    /// Starts a replay from 0 before any live message (per-pod sources with a replay socket,
    /// at start-up), so the index is complete before the service reports ready.
    pub fn start_initial_sync(&mut self, now: Millis, out: &mut Vec<Step<P>>) {
        if self.state == SourceState::Connecting && self.replay.is_none() && self.can_replay(now) {
            self.synced_unconnected = true;
            self.start_replay(0, now, Reason::InitialSync, out);
        }
    }

    /// The publisher epoch a live message carries (vLLM's 24-byte seq frame), given before
    /// [`Sequencer::on_live`] with that message. A new epoch is a new publisher process: it
    /// clears like a restart, whatever its seq, and the message then starts the new stream
    /// (seq 0 applies; a later seq replays from 0). Messages without an epoch change nothing.
    pub fn on_epoch(&mut self, epoch: Option<[u8; 16]>, out: &mut Vec<Step<P>>) {
        let Some(epoch) = epoch else { return };
        if self.epoch.replace(epoch).is_some_and(|previous| previous != epoch) {
            self.restart(Reason::Epoch, out);
            // The new process's seq is not comparable with the old one's.
            self.last_live = None;
            self.reconnected = false;
        }
    }

    /// A message from the live (SUB) socket.
    pub fn on_live(&mut self, seq: u64, item: Item<P>, now: Millis, out: &mut Vec<Step<P>>) {
        self.last_data_at = Some(now);
        // What came before this message is the gap rules' now (applied, or replayed as a gap).
        self.catch_up = false;
        if self.state == SourceState::Stale {
            let to = self.settled();
            self.set_state(to, Reason::Data, out);
        }
        if self.last_live.is_some_and(|last| seq <= last) || self.resumed_behind(seq) {
            self.restart(Reason::Restart, out);
        } else if std::mem::take(&mut self.reconnected) && self.holds_any() {
            // A new connection whose seq moved forward: the same process after a network
            // blip, or a new process that already published past our cursor. Seq numbers
            // cannot tell them apart, so nothing is trusted: clear and resync from seq 0. (Also
            // when what the stream holds came by replay alone: that was the old connection's
            // process too.)
            self.restart(Reason::Reconnect, out);
        }
        self.reconnected = false;
        self.last_live = Some(seq);
        if self.replay.is_some() {
            if self.pending.len() >= self.config.max_pending {
                self.abandon_replay(Reason::PendingOverflow, now, out);
                // The held messages are gone with the replay: whatever follows is a gap.
                self.route(seq, item, now, out);
            } else {
                self.pending.push_back((seq, item));
            }
            return;
        }
        self.route(seq, item, now, out);
    }

    /// Whether the stream holds (or is filling) anything of its publisher: a live message came,
    /// or a replay set its cursor.
    fn holds_any(&self) -> bool {
        self.last_live.is_some() || self.next.is_some()
    }

    /// Places one message when no replay is in flight.
    fn route(&mut self, seq: u64, item: Item<P>, now: Millis, out: &mut Vec<Step<P>>) {
        match self.next {
            None if seq == 0 => {
                self.apply(seq, item, out);
                let to = self.settled();
                self.set_state(to, Reason::FirstBatch, out);
            }
            None => {
                // Joined a publisher that already published seqs 0..seq.
                if self.can_replay(now) {
                    self.start_replay(0, now, Reason::InitialSync, out);
                    self.pending.push_back((seq, item));
                } else {
                    let reason = self.why_no_replay();
                    self.lose(reason, out);
                    self.apply(seq, item, out);
                }
            }
            Some(next) if seq < next => {
                self.stats.duplicates += 1;
                out.push(Step::Duplicate { seq });
            }
            Some(next) if seq == next => {
                self.apply(seq, item, out);
                if self.state == SourceState::Connecting {
                    let to = self.settled();
                    self.set_state(to, Reason::FirstBatch, out);
                }
            }
            Some(next) => {
                self.stats.gaps += 1;
                out.push(Step::Gap { expected: next, got: seq });
                if self.can_replay(now) {
                    self.start_replay(next, now, Reason::Gap, out);
                    self.pending.push_back((seq, item));
                } else {
                    let reason = self.why_no_replay();
                    self.lose(reason, out);
                    self.apply(seq, item, out);
                }
            }
        }
    }

    /// The live socket's connection to the publisher was replaced (the shell sees the TCP
    /// connection change). The next live message then resyncs from seq 0 (see `on_live`).
    pub fn on_reconnect(&mut self) {
        self.reconnected = true;
    }

    /// The live connection this stream's messages came on closed. The publisher may be gone
    /// (a restarted engine publishes nothing until it serves a request), so nothing it sent
    /// is claimed any more: clear, abandon any replay, and go back to CONNECTING so that the
    /// next connection starts over as a new stream (seq 0 applies; a later seq replays from 0).
    pub fn on_disconnect(&mut self, out: &mut Vec<Step<P>>) {
        self.stats.disconnects += 1;
        self.catch_up = false;
        if self.replay.is_some() {
            self.end_replay(ReplayOutcome::Abandoned, out);
        }
        self.pending.clear();
        self.clear(Reason::Disconnect, out);
        self.synced_unconnected = false;
        self.degraded = false;
        self.lost_by = None;
        self.next = None;
        self.last_live = None;
        self.reconnected = false;
        self.set_state(SourceState::Connecting, Reason::Disconnect, out);
    }

    /// The publisher restarted (or may have): its new process holds nothing we know.
    fn restart(&mut self, reason: Reason, out: &mut Vec<Step<P>>) {
        self.stats.restarts += 1;
        if self.replay.is_some() {
            self.end_replay(ReplayOutcome::Abandoned, out);
        }
        self.pending.clear();
        self.clear(reason, out);
        self.resumed = false;
        self.degraded = false;
        self.lost_by = None;
        self.next = None;
        self.set_state(SourceState::Connecting, reason, out);
    }

    fn end_replay(&mut self, outcome: ReplayOutcome, out: &mut Vec<Step<P>>) -> Option<ActiveReplay> {
        let replay = self.replay.take()?;
        match outcome {
            ReplayOutcome::Filled => self.stats.replays_filled += 1,
            _ => self.stats.replays_failed += 1,
        }
        out.push(Step::ReplayDone { id: replay.id, outcome });
        Some(replay)
    }

    /// Gives up on the replay in flight: the range it was to fill is lost.
    fn abandon_replay(&mut self, reason: Reason, now: Millis, out: &mut Vec<Step<P>>) {
        let outcome = match reason {
            Reason::ReplayTimeout => ReplayOutcome::Timeout,
            Reason::ReplayUnavailable => ReplayOutcome::Unavailable,
            _ => ReplayOutcome::Abandoned,
        };
        let Some(replay) = self.end_replay(outcome, out) else { return };
        self.cooldown_until = now.saturating_add(self.config.replay_cooldown_ms);
        if replay.reason == Reason::CatchUp && matches!(reason, Reason::ReplayTimeout | Reason::ReplayUnavailable) {
            self.catch_up_failed();
        }
        if reason == Reason::PendingOverflow {
            // The held messages are dropped: clear now, continue from what comes next.
            self.pending.clear();
            self.lose(reason, out);
            if self.next == Some(replay.from) && replay.next_at_start.is_none() {
                self.next = None;
            }
            return;
        }
        // Nothing was lost yet if the replay was only an initial sync with nothing held.
        if self.pending.is_empty() && replay.first_seen.is_none() {
            self.next = replay.next_at_start;
            let to = if self.next.is_none() { SourceState::Connecting } else { self.settled() };
            self.set_state(to, reason, out);
            return;
        }
        self.drain(reason, false, now, out);
    }

    /// A message from the replay socket, for replay `id`.
    pub fn on_replay_message(&mut self, id: u64, seq: u64, item: Item<P>, _now: Millis, out: &mut Vec<Step<P>>) {
        let Some(replay) = self.replay.as_mut().filter(|r| r.id == id) else { return };
        let first = replay.first_seen.is_none();
        replay.first_seen.get_or_insert(seq);
        let from = replay.from;
        if first && seq > from {
            // The buffer has moved past what we asked for: from..seq is gone.
            self.lose(Reason::ReplayNotCovered, out);
            self.next = Some(seq);
        }
        match self.next {
            Some(next) if seq < next => {
                self.stats.duplicates += 1;
                out.push(Step::Duplicate { seq });
            }
            Some(next) if seq > next => {
                // A hole inside the replay stream itself: lost.
                self.stats.gaps += 1;
                out.push(Step::Gap { expected: next, got: seq });
                self.lose(Reason::ReplayNotCovered, out);
                self.apply(seq, item, out);
            }
            _ => self.apply(seq, item, out),
        }
    }

    /// The shell began replay `id` (it had waited for a free replay slot): from now on it has
    /// `replay_timeout_ms` to finish.
    pub fn on_replay_begun(&mut self, id: u64, now: Millis) {
        if let Some(r) = self.replay.as_mut().filter(|r| r.id == id && !r.begun) {
            r.begun = true;
            r.started_at = now;
        }
    }

    /// The end marker of replay `id`.
    pub fn on_replay_end(&mut self, id: u64, now: Millis, out: &mut Vec<Step<P>>) {
        if self.replay.as_ref().is_none_or(|r| r.id != id) {
            return;
        }
        let first_seen = self.replay.as_ref().and_then(|r| r.first_seen);
        let from = self.replay.as_ref().map_or(0, |r| r.from);
        let covered = first_seen.is_none_or(|f| f <= from);
        let outcome = if covered { ReplayOutcome::Filled } else { ReplayOutcome::NotCovered };
        let replay = self.end_replay(outcome, out);
        let progressed = replay.is_some_and(|r| r.next_at_start != self.next);
        let reason = if covered { Reason::ReplayFilled } else { Reason::ReplayNotCovered };
        self.drain(reason, progressed, now, out);
    }

    /// The replay `id` could not be carried out (endpoint unavailable, I/O error, timeout).
    pub fn on_replay_failed(&mut self, id: u64, timeout: bool, now: Millis, out: &mut Vec<Step<P>>) {
        if self.replay.as_ref().is_none_or(|r| r.id != id) {
            return;
        }
        let reason = if timeout { Reason::ReplayTimeout } else { Reason::ReplayUnavailable };
        self.abandon_replay(reason, now, out);
    }

    /// Applies held live messages after a replay. A remaining gap is replayed again only if
    /// this replay made progress; otherwise it is lost.
    fn drain(&mut self, reason: Reason, allow_replay: bool, now: Millis, out: &mut Vec<Step<P>>) {
        while let Some((seq, item)) = self.pending.pop_front() {
            match self.next {
                Some(next) if seq < next => {
                    self.stats.duplicates += 1;
                    out.push(Step::Duplicate { seq });
                }
                Some(next) if seq > next => {
                    self.stats.gaps += 1;
                    out.push(Step::Gap { expected: next, got: seq });
                    if allow_replay && self.can_replay(now) {
                        self.pending.push_front((seq, item));
                        self.state = SourceState::Replaying;
                        self.start_replay(next, now, Reason::Gap, out);
                        return;
                    }
                    let why = if allow_replay { self.why_no_replay() } else { reason };
                    self.lose(why, out);
                    self.apply(seq, item, out);
                }
                None if seq != 0 => {
                    // Nothing applied and nothing replayed: the history before `seq` is unknown.
                    self.lose(reason, out);
                    self.apply(seq, item, out);
                }
                _ => self.apply(seq, item, out),
            }
        }
        let to = if self.next.is_none() { SourceState::Connecting } else { self.settled() };
        // A filled replay that leaves the pod DEGRADED names the loss that degraded it (a
        // malformed or missing copy in the replay, or one before it), not the fill.
        let why = match self.lost_by {
            Some(lost) if self.degraded && reason == Reason::ReplayFilled => lost,
            _ => reason,
        };
        self.set_state(to, why, out);
    }

    /// Clock tick: replay timeouts and staleness.
    pub fn on_tick(&mut self, now: Millis, out: &mut Vec<Step<P>>) {
        if let Some(r) = &self.replay {
            let limit = if r.begun {
                self.config.replay_timeout_ms
            } else {
                self.config.replay_queue_timeout_ms.max(self.config.replay_timeout_ms)
            };
            if now.saturating_sub(r.started_at) >= limit {
                self.abandon_replay(Reason::ReplayTimeout, now, out);
            }
        }
        self.try_catch_up(now, out);
        if matches!(self.state, SourceState::Exact | SourceState::Degraded) {
            if let Some(at) = self.last_data_at {
                if now.saturating_sub(at) >= self.config.stale_after_ms {
                    self.set_state(SourceState::Stale, Reason::Silent, out);
                }
            }
        }
    }
}
