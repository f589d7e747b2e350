//! Catching up on a new live connection.
//!
//! A SUB learns only what its publisher sends after our subscription reached it: a batch
//! published before (the engine stored while our dialer was backing off, or while the
//! connection was down) never comes on the connection, and the gap rules see it only when the
//! publisher sends again. An idle engine may not, for a long time. So when a live connection
//! opens, a publisher with a replay socket is asked for everything after the cursor (from 0
//! when the stream holds nothing, as after a disconnect): what it published before our
//! subscription is learned at once, by the replay rules every replay follows (overlap is a
//! duplicate, a buffer that no longer reaches the cursor degrades, stores and removes apply in
//! seq order).
//!
//! The catch-up waits for a replay in flight (which may have been asked before the
//! subscription) and for the cooldown after a failed one, then goes; a live message on the
//! connection makes it needless (what came before that message is the gap rules' then). One
//! that fails (refused, timed out) is tried again after the cooldown, at most
//! [`MAX_CATCH_UP_TRIES`] times per connection: an engine binds its replay socket beside its
//! PUB, not always first.

use super::{Millis, Reason, Sequencer, Step};

/// Catch-up replays asked at most per live connection.
pub const MAX_CATCH_UP_TRIES: u8 = 3;

impl<P> Sequencer<P> {
    /// A live connection to the publisher opened (before any message on it). With a replay
    /// socket, asks it for what was published before our subscription, now or as soon as no
    /// replay is in flight and the cooldown is over (on a tick).
    ///
    /// Given after [`Sequencer::on_reconnect`] when the connection replaced one that carried
    /// the stream: what that connection brought is then not trusted (the publisher may be a new
    /// process), so the stream is cleared now and caught up from 0 instead of at its next
    /// message. Without a replay socket nothing changes here (the next message resyncs).
    ///
    /// The same for the first connection after a start-up replay that was answered before it
    /// (the engine's PUB was out of reach while its replay socket answered): the process that
    /// answered may have restarted before our dialer reached its PUB, and the new one's seqs
    /// then sit below the cursor (dropped as duplicates) or past it (applied onto the old
    /// process's blocks). Its history is read again from 0, which re-learns everything the
    /// start-up replay brought that the engine still holds. A start-up replay still in flight
    /// when the connection opens is answered by the process the connection reaches (a restart
    /// inside that window is not told apart), so the catch-up waits for it and asks from its
    /// cursor. A stream resumed from a snapshot keeps its cursor: its proof is the resume
    /// rules'.
    pub fn on_connected(&mut self, now: Millis, out: &mut Vec<Step<P>>) {
        if !self.config.replay {
            return;
        }
        let start_up_in_flight = self.replay.as_ref().is_some_and(|r| r.reason == Reason::InitialSync);
        let first_after_sync = std::mem::take(&mut self.synced_unconnected) && !start_up_in_flight;
        if (self.reconnected || first_after_sync) && self.holds_any() {
            self.restart(Reason::Reconnect, out);
            self.last_live = None;
        }
        self.reconnected = false;
        self.catch_up = true;
        self.catch_up_tries = 0;
        self.try_catch_up(now, out);
    }

    /// Whether a catch-up is still to be asked.
    pub fn catch_up_wanted(&self) -> bool {
        self.catch_up
    }

    /// Asks the catch-up if one is wanted and may go now.
    pub(super) fn try_catch_up(&mut self, now: Millis, out: &mut Vec<Step<P>>) {
        if !self.catch_up || self.replay.is_some() || !self.can_replay(now) {
            return;
        }
        self.catch_up = false;
        self.catch_up_tries += 1;
        let from = self.next.unwrap_or(0);
        self.start_replay(from, now, Reason::CatchUp, out);
    }

    /// A catch-up replay could not be carried out: tried again after the cooldown, within
    /// [`MAX_CATCH_UP_TRIES`].
    pub(super) fn catch_up_failed(&mut self) {
        self.catch_up = self.catch_up_tries < MAX_CATCH_UP_TRIES;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Item, ReplayOutcome, SequencerConfig, SourceState, Step};
    use super::*;

    type Seq = Sequencer<u64>;

    fn cfg() -> SequencerConfig {
        SequencerConfig { replay_cooldown_ms: 2_000, replay_timeout_ms: 500, ..Default::default() }
    }

    /// `(from, reason)` of the replay `out` asks, if it asks one.
    fn asked(out: &[Step<u64>]) -> Option<(u64, Reason)> {
        out.iter().find_map(|s| match s {
            Step::RequestReplay { from, reason, .. } => Some((*from, *reason)),
            _ => None,
        })
    }

    fn applied(out: &[Step<u64>]) -> Vec<u64> {
        out.iter().filter_map(|s| if let Step::Apply { seq, .. } = s { Some(*seq) } else { None }).collect()
    }

    fn cleared(out: &[Step<u64>]) -> bool {
        out.iter().any(|s| matches!(s, Step::Clear { .. }))
    }

