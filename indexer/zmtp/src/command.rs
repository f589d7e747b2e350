//! ZMTP commands (frames with the COMMAND flag): READY and ERROR during the handshake, then
//! PING/PONG heartbeats and, from ZMTP 3.1, SUBSCRIBE/CANCEL. Parsing reads untrusted bytes,
//! so every length is checked against the body before it is used, and nothing is allocated
//! beyond the (already bounded) body.
//!
//! A command body is `name-len (1) name data`. READY's data is a property list
//! (`name-len (1) name value-len (4, BE) value`), ERROR's is `reason-len (1) reason`, PING's is
//! `ttl (2, BE, tenths of a second) context (0..16)`, PONG's is the context it echoes.

use bytes::Bytes;

use crate::error::ProtocolError;
use crate::frame;

/// A command received from the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// The peer's READY; `socket_type` is the Socket-Type property, if present.
    Ready {
        socket_type: Option<Bytes>,
    },
    /// The peer refuses the connection, with its reason.
    Error {
        reason: Bytes,
    },
    /// A heartbeat: answer with a PONG carrying `context`.
    Ping {
        context: Bytes,
    },
    Pong,
    /// A 3.1 subscription (a SUB never expects one; it is ignored).
    Subscribe,
    Cancel,
    /// Any other name; ignored after the handshake, as RFC 37 allows.
    Unknown {
        name: Bytes,
    },
}

fn malformed(which: &'static str) -> ProtocolError {
    ProtocolError::MalformedCommand(which)
}

impl Command {
    /// Parses one command body (`body` holds exactly one command frame).
    pub fn parse(body: Bytes) -> Result<Command, ProtocolError> {
        let name_len = usize::from(*body.first().ok_or(malformed("empty"))?);
        if name_len == 0 || body.len() < 1 + name_len {
            return Err(malformed("unnamed"));
        }
        let name = body.slice(1..1 + name_len);
        let data = body.slice(1 + name_len..);
        Ok(match &name[..] {
            b"READY" => Command::Ready { socket_type: property(&data, b"Socket-Type")? },
            b"ERROR" => {
                let len = usize::from(*data.first().ok_or(malformed("ERROR"))?);
                let reason = data.get(1..1 + len).ok_or(malformed("ERROR"))?;
                Command::Error { reason: Bytes::copy_from_slice(reason) }
            }
            b"PING" => {
                if data.len() < 2 || data.len() > 2 + 16 {
                    return Err(malformed("PING"));
                }
                Command::Ping { context: data.slice(2..) }
            }
            b"PONG" => Command::Pong,
            b"SUBSCRIBE" => Command::Subscribe,
            b"CANCEL" => Command::Cancel,
            _ => Command::Unknown { name },
        })
    }

    /// The name, for error messages.
    pub fn name(&self) -> String {
        match self {
            Command::Ready { .. } => "READY".into(),
            Command::Error { .. } => "ERROR".into(),
            Command::Ping { .. } => "PING".into(),
            Command::Pong => "PONG".into(),
            Command::Subscribe => "SUBSCRIBE".into(),
            Command::Cancel => "CANCEL".into(),
            Command::Unknown { name } => String::from_utf8_lossy(name).into_owned(),
        }
    }
}

/// The value of property `wanted` (names compare case-insensitively, as libzmq does) in a
/// READY property list; a list that runs past its body is malformed.
fn property(mut props: &[u8], wanted: &[u8]) -> Result<Option<Bytes>, ProtocolError> {
    let mut found = None;
    while !props.is_empty() {
        let n = usize::from(props[0]);
        let name = props.get(1..1 + n).ok_or(malformed("READY"))?;
        let len_bytes: [u8; 4] = props.get(1 + n..5 + n).ok_or(malformed("READY"))?.try_into().expect("4 bytes");
        let len = u32::from_be_bytes(len_bytes) as usize;
        let end = (5 + n).checked_add(len).ok_or(malformed("READY"))?;
        let value = props.get(5 + n..end).ok_or(malformed("READY"))?;
        if found.is_none() && name.eq_ignore_ascii_case(wanted) {
            found = Some(Bytes::copy_from_slice(value));
        }
        props = &props[end..];
    }
    Ok(found)
}

/// A command frame (header and body) with `name` and raw `data`.
pub fn encode(name: &[u8], data: &[u8]) -> Vec<u8> {
    debug_assert!(!name.is_empty() && name.len() <= 255);
    let mut body = Vec::with_capacity(1 + name.len() + data.len());
    body.push(name.len() as u8);
    body.extend_from_slice(name);
    body.extend_from_slice(data);
    let mut out = Vec::with_capacity(body.len() + 9);
    frame::encode(&mut out, frame::COMMAND, &body);
    out
}

/// READY announcing `socket_type` (no identity: a ROUTER makes one up, as for libzmq peers).
pub fn ready(socket_type: &str) -> Vec<u8> {
    let mut props = Vec::new();
    props.push(b"Socket-Type".len() as u8);
    props.extend_from_slice(b"Socket-Type");
    props.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    props.extend_from_slice(socket_type.as_bytes());
    encode(b"READY", &props)
}

/// PING with TTL 0 (we time the peer out ourselves; we ask it for nothing) and no context.
pub fn ping() -> Vec<u8> {
    encode(b"PING", &[0, 0])
}

pub fn pong(context: &[u8]) -> Vec<u8> {
    encode(b"PONG", context)
}

/// A subscription in the form the peer's version expects: a SUBSCRIBE command for 3.1, a
/// one-frame message `0x01 + prefix` for 3.0.
pub fn subscribe(prefix: &[u8], speaks_31: bool) -> Vec<u8> {
    if speaks_31 {
        encode(b"SUBSCRIBE", prefix)
    } else {
        let mut body = Vec::with_capacity(1 + prefix.len());
        body.push(1);
        body.extend_from_slice(prefix);
        let mut out = Vec::with_capacity(body.len() + 9);
        frame::encode(&mut out, 0, &body);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> Bytes {
        // short command frames only: flags, 1-byte size, body
        assert_eq!(frame[0], frame::COMMAND);
        Bytes::copy_from_slice(&frame[2..])
    }

    #[test]
    fn round_trips() {
        assert_eq!(
            Command::parse(body(&ready("PUB"))).unwrap(),
            Command::Ready { socket_type: Some(Bytes::from_static(b"PUB")) }
        );
        assert_eq!(Command::parse(body(&ping())).unwrap(), Command::Ping { context: Bytes::new() });
        assert_eq!(Command::parse(body(&pong(b"ctx"))).unwrap(), Command::Pong);
        assert_eq!(Command::parse(body(&subscribe(b"kv@", true))).unwrap(), Command::Subscribe);
        assert_eq!(subscribe(b"kv@", false), b"\x00\x04\x01kv@");
    }

    #[test]
    fn property_names_ignore_case_and_lengths_are_checked() {
        let mut props = vec![11];
        props.extend_from_slice(b"socket-type");
        props.extend_from_slice(&3u32.to_be_bytes());
        props.extend_from_slice(b"PUB");
        assert_eq!(property(&props, b"Socket-Type").unwrap(), Some(Bytes::from_static(b"PUB")));
        props[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(property(&props, b"Socket-Type"), Err(malformed("READY")));
        assert_eq!(Command::parse(Bytes::from_static(b"\x05READ")), Err(malformed("unnamed")));
        assert_eq!(Command::parse(Bytes::from_static(b"\x05ERROR\x09short")), Err(malformed("ERROR")));
        assert_eq!(Command::parse(Bytes::from_static(b"\x04PING\x00")), Err(malformed("PING")));
    }
}
