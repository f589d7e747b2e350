//! ZeroMQ framing of vLLM's KV events: a live PUB message is `[topic, seq, payload]`; a replay
//! reply seen by a DEALER is `[empty, seq, payload]` (vLLM ≤0.25) or `[empty, topic, seq,
//! payload]` (0.26+), and seq `ff…ff` with an empty payload ends the replay. The payload is
//! left undecoded here (see `msgpack`). SGLang and TensorRT-LLM use the same framing.
//!
//! The seq frame is 8 bytes (u64 big-endian), or 24 in vLLM's snapshot-protocol layout
//! (vllm#57789): the same 8-byte seq followed by a 16-byte publisher epoch, which changes when
//! the publisher restarts (see `Sequencer::on_epoch`).

use super::error::WireError;

/// Sequence number vLLM sends (as 8 bytes `ff…ff`) to mark the end of a replay.
pub const END_OF_REPLAY_SEQ: u64 = u64::MAX;

/// The 16-byte publisher epoch of a 24-byte seq frame.
pub type Epoch = [u8; 16];

/// A live PUB message or a replay reply: `[topic, seq, payload]`, payload not yet decoded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawMessage<'a> {
    /// `None` in replay replies of vLLM ≤0.25, which carry no topic frame.
    pub topic: Option<&'a [u8]>,
    pub seq: u64,
    /// `Some` when the seq frame had 24 bytes.
    pub epoch: Option<Epoch>,
    pub payload: &'a [u8],
}

/// What a replay DEALER receives: a buffered message, or the end marker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReplayReply<'a> {
    Message(RawMessage<'a>),
    End { topic: Option<&'a [u8]> },
}

/// The seq (and epoch, when the frame has one) of a seq frame.
fn read_seq(frame: &[u8]) -> Result<(u64, Option<Epoch>), WireError> {
    let (seq, epoch) = match frame.len() {
        8 => (frame, None),
        24 => {
            let (seq, epoch) = frame.split_at(8);
            (seq, Some(Epoch::try_from(epoch).map_err(|_| WireError::SeqLength(frame.len()))?))
        }
        n => return Err(WireError::SeqLength(n)),
    };
    let seq: [u8; 8] = seq.try_into().map_err(|_| WireError::SeqLength(frame.len()))?;
    Ok((u64::from_be_bytes(seq), epoch))
}

/// Splits a live SUB message `[topic, seq, payload]`.
pub fn parse_live<'a>(frames: &[&'a [u8]]) -> Result<RawMessage<'a>, WireError> {
    let [topic, seq, payload] = frames else {
        return Err(WireError::FrameCount { expected: "3", got: frames.len() });
    };
    let (seq, epoch) = read_seq(seq)?;
    Ok(RawMessage { topic: Some(topic), seq, epoch, payload })
}

/// Splits a reply seen by a DEALER: `[empty, seq, payload]` (vLLM ≤0.25) or
/// `[empty, topic, seq, payload]` (0.26+); seq `ff…ff` with an empty payload ends the replay.
pub fn parse_replay<'a>(frames: &[&'a [u8]]) -> Result<ReplayReply<'a>, WireError> {
    let (topic, seq, payload) = match frames {
        [[], seq, payload] => (None, *seq, *payload),
        [[], topic, seq, payload] => (Some(*topic), *seq, *payload),
        [_, _, _] | [_, _, _, _] => return Err(WireError::MissingDelimiter),
        _ => return Err(WireError::FrameCount { expected: "3 or 4", got: frames.len() }),
    };
    let (seq, epoch) = read_seq(seq)?;
    if seq == END_OF_REPLAY_SEQ && payload.is_empty() {
        return Ok(ReplayReply::End { topic });
    }
    Ok(ReplayReply::Message(RawMessage { topic, seq, epoch, payload }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_layouts_and_end_markers() {
        let seq = 7u64.to_be_bytes();
        let end = u64::MAX.to_be_bytes();
        let old = parse_replay(&[b"", &seq, b"\x90"]).unwrap();
        assert_eq!(old, ReplayReply::Message(RawMessage { topic: None, seq: 7, epoch: None, payload: b"\x90" }));
        let new = parse_replay(&[b"", b"kv@a@m", &seq, b"\x90"]).unwrap();
        assert!(matches!(new, ReplayReply::Message(RawMessage { topic: Some(b"kv@a@m"), .. })));
        assert_eq!(parse_replay(&[b"", &end, b""]).unwrap(), ReplayReply::End { topic: None });
        assert_eq!(parse_replay(&[b"", b"", &end, b""]).unwrap(), ReplayReply::End { topic: Some(b"") });
        assert_eq!(parse_replay(&[b"x", &seq, b""]).unwrap_err(), WireError::MissingDelimiter);
        assert_eq!(parse_live(&[b"t", b"123", b""]).unwrap_err(), WireError::SeqLength(3));
    }

    #[test]
    fn a_24_byte_seq_frame_is_seq_then_epoch() {
        let mut frame = 9u64.to_be_bytes().to_vec();
        frame.extend(0x10u8..0x20);
        let live = parse_live(&[b"t", &frame, b"\x90"]).unwrap();
        assert_eq!((live.seq, live.epoch), (9, Some(std::array::from_fn(|i| 0x10 + i as u8))));
        assert_eq!(parse_live(&[b"t", &9u64.to_be_bytes(), b""]).unwrap().epoch, None, "8-byte frames unchanged");
        let mut end = u64::MAX.to_be_bytes().to_vec();
        end.extend([0u8; 16]);
        assert_eq!(parse_replay(&[b"", b"t", &end, b""]).unwrap(), ReplayReply::End { topic: Some(b"t") });
        for bad in [7usize, 9, 16, 23, 25, 32] {
            assert_eq!(parse_live(&[b"t", &vec![0u8; bad], b""]).unwrap_err(), WireError::SeqLength(bad));
        }
    }
}