    /// Answers the replay in flight with `seqs`, then its end marker.
    fn answer(s: &mut Seq, seqs: &[u64], now: Millis) -> Vec<Step<u64>> {
        let (id, _) = s.replay_in_flight().expect("a replay in flight");
        let mut out = Vec::new();
        for &seq in seqs {
            s.on_replay_message(id, seq, Item::Batch(seq), now, &mut out);
        }
        s.on_replay_end(id, now, &mut out);
        out
    }

    /// A stream filled to seq 2 by its start-up replay, with no live connection yet.
    fn synced_to_two() -> Seq {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        s.start_initial_sync(0, &mut out);
        answer(&mut s, &[0, 1, 2], 1);
        assert_eq!(s.state(), SourceState::Exact);
        s
    }

    /// A stream restored from a snapshot at seq 2, whose resume replay brought nothing new.
    fn resumed_at_two() -> Seq {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        s.resume(2, 0, &mut out);
        assert_eq!(asked(&out), Some((3, Reason::InitialSync)));
        answer(&mut s, &[], 1);
        s
    }

    #[test]
    fn a_new_stream_asks_from_zero_and_learns_what_came_before_the_subscription() {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        s.on_connected(0, &mut out);
        assert_eq!(asked(&out), Some((0, Reason::CatchUp)));
        assert_eq!(s.state(), SourceState::Replaying);
        let out = answer(&mut s, &[0], 1);
        assert_eq!(applied(&out), vec![0]);
        assert_eq!(s.state(), SourceState::Exact);
        assert!(!s.catch_up_wanted());
        // The publisher's next batch continues the stream.
        let mut out = Vec::new();
        s.on_live(1, Item::Batch(1), 2, &mut out);
        assert_eq!(applied(&out), vec![1]);
    }

    #[test]
    fn a_stream_with_a_cursor_asks_after_it_and_the_overlap_is_a_duplicate() {
        let mut s = resumed_at_two();
        let mut out = Vec::new();
        s.on_connected(2, &mut out);
        assert_eq!(asked(&out), Some((3, Reason::CatchUp)));
        // A ROUTER answering from an older seq: what is applied already is dropped.
        let out = answer(&mut s, &[1, 2, 3, 4], 3);
        assert_eq!(applied(&out), vec![3, 4]);
        assert_eq!(out.iter().filter(|s| matches!(s, Step::Duplicate { .. })).count(), 2);
        assert!(!cleared(&out));
        assert_eq!(s.state(), SourceState::Exact);
        assert_eq!(s.last_seq(), Some(4));
    }

    #[test]
    fn nothing_new_leaves_the_stream_as_it_was() {
        let mut s = resumed_at_two();
        let mut out = Vec::new();
        s.on_connected(2, &mut out);
        let out = answer(&mut s, &[], 3);
        assert!(applied(&out).is_empty() && !cleared(&out));
        assert!(out.iter().any(|s| matches!(s, Step::ReplayDone { outcome: ReplayOutcome::Filled, .. })));
        assert_eq!((s.state(), s.last_seq()), (SourceState::Exact, Some(2)));
    }

    #[test]
    fn a_buffer_that_no_longer_reaches_the_cursor_clears_and_degrades() {
        let mut s = resumed_at_two();
        let mut out = Vec::new();
        s.on_connected(2, &mut out);
        let out = answer(&mut s, &[6, 7], 3);
        assert!(cleared(&out), "3..=5 are lost: what the pod held is not trusted");
        assert_eq!(applied(&out), vec![6, 7]);
        assert_eq!(s.state(), SourceState::Degraded);
    }

    /// The engine restarted between the start-up replay and our dialer reaching its PUB: the
    /// new process's seq 0 is below the cursor (a duplicate by seq alone) and its buffer holds
    /// nothing past it, so only a catch-up from 0 tells the old blocks from the new.
    #[test]
    fn the_first_connection_after_a_start_up_replay_clears_and_catches_up_from_zero() {
        let mut s = synced_to_two();
        let mut out = Vec::new();
        s.on_connected(2, &mut out);
        assert!(cleared(&out), "the start-up replay's process may not be the one we reached");
        assert_eq!(asked(&out), Some((0, Reason::CatchUp)));
        let out = answer(&mut s, &[0], 3);
        assert_eq!(applied(&out), vec![0]);
        assert_eq!((s.state(), s.last_seq()), (SourceState::Exact, Some(0)));
        // The new process's next batch continues the stream; a later connection is a reconnect.
        let mut out = Vec::new();
        s.on_live(1, Item::Batch(1), 4, &mut out);
        assert_eq!((applied(&out), cleared(&out)), (vec![1], false));
    }

    #[test]
    fn waits_for_the_start_up_replay_in_flight_then_catches_up_from_its_cursor() {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        s.start_initial_sync(0, &mut out);
        let mut out = Vec::new();
        s.on_connected(1, &mut out);
        assert_eq!(asked(&out), None, "one replay at a time");
        assert!(!cleared(&out), "the replay in flight is answered by the process the connection reaches");
        assert!(s.catch_up_wanted());
        // The start-up replay was answered before the subscription reached the publisher, which
        // published seq 1 in between: only the catch-up brings it.
        answer(&mut s, &[0], 2);
        let mut out = Vec::new();
        s.on_tick(3, &mut out);
        assert_eq!(asked(&out), Some((1, Reason::CatchUp)));
        assert_eq!(applied(&answer(&mut s, &[0, 1], 4)), vec![1]);
        assert_eq!(s.state(), SourceState::Exact);
    }

