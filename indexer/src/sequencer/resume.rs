//! Resuming a stream from a snapshot's cursor (warm restarts).
//!
//! The index was restored with the pod's residencies as of seq `cursor`. The stream continues at
//! `cursor + 1`: a replay from there when the publisher has a replay socket, else the live
//! stream itself. Continuity is only proven by the next seq arriving: until a batch is applied
//! the stream is *resumed*, and a live seq at or below the cursor means the publisher restarted
//! while we were away, so the pod is cleared and resynced as for any restart. A replay whose
//! buffer no longer reaches `cursor + 1` loses the range and clears the pod (DEGRADED), as for
//! any gap. The shell keeps the restored residencies out of the index until the first batch
//! applies (see the server's `snapshot` module), so nothing unproven is ever scored.

use super::{Millis, Reason, Sequencer, Step};

impl<P> Sequencer<P> {
    /// Continues a stream whose state was restored as of seq `cursor` (before any message).
    pub fn resume(&mut self, cursor: u64, now: Millis, out: &mut Vec<Step<P>>) {
        self.next = Some(cursor.saturating_add(1));
        self.resumed = true;
        if self.replay.is_none() && self.can_replay(now) {
            self.start_replay(cursor.saturating_add(1), now, Reason::InitialSync, out);
        }
    }

    /// Restored and not yet proven: whether live `seq` shows the publisher started over.
    pub(super) fn resumed_behind(&self, seq: u64) -> bool {
        self.resumed && self.next.is_some_and(|next| seq < next)
    }

    /// Whether the stream still runs on a snapshot's cursor with no batch applied since.
    pub fn is_resumed(&self) -> bool {
        self.resumed
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Item, ReplayOutcome, SequencerConfig, SourceState, Step};
    use super::*;

    type Seq = Sequencer<u64>;

    fn applied(out: &[Step<u64>]) -> Vec<u64> {
        out.iter().filter_map(|s| if let Step::Apply { seq, .. } = s { Some(*seq) } else { None }).collect()
    }

    fn cleared(out: &[Step<u64>]) -> bool {
        out.iter().any(|s| matches!(s, Step::Clear { .. }))
    }

    #[test]
    fn replay_from_the_cursor_fills_and_goes_exact() {
        let mut s = Seq::new(SequencerConfig::default());
        let mut out = Vec::new();
        s.resume(41, 0, &mut out);
        assert_eq!(out[0], Step::RequestReplay { id: 1, from: 42, reason: Reason::InitialSync });
        assert!(s.is_resumed());
        s.on_live(45, Item::Batch(45), 1, &mut out);
        for seq in 42..=44 {
            s.on_replay_message(1, seq, Item::Batch(seq), 2, &mut out);
        }
        s.on_replay_end(1, 3, &mut out);
        assert_eq!(applied(&out), vec![42, 43, 44, 45]);
        assert!(!cleared(&out));
        assert_eq!(s.state(), SourceState::Exact);
        assert!(!s.is_resumed());
    }

    #[test]
    fn a_buffer_that_no_longer_reaches_the_cursor_clears_and_degrades() {
        let mut s = Seq::new(SequencerConfig::default());
        let mut out = Vec::new();
        s.resume(41, 0, &mut out);
        s.on_replay_message(1, 50, Item::Batch(50), 1, &mut out);
        s.on_replay_end(1, 2, &mut out);
        assert!(cleared(&out));
        assert!(out.iter().any(|s| matches!(s, Step::ReplayDone { outcome: ReplayOutcome::NotCovered, .. })));
        assert_eq!(s.state(), SourceState::Degraded);
    }

    #[test]
    fn a_publisher_that_restarted_while_we_were_away_is_cleared_not_merged() {
        let mut s = Seq::new(SequencerConfig { replay: false, ..Default::default() });
        let mut out = Vec::new();
        s.resume(41, 0, &mut out);
        assert!(out.is_empty(), "no replay socket: wait for the live stream");
        s.on_live(3, Item::Batch(3), 1, &mut out);
        assert!(cleared(&out), "seq 3 after cursor 41 is a new process");
        assert!(!applied(&out).contains(&41));
        assert!(!s.is_resumed());
    }

    #[test]
    fn without_replay_the_next_seq_proves_continuity_and_a_gap_loses() {
        let mut s = Seq::new(SequencerConfig { replay: false, ..Default::default() });
        let mut out = Vec::new();
        s.resume(41, 0, &mut out);
        s.on_live(42, Item::Batch(42), 1, &mut out);
        assert_eq!(applied(&out), vec![42]);
        assert!(!cleared(&out));
        let mut s = Seq::new(SequencerConfig { replay: false, ..Default::default() });
        let mut out = Vec::new();
        s.resume(41, 0, &mut out);
        s.on_live(44, Item::Batch(44), 1, &mut out);
        assert!(cleared(&out));
        assert_eq!(s.state(), SourceState::Degraded);
    }
}
