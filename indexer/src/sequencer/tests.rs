//! The sequencer driven step by step: every transition of the state machine, and a randomized
//! run that checks it never applies a batch it cannot account for.

use super::*;
use SourceState::*;

type Seq = Sequencer<&'static str>;

fn cfg(replay: bool) -> SequencerConfig {
    SequencerConfig {
        replay,
        stale_after_ms: 1_000,
        replay_timeout_ms: 500,
        replay_queue_timeout_ms: 500,
        replay_cooldown_ms: 2_000,
        max_pending: 4,
    }
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
fn a_queued_replay_waits_for_its_slot_then_has_the_replay_timeout() {
    let mut s = Seq::new(SequencerConfig { replay_queue_timeout_ms: 10_000, ..cfg(true) });
    let mut out = Vec::new();
    s.on_live(0, b("L"), 0, &mut out);
    let id = replay_id(&live(&mut s, 4, 100));
    // Queued far past the replay timeout (500 ms): not abandoned, nothing cleared.
    let mut out = Vec::new();
    s.on_tick(5_000, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(s.state(), SourceState::Replaying);
    // Begun at 8 s: the replay timeout counts from there.
    s.on_replay_begun(id, 8_000);
    s.on_tick(8_499, &mut out);
    assert!(out.is_empty(), "{out:?}");
    s.on_replay_message(id, 1, b("R1"), 8_450, &mut out);
    s.on_replay_message(id, 2, b("R2"), 8_450, &mut out);
    s.on_replay_message(id, 3, b("R3"), 8_450, &mut out);
    s.on_replay_end(id, 8_460, &mut out);
    assert_eq!(actions(&out), ["apply 1 R1", "apply 2 R2", "apply 3 R3", "apply 4 L"]);
    assert_eq!(s.state(), SourceState::Exact);
    // A replay never begun is abandoned after the queue timeout, and one begun after the
    // replay timeout.
    let id = replay_id(&live(&mut s, 6, 9_000));
    let mut out = Vec::new();
    s.on_tick(18_999, &mut out);
    assert!(out.is_empty(), "{out:?}");
    s.on_tick(19_000, &mut out);
    assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::Timeout }), "{out:?}");
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
fn a_new_epoch_clears_like_a_restart_whatever_its_seq() {
    let mut s = exact_from_zero(true);
    let (a, b2) = ([1u8; 16], [2u8; 16]);
    let mut out = Vec::new();
    s.on_epoch(Some(a), &mut out);
    s.on_live(3, b("L"), 1, &mut out);
    s.on_epoch(Some(a), &mut out);
    s.on_live(4, b("L"), 1, &mut out);
    assert_eq!(actions(&out), ["apply 3 L", "apply 4 L"], "the same epoch is the same stream");
    // A new process whose seq already moved past ours: seq alone would take it as a gap.
    let mut out = Vec::new();
    s.on_epoch(Some(b2), &mut out);
    s.on_live(9, b("L"), 2, &mut out);
    assert_eq!(actions(&out), ["clear epoch", "replay 0"]);
    assert_eq!(s.stats().restarts, 1);
    // A new epoch at seq 0 applies at once, with a single clear.
    let mut s = exact_from_zero(false);
    let mut out = Vec::new();
    s.on_epoch(Some(a), &mut out);
    s.on_live(3, b("L"), 1, &mut out);
    s.on_epoch(Some(b2), &mut out);
    s.on_live(0, b("L"), 2, &mut out);
    assert_eq!(actions(&out), ["apply 3 L", "clear epoch", "apply 0 L"]);
    s.on_epoch(None, &mut out);
    assert_eq!(s.stats().restarts, 1, "a message without an epoch changes nothing");
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
fn disconnect_clears_and_the_next_publisher_starts_over() {
    let mut s = exact_from_zero(false);
    let mut out = Vec::new();
    s.on_disconnect(&mut out);
    assert_eq!(actions(&out), ["clear disconnect"]);
    assert!(out.contains(&Step::Transition { from: Exact, to: Connecting, reason: Reason::Disconnect }));
    assert_eq!((s.last_seq(), s.last_live_seq(), s.stats().disconnects), (None, None, 1));
    // The new process starts at seq 0: applied at once, no second clear.
    let out = live(&mut s, 0, 1);
    assert_eq!(actions(&out), ["apply 0 L"]);
    assert_eq!(s.state(), Exact);
}

#[test]
fn disconnect_then_a_publisher_ahead_replays_from_zero() {
    let mut s = exact_from_zero(true);
    let mut out = Vec::new();
    s.on_disconnect(&mut out);
    assert_eq!(actions(&live(&mut s, 5, 1)), ["replay 0"]);
    assert_eq!(s.state(), Replaying);
}

#[test]
fn disconnect_during_replay_abandons_it() {
    let mut s = exact_from_zero(true);
    let id = replay_id(&live(&mut s, 6, 1));
    let mut out = Vec::new();
    s.on_disconnect(&mut out);
    assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::Abandoned }));
    assert_eq!(actions(&out), ["clear disconnect"]);
    assert_eq!((s.state(), s.pending()), (Connecting, 0));
    let mut late = Vec::new();
    s.on_replay_message(id, 3, b("R"), 2, &mut late);
    assert!(late.is_empty());
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
            replay_queue_timeout_ms: 1_000,
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
            let mut disconnected = false;
            match rand(20) {
                0 => {
                    // A restart is a new process on a new connection; the old connection's
                    // close is seen first (it clears at once), or only the new connection is.
                    proc_id += 1;
                    published.clear();
                    if rand(2) == 0 {
                        s.on_disconnect(&mut out);
                        disconnected = true;
                    } else {
                        restarted = true;
                        s.on_reconnect();
                    }
                }
                18 => {
                    // A network blip seen as a close: same process, new connection.
                    s.on_disconnect(&mut out);
                    disconnected = true;
                }
                19 => s.on_reconnect(), // a network blip: same process, new connection
                2 => s.on_connected(now, &mut out), // a new connection opens: catch up
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
                    Step::RequestReplay { id, from, .. } => Some((*id, *from)),
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
            if disconnected {
                assert!(applied.is_empty(), "a disconnect keeps nothing of the connection");
                assert_eq!(s.state(), Connecting);
            }
            if !restarted && (s.state() == Exact || (s.state() == Stale && !s.is_degraded())) {
                // A replay from 0 that found an empty buffer leaves an EXACT stream at seq 0 with
                // nothing applied.
                let want: Vec<(u64, u64)> = match s.last_seq() {
                    Some(last) => (0..=last).map(|q| (proc_id, q)).collect(),
                    None => Vec::new(),
                };
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

#[test]
fn the_largest_seq_does_not_overflow_the_cursor() {
    // A debug build panicked on `seq + 1` here; the gap is lost (no replay), never guessed.
    let mut s = exact_from_zero(false);
    let out = live(&mut s, u64::MAX, 1);
    assert_eq!(actions(&out), ["clear replay_unavailable", &format!("apply {} L", u64::MAX)]);
    assert_eq!(s.state(), Degraded);
}

#[test]
fn held_lists_the_batches_a_replay_holds_in_the_order_they_came() {
    let mut s = exact_from_zero(true);
    let id = replay_id(&live(&mut s, 4, 1));
    let mut out = Vec::new();
    s.on_live(5, Item::Malformed, 1, &mut out);
    s.on_live(6, b("six"), 1, &mut out);
    assert_eq!(s.held().copied().collect::<Vec<_>>(), ["L", "six"], "a malformed message holds no batch");
    assert_eq!((s.held_at(4), s.held_at(5), s.held_at(6), s.held_at(3)), (Some(&"L"), None, Some(&"six"), None));
    s.on_replay_end(id, 2, &mut out);
    assert_eq!(s.held().count(), 0);
}

/// The reason of the transition out of REPLAYING that `out` holds.
fn left_replaying_because(out: &[Step<&'static str>]) -> Option<(SourceState, Reason)> {
    out.iter().find_map(|s| match s {
        Step::Transition { from: Replaying, to, reason } => Some((*to, *reason)),
        _ => None,
    })
}

/// A filled replay that leaves the pod DEGRADED names the loss that degraded it: it used to
/// say `malformed` whatever that loss was.
#[test]
fn a_filled_replay_that_leaves_the_pod_degraded_names_the_loss() {
    // A malformed copy in the replay.
    let mut s = exact_from_zero(true);
    let id = replay_id(&live(&mut s, 4, 1));
    let mut out = Vec::new();
    s.on_replay_message(id, 3, Item::Malformed, 2, &mut out);
    s.on_replay_message(id, 4, b("R"), 2, &mut out);
    s.on_replay_end(id, 2, &mut out);
    assert_eq!(left_replaying_because(&out), Some((Degraded, Reason::Malformed)));

    // A hole inside the replay's own stream (it began at the asked seq: filled, not covered).
    let mut s = exact_from_zero(true);
    let id = replay_id(&live(&mut s, 6, 1));
    let mut out = Vec::new();
    s.on_replay_message(id, 3, b("R"), 2, &mut out);
    s.on_replay_message(id, 5, b("R"), 2, &mut out);
    s.on_replay_end(id, 2, &mut out);
    assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::Filled }));
    assert_eq!(left_replaying_because(&out), Some((Degraded, Reason::ReplayNotCovered)));

    // A loss before the replay: a failed one, then, past the cooldown, a gap that is filled.
    let mut s = exact_from_zero(true);
    let id = replay_id(&live(&mut s, 5, 100));
    s.on_replay_failed(id, false, 101, &mut Vec::new());
    assert_eq!(s.state(), Degraded);
    let id = replay_id(&live(&mut s, 8, 101 + 2_000));
    let mut out = Vec::new();
    s.on_replay_message(id, 6, b("R"), 2_102, &mut out);
    s.on_replay_message(id, 7, b("R"), 2_102, &mut out);
    s.on_replay_end(id, 2_102, &mut out);
    assert!(out.contains(&Step::ReplayDone { id, outcome: ReplayOutcome::Filled }));
    assert_eq!(left_replaying_because(&out), Some((Degraded, Reason::ReplayUnavailable)));

    // A restart forgets the loss: the new process is EXACT from its seq 0.
    let mut s = exact_from_zero(false);
    live(&mut s, 7, 1);
    assert_eq!(s.state(), Degraded);
    live(&mut s, 0, 2);
    assert_eq!(s.state(), Exact);
}
