//! The ZMTP handshake for our two socket types: greetings both ways, NULL mechanism only,
//! READY both ways, and the check that the peer's socket type can talk to ours (a SUB to a PUB
//! or XPUB, a DEALER to a ROUTER, DEALER or REP). The caller bounds it with the handshake
//! timeout; a SUB then sends its subscriptions in the form the peer's version expects.

use bytes::Bytes;

use crate::budget::Lease;
use crate::command::{self, Command};
use crate::connection::Connection;
use crate::decoder::Item;
use crate::error::{ProtocolError, Reason};
use crate::greeting::Greeting;
use crate::limits::Limits;
use crate::transport::Stream;

/// The two socket types this crate implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SocketType {
    Sub,
    Dealer,
}

impl SocketType {
    fn name(self) -> &'static str {
        match self {
            SocketType::Sub => "SUB",
            SocketType::Dealer => "DEALER",
        }
    }

    fn accepts(self, peer: &[u8]) -> bool {
        match self {
            SocketType::Sub => matches!(peer, b"PUB" | b"XPUB"),
            SocketType::Dealer => matches!(peer, b"ROUTER" | b"DEALER" | b"REP"),
        }
    }
}

/// What the peer announced in its handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// ZMTP version from its greeting.
    pub version: (u8, u8),
    /// Its Socket-Type (e.g. `PUB`, `XPUB`, `ROUTER`).
    pub socket_type: String,
}

/// Runs the handshake as `ours` on a fresh stream.
pub(crate) async fn handshake(
    stream: Stream,
    ours: SocketType,
    limits: &Limits,
    lease: Lease,
) -> Result<(Connection, PeerInfo), Reason> {
    // Silence before the handshake ends is the handshake's timeout, whichever timer saw it.
    exchange(stream, ours, limits, lease).await.map_err(|r| {
        if r == Reason::IdleTimeout {
            Reason::HandshakeTimeout
        } else {
            r
        }
    })
}

async fn exchange(
    stream: Stream,
    ours: SocketType,
    limits: &Limits,
    lease: Lease,
) -> Result<(Connection, PeerInfo), Reason> {
    let mut conn = Connection::new(stream, limits, lease);
    // Our greeting and READY in one write: READY waits in the peer's buffer until it has read
    // our greeting, and a peer that wants another mechanism is refused either way.
    let mut hello = Greeting::ours().to_vec();
    hello.extend(command::ready(ours.name()));
    conn.write(&hello).await?;
    let greeting = match conn.next_item().await? {
        (Item::Greeting(g), _) => g,
        _ => unreachable!("the decoder yields the greeting first"),
    };
    greeting.require_null()?;
    conn.set_speaks_31(greeting.speaks_31());
    let socket_type = match conn.next_item().await? {
        (Item::Command(Command::Ready { socket_type: Some(t) }), _) => t,
        (Item::Command(Command::Ready { socket_type: None }), _) => return Err(ProtocolError::MissingSocketType.into()),
        (Item::Command(Command::Error { reason }), _) => {
            return Err(ProtocolError::PeerError(String::from_utf8_lossy(&reason).into_owned()).into())
        }
        (Item::Command(other), _) => return Err(ProtocolError::ExpectedReady(other.name()).into()),
        (Item::Message(_) | Item::Greeting(_), _) => {
            return Err(ProtocolError::ExpectedReady("a message".into()).into())
        }
    };
    if !ours.accepts(&socket_type) {
        return Err(ProtocolError::IncompatibleSocketType {
            ours: ours.name(),
            theirs: String::from_utf8_lossy(&socket_type).into_owned(),
        }
        .into());
    }
    let info = PeerInfo {
        version: (greeting.major, greeting.minor),
        socket_type: String::from_utf8_lossy(&socket_type).into_owned(),
    };
    Ok((conn, info))
}

/// Sends a SUB's subscriptions: SUBSCRIBE commands to a 3.1 peer, `0x01 + prefix` messages to
/// a 3.0 one.
pub(crate) async fn subscribe(conn: &mut Connection, prefixes: &[Bytes]) -> Result<(), Reason> {
    let mut out = Vec::new();
    for p in prefixes {
        out.extend(command::subscribe(p, conn.speaks_31()));
    }
    conn.write(&out).await
}
