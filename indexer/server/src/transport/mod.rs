//! The ZeroMQ boundary: the only module that speaks ZMTP. The rest of the service sees two
//! operations, so the stack behind them can be replaced without touching the sources or the
//! replay policy:
//!
//! - a SUB stream, bound ([`bind_sub`] then [`BoundSub::serve`]) or dialled ([`dial_sub`]), that
//!   reports every publisher connection, message and error as a [`SubEvent`] carrying the
//!   connection id and peer address;
//! - a replay request ([`ReplayClient::request`]) that sends a start seq to an engine's ROUTER
//!   and yields every reply's frames ([`ReplayReplies`]).
//!
//! Today's stack: our own ZMTP 3 SUB peer on tokio TCP ([`zmtp`], [`sub`]) and the `zeromq`
//! crate's DEALER ([`dealer`]). Errors are values ([`TransportError`]); counting and logging
//! them is the caller's business.

mod dealer;
mod sub;
mod zmtp;

use bytes::Bytes;

pub use dealer::{ReplayClient, ReplayReplies};
pub use sub::{bind_sub, dial_sub, BoundSub};

/// One multipart message.
pub type Frames = Vec<Bytes>;

/// Identifies one connection to a publisher (never 0). Messages arriving on a new connection
/// id mean the publisher reconnected, possibly as a new process.
pub type ConnId = u64;

/// What a SUB stream reports, in order per connection.
#[derive(Debug)]
pub enum SubEvent {
    /// A publisher connection completed its handshake and is subscribed.
    Connected { conn: ConnId, peer: String },
    /// A message from a publisher.
    Message { conn: ConnId, frames: Frames },
    /// The connection ended; `error` is `None` for an orderly close.
    Disconnected { conn: ConnId, peer: String, error: Option<TransportError> },
    /// Something failed before a connection was established (accept, dial, handshake); the
    /// stream carries on (a dialled stream re-dials with backoff).
    Failed(TransportError),
}

/// A transport failure: which operation, against which endpoint or peer, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operation} {endpoint}: {message}")]
pub struct TransportError {
    /// Stable label (`kvindex_zmq_errors_total{operation}`): bind, accept, handshake, connect,
    /// recv, replay-connect, replay-send, replay-recv.
    pub operation: &'static str,
    pub endpoint: String,
    pub message: String,
}

impl TransportError {
    pub(crate) fn new(operation: &'static str, endpoint: &str, message: impl std::fmt::Display) -> Self {
        TransportError { operation, endpoint: endpoint.to_string(), message: message.to_string() }
    }
}
