//! The incoming byte stream → greeting, commands and whole messages, without I/O: the one
//! place that reads untrusted bytes, so it is a plain state machine the fuzz target and the
//! property tests drive directly.
//!
//! Bounds are enforced on the frame *header*, before any byte of the body is read: a frame
//! declaring more than `max_frame_size`, a message that would pass `max_message_size` or
//! `max_parts`, a command above [`MAX_COMMAND_SIZE`] are errors at once. A body is then
//! collected in steps that never reserve more than twice what has arrived (and never more
//! than it declared), so a peer that declares 16 MiB and sends 1 byte costs us 64 KiB.
//! [`Decoder::held_bytes`] is what the decoder holds for the unfinished message (at most
//! `max_message_size`, plus a command in progress between its parts, at most
//! [`MAX_COMMAND_SIZE`]); the connection charges it to the socket's budget.
//!
//! Commands may arrive between the frames of a multi-part message (libzmq can put a PING
//! there); they do not disturb the message being assembled.

use bytes::Bytes;

use crate::command::Command;
use crate::error::ProtocolError;
use crate::frame::{COMMAND, LONG, MORE, RESERVED};
use crate::greeting::{Greeting, GREETING_LEN};
use crate::limits::Limits;

/// Largest command body accepted (READY with a few properties, PING, ERROR are far below).
pub const MAX_COMMAND_SIZE: usize = 64 << 10;

/// A body grows by at most this much (or by its current size, whichever is larger) at a time.
const GROWTH_STEP: usize = 64 << 10;

/// One unit of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Greeting(Greeting),
    Command(Command),
    /// A whole message: every frame, in order.
    Message(Vec<Bytes>),
}

#[derive(Debug)]
enum State {
    Greeting { buf: [u8; GREETING_LEN], have: usize },
    Header { buf: [u8; 9], have: usize },
    Body { flags: u8, len: usize, body: Vec<u8> },
    Failed(ProtocolError),
}

/// Decodes one connection's incoming bytes (greeting first).
#[derive(Debug)]
pub struct Decoder {
    state: State,
    max_frame_size: usize,
    max_message_size: usize,
    max_parts: usize,
    parts: Vec<Bytes>,
    message_bytes: usize,
}

impl Decoder {
    pub fn new(limits: &Limits) -> Decoder {
        Decoder {
            state: State::Greeting { buf: [0; GREETING_LEN], have: 0 },
            max_frame_size: limits.max_frame_size,
            max_message_size: limits.max_message_size,
            max_parts: limits.max_parts,
            parts: Vec::new(),
            message_bytes: 0,
        }
    }

    /// Bytes held for the unfinished message: its finished frames and the body in progress (a
    /// frame's or a command's).
    pub fn held_bytes(&self) -> usize {
        self.message_bytes + if let State::Body { body, .. } = &self.state { body.len() } else { 0 }
    }

    /// Consumes bytes from the front of `input` until one item is complete (returned) or
    /// `input` is empty (`Ok(None)`). After an error the decoder stays failed.
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Item>, ProtocolError> {
        let result = self.step(input);
        if let Err(e) = &result {
            self.state = State::Failed(e.clone());
            self.parts = Vec::new();
            self.message_bytes = 0;
        }
        result
    }

