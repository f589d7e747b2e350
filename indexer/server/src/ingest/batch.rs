//! The payload a stream's sequencer holds: the batch's bytes and, for a live one, when its
//! message was received at the socket (how the live driver dates what a stream holds back; see
//! `apply::lag`). The offline driver has no socket clock and leaves it empty.

use std::time::Instant;

use bytes::Bytes;

/// A batch as a stream's sequencer holds it: its payload and, for a live one, when its
/// message was received at the socket. A replayed batch has none, unless its live copy was
/// received and held behind the replay (the replay's copy applies, the live one is dropped as
/// a duplicate): it takes that copy's receive time.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub bytes: Bytes,
    pub received: Option<Instant>,
}

impl Batch {
    pub fn live(bytes: Bytes, received: Instant) -> Batch {
        Batch { bytes, received: Some(received) }
    }
}