    #[test]
    fn waits_for_the_cooldown_after_a_refused_start_up_replay() {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        s.start_initial_sync(0, &mut out);
        let (id, _) = s.replay_in_flight().unwrap();
        s.on_replay_failed(id, false, 10, &mut out); // the engine was not up
        assert_eq!(s.state(), SourceState::Connecting);
        let mut out = Vec::new();
        s.on_connected(500, &mut out);
        s.on_tick(2_000, &mut out);
        assert_eq!(asked(&out), None);
        s.on_tick(2_010, &mut out);
        assert_eq!(asked(&out), Some((0, Reason::CatchUp)));
        assert_eq!(applied(&answer(&mut s, &[0], 2_020)), vec![0]);
        assert_eq!(s.state(), SourceState::Exact);
    }

    #[test]
    fn a_live_message_first_makes_it_needless() {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        s.start_initial_sync(0, &mut out);
        let (id, _) = s.replay_in_flight().unwrap();
        s.on_replay_failed(id, false, 10, &mut out); // the engine was not up: cooling down
        s.on_connected(500, &mut out);
        assert!(s.catch_up_wanted());
        let mut out = Vec::new();
        s.on_live(0, Item::Batch(0), 600, &mut out);
        assert_eq!(applied(&out), vec![0]);
        let mut out = Vec::new();
        s.on_tick(2_010, &mut out);
        assert_eq!(asked(&out), None, "seq 0 came live: nothing before it is missing");
        assert!(!s.catch_up_wanted());
    }

    #[test]
    fn a_live_message_held_behind_the_start_up_replay_makes_it_needless() {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        s.start_initial_sync(0, &mut out);
        s.on_connected(1, &mut out);
        s.on_live(1, Item::Batch(1), 2, &mut out); // held behind the start-up replay
        let out = answer(&mut s, &[0], 3);
        assert_eq!(applied(&out), vec![0, 1]);
        let mut out = Vec::new();
        s.on_tick(4, &mut out);
        assert_eq!(asked(&out), None, "seq 1 came live: nothing before it is missing");
        assert!(!s.catch_up_wanted());
    }

    #[test]
    fn a_failed_catch_up_is_tried_again_after_the_cooldown_a_few_times() {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        s.on_connected(0, &mut out);
        let mut now = 0;
        for attempt in 1..=MAX_CATCH_UP_TRIES {
            assert_eq!(asked(&out), Some((0, Reason::CatchUp)), "attempt {attempt}");
            let (id, _) = s.replay_in_flight().unwrap();
            let mut failed = Vec::new();
            s.on_replay_failed(id, attempt % 2 == 0, now + 1, &mut failed);
            assert!(!cleared(&failed), "nothing was held, nothing is lost");
            assert_eq!(s.state(), SourceState::Connecting);
            now += 1 + 2_000;
            out.clear();
            s.on_tick(now, &mut out);
        }
        assert_eq!(asked(&out), None, "at most {MAX_CATCH_UP_TRIES} per connection");
        assert!(!s.catch_up_wanted());
        // The next connection tries again.
        let mut out = Vec::new();
        s.on_connected(now, &mut out);
        assert_eq!(asked(&out), Some((0, Reason::CatchUp)));
    }

    #[test]
    fn a_disconnect_drops_a_pending_catch_up() {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        s.start_initial_sync(0, &mut out);
        s.on_connected(1, &mut out);
        s.on_disconnect(&mut out);
        let mut out = Vec::new();
        s.on_tick(5_000, &mut out);
        assert_eq!(asked(&out), None);
    }

    #[test]
    fn a_connection_that_replaces_a_live_one_clears_and_catches_up_from_zero() {
        let mut s = Seq::new(cfg());
        let mut out = Vec::new();
        for seq in 0..3 {
            s.on_live(seq, Item::Batch(seq), 0, &mut out);
        }
        s.on_reconnect();
        let mut out = Vec::new();
        s.on_connected(1, &mut out);
        assert!(cleared(&out), "the old connection's batches may be another process's");
        assert_eq!(asked(&out), Some((0, Reason::CatchUp)));
        assert_eq!(applied(&answer(&mut s, &[0, 1, 2, 3], 2)), vec![0, 1, 2, 3]);
        // Its next live message continues the stream (no second resync).
        let mut out = Vec::new();
        s.on_live(4, Item::Batch(4), 3, &mut out);
        assert_eq!((applied(&out), cleared(&out)), (vec![4], false));
        assert_eq!(s.state(), SourceState::Exact);
    }

    #[test]
    fn without_a_replay_socket_nothing_is_asked() {
        let mut s = Seq::new(SequencerConfig { replay: false, ..cfg() });
        let mut out = Vec::new();
        s.on_connected(0, &mut out);
        s.on_tick(10_000, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.state(), SourceState::Connecting);
    }
}
