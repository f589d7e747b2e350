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
//!                         └──silent > stale_after──▶ STALE (back on data)
//! DEGRADED keeps applying new batches (scores only under-report) and becomes EXACT again only
//! after a full resync: a replay from seq 0 whose first reply is seq 0 (after a restart).
//! ```
//!
//! The one rule: never guess. A seq that can no longer be obtained (dropped beyond the replay
//! buffer, replay unavailable, malformed payload) clears the pod and marks it DEGRADED.

use std::collections::VecDeque;

/// Milliseconds on a clock the caller chooses (monotonic in the service, synthetic in tests).
pub type Millis = u64;

/// Where a stream stands. `Exact`, `Degraded` and `Stale` are what scores report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceState {
    /// Nothing applied yet.
    Connecting,
    /// Every batch since seq 0 of this publisher process is applied.
    Exact,
    /// A replay is filling a gap; live messages are held until it ends.
    Replaying,
    /// The pod was cleared after an unrecoverable loss; only later batches are known.
    Degraded,
    /// No message for longer than `stale_after`.
    Stale,
}

impl SourceState {
    pub const ALL: [SourceState; 5] =
        [SourceState::Connecting, SourceState::Exact, SourceState::Replaying, SourceState::Degraded, SourceState::Stale];

    /// Stable label for metrics, logs and the debug endpoint.
    pub fn label(self) -> &'static str {
        match self {
            SourceState::Connecting => "CONNECTING",
            SourceState::Exact => "EXACT",
            SourceState::Replaying => "REPLAYING",
            SourceState::Degraded => "DEGRADED",
            SourceState::Stale => "STALE",
        }
    }
}

/// Why a transition (or a clear) happened. Stable labels for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The first batch of a publisher (seq 0) arrived.
    FirstBatch,
    /// A stream joined after seq 0 and a replay from 0 was started.
    InitialSync,
    /// A seq gap was seen and a replay was started.
    Gap,
    /// The replay filled the gap.
    ReplayFilled,
    /// The replay's first message was above the requested seq.
    ReplayNotCovered,
    /// No replay endpoint, or it could not be reached.
    ReplayUnavailable,
    /// The replay did not finish in time.
    ReplayTimeout,
    /// A gap arrived while replays were cooling down after a failure.
    ReplayCooldown,
    /// Too many live messages arrived while a replay was in flight.
    PendingOverflow,
    /// The seq went backwards: the publisher restarted.
    Restart,
    /// The publisher's connection was replaced: it may have restarted with its seq already
    /// past ours, so its history is re-read from seq 0 instead of trusted.
    Reconnect,
    /// A payload could not be decoded; its seq is lost.
    Malformed,
    /// Silent for longer than `stale_after`.
    Silent,
    /// Data arrived on a stale stream.
    Data,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::FirstBatch => "first_batch",
            Reason::InitialSync => "initial_sync",
            Reason::Gap => "gap",
            Reason::ReplayFilled => "replay_filled",
            Reason::ReplayNotCovered => "replay_not_covered",
            Reason::ReplayUnavailable => "replay_unavailable",
            Reason::ReplayTimeout => "replay_timeout",
            Reason::ReplayCooldown => "replay_cooldown",
            Reason::PendingOverflow => "pending_overflow",
            Reason::Restart => "restart",
            Reason::Reconnect => "reconnect",
            Reason::Malformed => "malformed",
            Reason::Silent => "silent",
            Reason::Data => "data",
        }
    }
}

/// How a replay ended, for `kvindex_replays_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayOutcome {
    /// Every requested seq came back.
    Filled,
    /// The buffer no longer held the requested seq.
    NotCovered,
    /// The replay endpoint could not be used (absent, refused, concurrency limit, I/O error).
    Unavailable,
    /// No end marker within the replay timeout.
    Timeout,
    /// Abandoned: the publisher restarted or too many live messages piled up meanwhile.
    Abandoned,
}

