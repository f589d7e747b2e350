//! What a SUB socket tells the server: messages, each with the connection and the peer address
//! it arrived on (so a topic can be bound to its publisher), and the life of every connection
//! (connected, disconnected with a reason, refused with a reason), so the server can detect a
//! publisher's reconnect and count every violation under [`Reason::label`].

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::budget::Lease;
use crate::error::Reason;
use crate::handshake::PeerInfo;
use crate::peer::{ConnId, Peer};

/// One received message. Its bytes count against the socket's in-flight budget until it is
/// dropped; a server that moves the frames into its own queue moves the `lease` along, so
/// that queue is bounded by the same bytes.
#[derive(Debug)]
pub struct Message {
    pub conn: ConnId,
    pub peer: Arc<Peer>,
    pub frames: Vec<Bytes>,
    pub lease: Lease,
    /// When its last frame was read off the socket: the start of the server's lag for it,
    /// however long it then waits for the server to take it.
    pub received_at: std::time::Instant,
}

impl Message {
    /// Bytes of this message charged to the budget (the sum of its frames).
    pub fn charged_bytes(&self) -> usize {
        self.lease.bytes()
    }
}

#[derive(Debug)]
pub enum Event {
    Message(Message),
    /// A peer finished its handshake; messages from it carry `conn`.
    Connected {
        conn: ConnId,
        peer: Arc<Peer>,
        info: PeerInfo,
    },
    /// A connected peer is gone (its unfinished bytes are already back in the budget); its
    /// next connection will have another id.
    Disconnected {
        conn: ConnId,
        peer: Arc<Peer>,
        reason: Reason,
    },
    /// A listener refused a peer: a cap was reached, or the handshake failed or timed out.
    Rejected {
        peer: Arc<Peer>,
        reason: Reason,
    },
    /// A dialer could not connect or handshake; it tries again after `retry_in`.
    ConnectFailed {
        endpoint: Arc<str>,
        reason: Reason,
        retry_in: Duration,
    },
    /// A listener's `accept` failed (e.g. out of descriptors); it tries again after `retry_in`.
    AcceptFailed {
        error: io::ErrorKind,
        retry_in: Duration,
    },
}
