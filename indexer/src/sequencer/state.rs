//! The vocabulary of sequencing: where a stream stands ([`SourceState`]), why it moved
//! ([`Reason`]) and how a replay ended ([`ReplayOutcome`]). Each has a stable label, because
//! metrics, logs, the debug endpoint and the gRPC answer all name them.

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
    pub const ALL: [SourceState; 5] = [
        SourceState::Connecting,
        SourceState::Exact,
        SourceState::Replaying,
        SourceState::Degraded,
        SourceState::Stale,
    ];

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
    /// A live connection opened: what the publisher sent before our subscription reached it
    /// is asked from its replay socket (everything after the cursor; from 0 when there is none).
    CatchUp,
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
    /// A live message carried a new publisher epoch (vLLM's 24-byte seq frame): a new
    /// publisher process, cleared like a restart whatever its seq.
    Epoch,
    /// The publisher's connection was replaced: it may have restarted with its seq already
    /// past ours, so its history is re-read from seq 0 instead of trusted.
    Reconnect,
    /// The publisher's live connection closed: what came on it is no longer claimed (a
    /// restarted engine publishes nothing until it serves a request), and the next
    /// connection resyncs from seq 0.
    Disconnect,
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
            Reason::CatchUp => "catch_up",
            Reason::ReplayFilled => "replay_filled",
            Reason::ReplayNotCovered => "replay_not_covered",
            Reason::ReplayUnavailable => "replay_unavailable",
            Reason::ReplayTimeout => "replay_timeout",
            Reason::ReplayCooldown => "replay_cooldown",
            Reason::PendingOverflow => "pending_overflow",
            Reason::Restart => "restart",
            Reason::Epoch => "epoch",
            Reason::Reconnect => "reconnect",
            Reason::Disconnect => "disconnect",
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