impl ReplayOutcome {
    pub const ALL: [ReplayOutcome; 5] = [
        ReplayOutcome::Filled,
        ReplayOutcome::NotCovered,
        ReplayOutcome::Unavailable,
        ReplayOutcome::Timeout,
        ReplayOutcome::Abandoned,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ReplayOutcome::Filled => "filled",
            ReplayOutcome::NotCovered => "not_covered",
            ReplayOutcome::Unavailable => "unavailable",
            ReplayOutcome::Timeout => "timeout",
            ReplayOutcome::Abandoned => "abandoned",
        }
    }
}

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
    /// [`Sequencer::on_replay_failed`] carrying the same `id`.
    RequestReplay { id: u64, from: u64 },
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
    /// A replay without its end marker after this long has failed.
    pub replay_timeout_ms: Millis,
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
            replay_cooldown_ms: 5_000,
            max_pending: 100_000,
        }
    }
}

/// Counters of one stream, for the debug endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SequencerStats {
    pub applied: u64,
    pub gaps: u64,
    pub duplicates: u64,
    pub restarts: u64,
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
    first_seen: Option<u64>,
    /// `next` when the replay started, to tell progress from a replay that brought nothing.
    next_at_start: Option<u64>,
}

/// The state machine of one (source, DP rank) stream. `P` is the decoded batch (opaque here).
#[derive(Debug)]
pub struct Sequencer<P> {
    config: SequencerConfig,
    state: SourceState,
    /// The pod's index state is incomplete (cleared after a loss).
    degraded: bool,
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
    stats: SequencerStats,
}

impl<P> Sequencer<P> {
    pub fn new(config: SequencerConfig) -> Self {
        Sequencer {
            config,
            state: SourceState::Connecting,
            degraded: false,
            next: None,
            last_live: None,
            last_data_at: None,
            replay: None,
            replay_ids: 0,
            cooldown_until: 0,
            pending: VecDeque::new(),
            reconnected: false,
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
        self.replay = Some(ActiveReplay { id, from, started_at: now, first_seen: None, next_at_start });
        self.stats.replays_started += 1;
        out.push(Step::RequestReplay { id, from });
        self.set_state(SourceState::Replaying, reason, out);
    }

    /// Applies `item` at `seq` == `next`.
    fn apply(&mut self, seq: u64, item: Item<P>, out: &mut Vec<Step<P>>) {
        self.next = Some(seq + 1);
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
            self.start_replay(0, now, Reason::InitialSync, out);
        }
    }