    fn step(&mut self, input: &mut &[u8]) -> Result<Option<Item>, ProtocolError> {
        loop {
            match &mut self.state {
                State::Failed(e) => return Err(e.clone()),
                State::Greeting { buf, have } => {
                    let take = (GREETING_LEN - *have).min(input.len());
                    buf[*have..*have + take].copy_from_slice(&input[..take]);
                    *input = &input[take..];
                    *have += take;
                    Greeting::check_prefix(&buf[..*have])?;
                    if *have < GREETING_LEN {
                        return Ok(None);
                    }
                    let greeting = Greeting::parse(buf)?;
                    self.state = State::Header { buf: [0; 9], have: 0 };
                    return Ok(Some(Item::Greeting(greeting)));
                }
                State::Header { buf, have } => {
                    if *have == 0 {
                        let Some(&flags) = input.first() else { return Ok(None) };
                        if flags & RESERVED != 0 || (flags & COMMAND != 0 && flags & MORE != 0) {
                            return Err(ProtocolError::InvalidFlags(flags));
                        }
                    }
                    let need = if (if *have == 0 { input[0] } else { buf[0] }) & LONG != 0 { 9 } else { 2 };
                    let take = (need - *have).min(input.len());
                    buf[*have..*have + take].copy_from_slice(&input[..take]);
                    *input = &input[take..];
                    *have += take;
                    if *have < need {
                        return Ok(None);
                    }
                    let flags = buf[0];
                    let declared = if need == 9 {
                        u64::from_be_bytes(buf[1..9].try_into().expect("8 bytes"))
                    } else {
                        u64::from(buf[1])
                    };
                    let len = self.check_header(flags, declared)?;
                    if len == 0 {
                        self.state = State::Header { buf: [0; 9], have: 0 };
                        if let Some(item) = self.finish_frame(flags, Bytes::new())? {
                            return Ok(Some(item));
                        }
                    } else {
                        self.state = State::Body { flags, len, body: Vec::new() };
                    }
                }
                State::Body { flags, len, body } => {
                    let (flags, len) = (*flags, *len);
                    let frame = if body.is_empty() && input.len() >= len {
                        let frame = Bytes::copy_from_slice(&input[..len]);
                        *input = &input[len..];
                        frame
                    } else {
                        let remaining = len - body.len();
                        let take = remaining.min(input.len());
                        if take == 0 {
                            return Ok(None);
                        }
                        if body.capacity() - body.len() < take {
                            let step = body.capacity().max(GROWTH_STEP).max(take).min(remaining);
                            body.reserve_exact(step);
                        }
                        body.extend_from_slice(&input[..take]);
                        *input = &input[take..];
                        if body.len() < len {
                            return Ok(None);
                        }
                        Bytes::from(std::mem::take(body))
                    };
                    self.state = State::Header { buf: [0; 9], have: 0 };
                    if let Some(item) = self.finish_frame(flags, frame)? {
                        return Ok(Some(item));
                    }
                }
            }
        }
    }

    /// Applies every bound a header can break, before its body is read.
    fn check_header(&self, flags: u8, declared: u64) -> Result<usize, ProtocolError> {
        if flags & COMMAND != 0 {
            if declared > MAX_COMMAND_SIZE as u64 {
                return Err(ProtocolError::CommandTooLarge { declared, limit: MAX_COMMAND_SIZE });
            }
            return Ok(declared as usize);
        }
        if declared > self.max_frame_size as u64 {
            return Err(ProtocolError::FrameTooLarge { declared, limit: self.max_frame_size });
        }
        let size = self.message_bytes as u64 + declared;
        if size > self.max_message_size as u64 {
            return Err(ProtocolError::MessageTooLarge { size, limit: self.max_message_size });
        }
        if self.parts.len() >= self.max_parts {
            return Err(ProtocolError::TooManyParts { limit: self.max_parts });
        }
        Ok(declared as usize)
    }

