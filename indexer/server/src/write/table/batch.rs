//! The payload a stream's sequencer holds: the batch's bytes and, for a live one, when its
//! message was received at the socket (how the live driver dates what a stream holds back; see
//! `write::worker::lag`). The offline driver has no socket clock and leaves it empty. A batch carries
//! its stream's engine, so whoever applies it later decodes it by the same rules
//! ([`Batch::decode`], the one place a stream's payload is decoded).

use std::time::Instant;

use bytes::Bytes;

use kvindex::wire::{self, Engine, EventBatch, WireError};

/// A batch as a stream's sequencer holds it: its payload and, for a live one, when its
/// message was received at the socket. A replayed batch has none, unless its live copy was
/// received and held behind the replay (the replay's copy applies, the live one is dropped as
/// a duplicate): it takes that copy's receive time.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub bytes: Bytes,
    pub received: Option<Instant>,
    /// The engine family of the stream that published it.
    pub engine: Engine,
}

impl Batch {
    pub fn live(bytes: Bytes, received: Instant, engine: Engine) -> Batch {
        Batch { bytes, received: Some(received), engine }
    }

    /// The payload decoded by its stream's engine's rules.
    pub fn decode(&self) -> Result<EventBatch<'_>, WireError> {
        decode(self.engine, &self.bytes)
    }
}

/// Decodes a payload of `engine`'s family: every payload a stream takes, live or replayed,
/// held or applied at once, is decoded here.
pub fn decode(engine: Engine, payload: &[u8]) -> Result<EventBatch<'_>, WireError> {
    wire::decode_batch_as(engine, payload)
}