    /// A message from the live (SUB) socket.
    pub fn on_live(&mut self, seq: u64, item: Item<P>, now: Millis, out: &mut Vec<Step<P>>) {
        self.last_data_at = Some(now);
        if self.state == SourceState::Stale {
            let to = self.settled();
            self.set_state(to, Reason::Data, out);
        }
        if self.last_live.is_some_and(|last| seq <= last) {
            self.restart(Reason::Restart, out);
        } else if std::mem::take(&mut self.reconnected) && self.last_live.is_some() {
            // A new connection whose seq moved forward: the same process after a network
            // blip, or a new process that already published past our cursor. Seq numbers
            // cannot tell them apart, so nothing is trusted: clear and resync from seq 0.
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

    /// The publisher restarted (or may have): its new process holds nothing we know.
    fn restart(&mut self, reason: Reason, out: &mut Vec<Step<P>>) {
        self.stats.restarts += 1;
        if self.replay.is_some() {
            self.end_replay(ReplayOutcome::Abandoned, out);
        }
        self.pending.clear();
        self.clear(reason, out);
        self.degraded = false;
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
        let why = if self.degraded && reason == Reason::ReplayFilled { Reason::Malformed } else { reason };
        self.set_state(to, why, out);
    }

    /// Clock tick: replay timeouts and staleness.
    pub fn on_tick(&mut self, now: Millis, out: &mut Vec<Step<P>>) {
        if let Some(r) = &self.replay {
            if now.saturating_sub(r.started_at) >= self.config.replay_timeout_ms {
                self.abandon_replay(Reason::ReplayTimeout, now, out);
            }
        }
        if matches!(self.state, SourceState::Exact | SourceState::Degraded) {
            if let Some(at) = self.last_data_at {
                if now.saturating_sub(at) >= self.config.stale_after_ms {
                    self.set_state(SourceState::Stale, Reason::Silent, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SourceState::*;

    type Seq = Sequencer<&'static str>;

    fn cfg(replay: bool) -> SequencerConfig {
        SequencerConfig { replay, stale_after_ms: 1_000, replay_timeout_ms: 500, replay_cooldown_ms: 2_000, max_pending: 4 }
    }

    fn b(s: &'static str) -> Item<&'static str> {
        Item::Batch(s)
    }

    /// Only the actions (applies, clears, replays), in order.
    fn actions(out: &[Step<&'static str>]) -> Vec<String> {
        out.iter()
            .filter_map(|s| match s {
                Step::Apply { seq, batch } => Some(format!("apply {seq} {batch}")),
                Step::Clear { reason } => Some(format!("clear {}", reason.label())),
                Step::RequestReplay { from, .. } => Some(format!("replay {from}")),
                _ => None,
            })
            .collect()
    }

    fn live(s: &mut Seq, seq: u64, now: Millis) -> Vec<Step<&'static str>> {
        let mut out = Vec::new();
        s.on_live(seq, b("L"), now, &mut out);
        out
    }

    fn replay_id(out: &[Step<&'static str>]) -> u64 {
        out.iter()
            .find_map(|s| match s {
                Step::RequestReplay { id, .. } => Some(*id),
                _ => None,
            })
            .expect("a replay request")
    }

    fn exact_from_zero(replay: bool) -> Seq {
        let mut s = Seq::new(cfg(replay));
        for seq in 0..3 {
            live(&mut s, seq, 0);
        }
        assert_eq!(s.state(), Exact);
        s
    }

    #[test]
    fn first_batch_at_zero_is_exact() {
        let mut s = Seq::new(cfg(false));
        let out = live(&mut s, 0, 0);
        assert_eq!(actions(&out), ["apply 0 L"]);
        assert!(out.contains(&Step::Transition { from: Connecting, to: Exact, reason: Reason::FirstBatch }));
        assert_eq!(live(&mut s, 1, 1).len(), 1);
        assert_eq!(s.last_seq(), Some(1));
    }

    #[test]
    fn late_join_without_replay_is_degraded() {
        let mut s = Seq::new(cfg(false));
        let out = live(&mut s, 5, 0);
        assert_eq!(actions(&out), ["clear replay_unavailable", "apply 5 L"]);
        assert_eq!(s.state(), Degraded);
        // New stores still apply.
        assert_eq!(actions(&live(&mut s, 6, 1)), ["apply 6 L"]);
        assert_eq!(s.state(), Degraded);
    }

    #[test]
    fn late_join_with_replay_from_zero_is_exact() {
        let mut s = Seq::new(cfg(true));
        let out = live(&mut s, 3, 0);
        assert_eq!(actions(&out), ["replay 0"]);
        assert_eq!(s.state(), Replaying);
        let id = replay_id(&out);
        let mut out = Vec::new();
        for seq in 0..4 {
            s.on_replay_message(id, seq, b("R"), 1, &mut out);
        }
        live(&mut s, 4, 2); // held while the replay runs
        s.on_replay_end(id, 3, &mut out);
        assert_eq!(actions(&out), ["apply 0 R", "apply 1 R", "apply 2 R", "apply 3 R", "apply 4 L"]);
        assert!(out.contains(&Step::Duplicate { seq: 3 }));
        assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::Filled }));
        assert_eq!(s.state(), Exact);
        assert_eq!(s.last_seq(), Some(4));
    }

    #[test]
    fn late_join_with_replay_not_reaching_zero_is_degraded() {
        let mut s = Seq::new(cfg(true));
        let id = replay_id(&live(&mut s, 9, 0));
        let mut out = Vec::new();
        s.on_replay_message(id, 7, b("R"), 1, &mut out);
        s.on_replay_message(id, 8, b("R"), 1, &mut out);
        s.on_replay_message(id, 9, b("R"), 1, &mut out);
        s.on_replay_end(id, 1, &mut out);
        assert_eq!(actions(&out), ["clear replay_not_covered", "apply 7 R", "apply 8 R", "apply 9 R"]);
        assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::NotCovered }));
        assert_eq!(s.state(), Degraded);
    }

    #[test]
    fn gap_filled_by_replay_stays_exact_and_dedupes() {
        let mut s = exact_from_zero(true);
        let out = live(&mut s, 5, 10);
        assert!(out.contains(&Step::Gap { expected: 3, got: 5 }));
        assert_eq!(actions(&out), ["replay 3"]);
        let id = replay_id(&out);
        live(&mut s, 6, 11);
        let mut out = Vec::new();
        for seq in 3..7 {
            s.on_replay_message(id, seq, b("R"), 12, &mut out);
        }
        s.on_replay_end(id, 13, &mut out);
        assert_eq!(actions(&out), ["apply 3 R", "apply 4 R", "apply 5 R", "apply 6 R"]);
        assert_eq!(out.iter().filter(|s| matches!(s, Step::Duplicate { .. })).count(), 2);
        assert_eq!(s.state(), Exact);
        // Live messages the replay already covered but that arrive late are duplicates, not a restart.
        let out = live(&mut s, 7, 14);
        assert_eq!(actions(&out), ["apply 7 L"]);
        assert_eq!(s.stats().restarts, 0);
    }

    #[test]
    fn gap_beyond_the_buffer_clears_and_degrades() {
        let mut s = exact_from_zero(true);
        let id = replay_id(&live(&mut s, 10, 10));
        let mut out = Vec::new();
        s.on_replay_message(id, 8, b("R"), 11, &mut out);
        s.on_replay_message(id, 9, b("R"), 11, &mut out);
        s.on_replay_message(id, 10, b("R"), 11, &mut out);
        s.on_replay_end(id, 12, &mut out);
        assert_eq!(actions(&out), ["clear replay_not_covered", "apply 8 R", "apply 9 R", "apply 10 R"]);
        assert_eq!(s.state(), Degraded);
        assert!(out.contains(&Step::Transition { from: Replaying, to: Degraded, reason: Reason::ReplayNotCovered }));
    }

    #[test]
    fn gap_without_replay_clears_before_applying() {
        let mut s = exact_from_zero(false);
        let out = live(&mut s, 7, 1);
        assert_eq!(actions(&out), ["clear replay_unavailable", "apply 7 L"]);
        assert_eq!(s.state(), Degraded);
        // Degraded is sticky: later in-order data does not make it exact.
        live(&mut s, 8, 2);
        assert_eq!(s.state(), Degraded);
    }

    #[test]
    fn replay_failure_clears_applies_held_and_cools_down() {
        let mut s = exact_from_zero(true);
        let id = replay_id(&live(&mut s, 5, 100));
        let mut out = Vec::new();
        s.on_replay_failed(id, false, 101, &mut out);
        assert_eq!(actions(&out), ["clear replay_unavailable", "apply 5 L"]);
        assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::Unavailable }));
        assert_eq!(s.state(), Degraded);
        // Within the cooldown a new gap is cleared, not replayed.
        let out = live(&mut s, 9, 200);
        assert_eq!(actions(&out), ["clear replay_cooldown", "apply 9 L"]);
        // After it, gaps are replayed again.
        let out = live(&mut s, 12, 101 + 2_000);
        assert_eq!(actions(&out), ["replay 10"]);
    }