    fn finish_frame(&mut self, flags: u8, body: Bytes) -> Result<Option<Item>, ProtocolError> {
        if flags & COMMAND != 0 {
            return Command::parse(body).map(|c| Some(Item::Command(c)));
        }
        self.message_bytes += body.len();
        self.parts.push(body);
        if flags & MORE != 0 {
            return Ok(None);
        }
        self.message_bytes = 0;
        Ok(Some(Item::Message(std::mem::take(&mut self.parts))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command;
    use crate::frame::encode_message;

    fn stream() -> Vec<u8> {
        let mut s = Greeting::ours().to_vec();
        s.extend(command::ready("PUB"));
        s.extend(encode_message(&[&b"kv@a"[..], &7u64.to_be_bytes(), &[9u8; 1000]]));
        s.extend(command::ping());
        s.extend(encode_message(&[&b""[..]]));
        s
    }

    fn all(d: &mut Decoder, mut input: &[u8]) -> Result<Vec<Item>, ProtocolError> {
        let mut out = Vec::new();
        while let Some(item) = d.decode(&mut input)? {
            out.push(item);
        }
        assert!(input.is_empty());
        Ok(out)
    }

    #[test]
    fn whole_and_byte_by_byte_give_the_same_items() {
        let s = stream();
        let whole = all(&mut Decoder::new(&Limits::default()), &s).unwrap();
        assert_eq!(whole.len(), 5);
        assert!(matches!(&whole[1], Item::Command(Command::Ready { .. })));
        assert_eq!(
            whole[2],
            Item::Message(vec![
                Bytes::from_static(b"kv@a"),
                Bytes::copy_from_slice(&7u64.to_be_bytes()),
                Bytes::from(vec![9u8; 1000])
            ])
        );
        assert_eq!(whole[4], Item::Message(vec![Bytes::new()]));
        let mut d = Decoder::new(&Limits::default());
        let mut bytewise = Vec::new();
        for b in s.chunks(1) {
            bytewise.extend(all(&mut d, b).unwrap());
        }
        assert_eq!(bytewise, whole);
    }

    #[test]
    fn a_huge_header_fails_before_any_body_and_stays_failed() {
        let mut s = Greeting::ours().to_vec();
        s.push(LONG);
        s.extend_from_slice(&(1u64 << 36).to_be_bytes());
        let mut d = Decoder::new(&Limits::default());
        let err = all(&mut d, &s).unwrap_err();
        assert_eq!(err, ProtocolError::FrameTooLarge { declared: 1 << 36, limit: 16 << 20 });
        assert_eq!(d.held_bytes(), 0);
        assert_eq!(d.decode(&mut &[0u8][..]).unwrap_err(), err);
    }

    #[test]
    fn unfinished_messages_are_capped_by_message_size_and_parts() {
        let limits = Limits { max_frame_size: 100, max_message_size: 250, max_parts: 4, ..Limits::default() };
        let mut s = Greeting::ours().to_vec();
        for _ in 0..3 {
            crate::frame::encode(&mut s, MORE, &[1; 100]);
        }
        let mut d = Decoder::new(&limits);
        assert_eq!(all(&mut d, &s), Err(ProtocolError::MessageTooLarge { size: 300, limit: 250 }));
        let mut s = Greeting::ours().to_vec();
        for _ in 0..5 {
            crate::frame::encode(&mut s, MORE, &[1; 1]);
        }
        assert_eq!(all(&mut Decoder::new(&limits), &s), Err(ProtocolError::TooManyParts { limit: 4 }));
    }

    #[test]
    fn a_slow_body_grows_with_what_arrived() {
        let limits = Limits::default();
        let mut s = Greeting::ours().to_vec();
        s.push(LONG);
        s.extend_from_slice(&(8u64 << 20).to_be_bytes());
        s.push(1);
        let mut d = Decoder::new(&limits);
        assert_eq!(all(&mut d, &s).unwrap().len(), 1);
        assert_eq!(d.held_bytes(), 1);
        let State::Body { body, .. } = &d.state else { panic!("in a body") };
        assert!(body.capacity() <= GROWTH_STEP, "reserved {} for 1 byte", body.capacity());
    }

    #[test]
    fn commands_between_parts_leave_the_message_intact() {
        let mut s = Greeting::ours().to_vec();
        crate::frame::encode(&mut s, MORE, b"a");
        s.extend(command::ping());
        crate::frame::encode(&mut s, 0, b"b");
        let items = all(&mut Decoder::new(&Limits::default()), &s).unwrap();
        assert!(matches!(items[1], Item::Command(Command::Ping { .. })));
        assert_eq!(items[2], Item::Message(vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]));
    }

    #[test]
    fn reserved_flags_and_more_on_commands_are_refused() {
        for flags in [0x08u8, 0x80, COMMAND | MORE] {
            let mut s = Greeting::ours().to_vec();
            s.extend([flags, 0]);
            assert_eq!(all(&mut Decoder::new(&Limits::default()), &s), Err(ProtocolError::InvalidFlags(flags)));
        }
    }
}