    #[test]
    fn replay_timeout_on_tick() {
        let mut s = exact_from_zero(true);
        let id = replay_id(&live(&mut s, 4, 100));
        let mut out = Vec::new();
        s.on_tick(599, &mut out);
        assert!(out.is_empty());
        s.on_tick(600, &mut out);
        assert_eq!(actions(&out), ["clear replay_timeout", "apply 4 L"]);
        assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::Timeout }));
        // A late reply of the abandoned replay is ignored.
        let mut late = Vec::new();
        s.on_replay_message(id, 3, b("R"), 601, &mut late);
        s.on_replay_end(id, 601, &mut late);
        assert!(late.is_empty());
    }

    #[test]
    fn restart_clears_and_resyncs_from_zero() {
        let mut s = exact_from_zero(true);
        live(&mut s, 3, 1);
        // Publisher restarted and we caught its seq 1 first (seq 0 lost to the slow joiner).
        let out = live(&mut s, 1, 2);
        assert_eq!(actions(&out), ["clear restart", "replay 0"]);
        let id = replay_id(&out);
        let mut out = Vec::new();
        s.on_replay_message(id, 0, b("R"), 3, &mut out);
        s.on_replay_message(id, 1, b("R"), 3, &mut out);
        s.on_replay_end(id, 3, &mut out);
        assert_eq!(actions(&out), ["apply 0 R", "apply 1 R"]);
        assert_eq!(s.state(), Exact);
        assert_eq!(s.stats().restarts, 1);
    }

    #[test]
    fn restart_at_zero_is_exact_immediately() {
        let mut s = exact_from_zero(false);
        let out = live(&mut s, 0, 5);
        assert_eq!(actions(&out), ["clear restart", "apply 0 L"]);
        assert_eq!(s.state(), Exact);
    }

    #[test]
    fn restart_of_a_degraded_pod_without_replay_past_zero_stays_degraded() {
        let mut s = exact_from_zero(false);
        live(&mut s, 9, 1);
        assert_eq!(s.state(), Degraded);
        let out = live(&mut s, 2, 2);
        assert_eq!(actions(&out), ["clear restart", "clear replay_unavailable", "apply 2 L"]);
        assert_eq!(s.state(), Degraded);
    }

    #[test]
    fn degraded_returns_to_exact_only_after_full_resync() {
        let mut s = exact_from_zero(true);
        let id = replay_id(&live(&mut s, 10, 1));
        let mut out = Vec::new();
        s.on_replay_message(id, 9, b("R"), 2, &mut out);
        s.on_replay_end(id, 2, &mut out);
        assert_eq!(s.state(), Degraded);
        live(&mut s, 11, 3);
        assert_eq!(s.state(), Degraded);
        // Publisher restart; the replay from 0 covers everything.
        let out = live(&mut s, 0, 4);
        assert_eq!(actions(&out), ["clear restart", "apply 0 L"]);
        assert_eq!(s.state(), Exact);
    }

    #[test]
    fn reconnect_with_seq_ahead_resyncs_from_zero() {
        let mut s = exact_from_zero(true);
        live(&mut s, 3, 1);
        // New connection; the (possibly new) publisher is already at seq 9.
        s.on_reconnect();
        let out = live(&mut s, 9, 2);
        assert_eq!(actions(&out), ["clear reconnect", "replay 0"]);
        let id = replay_id(&out);
        let mut out = Vec::new();
        for seq in 0..10 {
            s.on_replay_message(id, seq, b("R"), 3, &mut out);
        }
        s.on_replay_end(id, 3, &mut out);
        assert_eq!(s.state(), Exact);
        assert_eq!(s.last_seq(), Some(9));
        // Only the first message after a reconnect is affected.
        assert_eq!(actions(&live(&mut s, 10, 4)), ["apply 10 L"]);
    }

    #[test]
    fn reconnect_without_replay_degrades() {
        let mut s = exact_from_zero(false);
        s.on_reconnect();
        let out = live(&mut s, 3, 1);
        assert_eq!(actions(&out), ["clear reconnect", "clear replay_unavailable", "apply 3 L"]);
        assert_eq!(s.state(), Degraded);
    }

    #[test]
    fn reconnect_before_any_data_is_nothing() {
        let mut s = Seq::new(cfg(false));
        s.on_reconnect();
        assert_eq!(actions(&live(&mut s, 0, 1)), ["apply 0 L"]);
        assert_eq!(s.state(), Exact);
    }

    #[test]
    fn restart_during_replay_abandons_it() {
        let mut s = exact_from_zero(true);
        let id = replay_id(&live(&mut s, 6, 1));
        live(&mut s, 7, 1);
        let out = live(&mut s, 0, 2);
        assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::Abandoned }));
        assert_eq!(actions(&out), ["clear restart", "apply 0 L"]);
        let mut late = Vec::new();
        s.on_replay_message(id, 3, b("R"), 3, &mut late);
        assert!(late.is_empty());
        assert_eq!(s.state(), Exact);
    }

    #[test]
    fn malformed_payload_in_order_clears_and_degrades() {
        let mut s = exact_from_zero(true);
        let mut out = Vec::new();
        s.on_live(3, Item::Malformed, 1, &mut out);
        assert_eq!(actions(&out), ["clear malformed"]);
        assert_eq!(s.state(), Degraded);
        assert_eq!(actions(&live(&mut s, 4, 2)), ["apply 4 L"]);
        assert_eq!(s.stats().malformed, 1);
    }

    #[test]
    fn malformed_copy_in_replay_degrades() {
        let mut s = exact_from_zero(true);
        let id = replay_id(&live(&mut s, 4, 1));
        let mut out = Vec::new();
        s.on_replay_message(id, 3, Item::Malformed, 2, &mut out);
        s.on_replay_message(id, 4, b("R"), 2, &mut out);
        s.on_replay_end(id, 2, &mut out);
        assert_eq!(actions(&out), ["clear malformed", "apply 4 R"]);
        assert_eq!(s.state(), Degraded);
    }

    #[test]
    fn pending_overflow_abandons_the_replay() {
        let mut s = exact_from_zero(true);
        let id = replay_id(&live(&mut s, 4, 1));
        for seq in 5..8 {
            live(&mut s, seq, 1);
        }
        assert_eq!(s.pending(), 4);
        let out = live(&mut s, 8, 2);
        assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::Abandoned }));
        assert_eq!(actions(&out), ["clear pending_overflow", "clear replay_cooldown", "apply 8 L"]);
        assert_eq!(s.state(), Degraded);
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn second_gap_after_a_productive_replay_is_replayed_again() {
        let mut s = exact_from_zero(true);
        let id = replay_id(&live(&mut s, 5, 1));
        live(&mut s, 9, 1); // 6..8 dropped too
        let mut out = Vec::new();
        for seq in 3..6 {
            s.on_replay_message(id, seq, b("R"), 2, &mut out);
        }
        s.on_replay_end(id, 2, &mut out);
        assert_eq!(actions(&out), ["apply 3 R", "apply 4 R", "apply 5 R", "replay 6"]);
        assert_eq!(s.state(), Replaying);
        let id2 = replay_id(&out[out.len() - 2..]);
        let mut out = Vec::new();
        for seq in 6..10 {
            s.on_replay_message(id2, seq, b("R"), 3, &mut out);
        }
        s.on_replay_end(id2, 3, &mut out);
        assert_eq!(actions(&out), ["apply 6 R", "apply 7 R", "apply 8 R", "apply 9 R"]);
        assert_eq!(s.state(), Exact);
    }

    #[test]
    fn unproductive_replay_does_not_loop() {
        let mut s = exact_from_zero(true);
        let id = replay_id(&live(&mut s, 6, 1));
        let mut out = Vec::new();
        s.on_replay_end(id, 2, &mut out); // empty replay
        assert_eq!(actions(&out), ["clear replay_filled", "apply 6 L"]);
        assert_eq!(s.state(), Degraded);
    }

    #[test]
    fn initial_sync_before_any_live_message() {
        let mut s = Seq::new(cfg(true));
        let mut out = Vec::new();
        s.start_initial_sync(0, &mut out);
        let id = replay_id(&out);
        assert_eq!(s.state(), Replaying);
        let mut out = Vec::new();
        s.on_replay_end(id, 1, &mut out); // publisher has published nothing yet
        assert_eq!(s.state(), Exact);
        assert_eq!(actions(&live(&mut s, 0, 2)), ["apply 0 L"]);
    }

    #[test]
    fn failed_initial_sync_loses_nothing_yet() {
        let mut s = Seq::new(cfg(true));
        let mut out = Vec::new();
        s.start_initial_sync(0, &mut out);
        let id = replay_id(&out);
        let mut out = Vec::new();
        s.on_replay_failed(id, false, 1, &mut out);
        assert!(actions(&out).is_empty());
        assert_eq!(s.state(), Connecting);
        assert_eq!(actions(&live(&mut s, 0, 2)), ["apply 0 L"]);
        assert_eq!(s.state(), Exact);
    }

    #[test]
    fn stale_and_back() {
        let mut s = exact_from_zero(false);
        let mut out = Vec::new();
        s.on_tick(999, &mut out);
        assert!(out.is_empty());
        s.on_tick(1_000, &mut out);
        assert_eq!(out, vec![Step::Transition { from: Exact, to: Stale, reason: Reason::Silent }]);
        let out = live(&mut s, 3, 1_500);
        assert_eq!(out[0], Step::Transition { from: Stale, to: Exact, reason: Reason::Data });
        // A degraded pod returns to DEGRADED, not EXACT.
        live(&mut s, 9, 1_600);
        let mut out = Vec::new();
        s.on_tick(5_000, &mut out);
        assert_eq!(s.state(), Stale);
        live(&mut s, 10, 5_001);
        assert_eq!(s.state(), Degraded);
    }

    /// A reference model: the publisher's seq stream with random drops, replay buffer depth,
    /// restarts and malformed payloads. The invariant: whenever the sequencer says EXACT, the
    /// applied seqs since the last clear are exactly 0..=last of the current publisher process,
    /// and no batch of an older process or a skipped seq is applied after the last clear.
    #[test]
    fn randomized_never_guesses() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rand = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for _round in 0..300 {
            let buffer = 1 + rand(8);
            let replay = rand(4) != 0;
            let mut s: Sequencer<(u64, u64)> = Sequencer::new(SequencerConfig {
                replay,
                stale_after_ms: u64::MAX,
                replay_timeout_ms: 1_000,
                replay_cooldown_ms: rand(3) * 10,
                max_pending: 1 + rand(6) as usize,
            });
            let mut proc_id = 0u64;
            let mut published: Vec<(u64, bool)> = Vec::new(); // (seq, malformed) of the current process
            // What the index holds since the last clear: (process, seq).
            let mut applied: Vec<(u64, u64)> = Vec::new();
            let mut now = 0;
            let mut restarted = false;
            for _ in 0..60 {
                now += 1;
                let mut out = Vec::new();
                match rand(20) {
                    0 => {
                        // A restart is a new process on a new connection.
                        proc_id += 1;
                        published.clear();
                        restarted = true;
                        s.on_reconnect();
                    }
                    19 => s.on_reconnect(), // a network blip: same process, new connection
                    1 => s.on_tick(now + 10_000, &mut out),
                    _ => {
                        let seq = published.len() as u64;
                        let malformed = rand(15) == 0;
                        published.push((seq, malformed));
                        if rand(5) != 0 {
                            restarted = false;
                            let item = if malformed { Item::Malformed } else { Item::Batch((proc_id, seq)) };
                            s.on_live(seq, item, now, &mut out);
                        }
                    }
                }
                // Serve any replay from the current process's buffer, sometimes failing.
                let mut guard = 0;
                loop {
                    guard += 1;
                    assert!(guard < 100);
                    let req = out.iter().rev().find_map(|st| match st {
                        Step::RequestReplay { id, from } => Some((*id, *from)),
                        _ => None,
                    });
                    consume(&out, &mut applied);
                    out.clear();
                    let Some((id, from)) = req else { break };
                    if s.replay_in_flight() != Some((id, from)) {
                        break;
                    }
                    if rand(6) == 0 {
                        s.on_replay_failed(id, rand(2) == 0, now, &mut out);
                        continue;
                    }
                    let lo = (published.len() as u64).saturating_sub(buffer);
                    for &(seq, malformed) in published.iter().filter(|(q, _)| *q >= from.max(lo)) {
                        let item = if malformed { Item::Malformed } else { Item::Batch((proc_id, seq)) };
                        s.on_replay_message(id, seq, item, now, &mut out);
                    }
                    s.on_replay_end(id, now, &mut out);
                }
                if !restarted && (s.state() == Exact || (s.state() == Stale && !s.is_degraded())) {
                    let last = s.last_seq().expect("exact implies a cursor");
                    let want: Vec<(u64, u64)> = (0..=last).map(|q| (proc_id, q)).collect();
                    assert_eq!(applied, want, "EXACT must hold exactly 0..=last of the current process");
                }
                // Never anything from an older process, never a seq twice.
                if !restarted {
                    assert!(applied.iter().all(|(p, _)| *p == proc_id), "a batch of an older process survived a restart");
                }
                let mut seqs: Vec<u64> = applied.iter().map(|a| a.1).collect();
                seqs.dedup();
                assert_eq!(seqs.len(), applied.len());
            }
        }

        fn consume(out: &[Step<(u64, u64)>], applied: &mut Vec<(u64, u64)>) {
            for st in out {
                match st {
                    Step::Apply { batch, .. } => applied.push(*batch),
                    Step::Clear { .. } => applied.clear(),
                    _ => {}
                }
            }
        }
    }
}
