//! Why a connection ended or was refused, and why an API call failed: typed, so the server can
//! count each case under a stable label and never has to parse a message.
//!
//! [`ProtocolError`] is what a peer sent that we refuse; [`Reason`] is why a connection closed
//! (peer, timer, bound or protocol); [`Error`] is what `bind`, `connect` and `request` return.
//! Peer-supplied text (an ERROR command's reason, a mechanism name) is kept as the peer sent
//! it, truncated by the wire format to 255 bytes; the server escapes it before logging.

use std::io;

/// Bytes a peer sent that break ZMTP 3 or one of our [`crate::Limits`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("not a ZMTP 3 peer: bad greeting signature")]
    BadSignature,
    #[error("peer speaks ZMTP {major}.{minor}; 3.0 or later is required")]
    UnsupportedVersion { major: u8, minor: u8 },
    #[error("peer asks for the {0:?} security mechanism; only NULL is supported")]
    UnsupportedMechanism(String),
    #[error("a {ours} socket cannot talk to a {theirs:?} peer")]
    IncompatibleSocketType { ours: &'static str, theirs: String },
    #[error("the peer's READY has no Socket-Type")]
    MissingSocketType,
    #[error("expected a READY command, got {0:?}")]
    ExpectedReady(String),
    #[error("frame of {declared} bytes declared; the limit is {limit}")]
    FrameTooLarge { declared: u64, limit: usize },
    #[error("message would reach {size} bytes; the limit is {limit}")]
    MessageTooLarge { size: u64, limit: usize },
    #[error("message has more than {limit} frames")]
    TooManyParts { limit: usize },
    #[error("command of {declared} bytes declared; the limit is {limit}")]
    CommandTooLarge { declared: u64, limit: usize },
    #[error("invalid frame flags {0:#04x}")]
    InvalidFlags(u8),
    #[error("malformed {0} command")]
    MalformedCommand(&'static str),
    #[error("peer sent ERROR: {0:?}")]
    PeerError(String),
}

impl ProtocolError {
    /// A stable, low-cardinality label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ProtocolError::BadSignature => "bad_signature",
            ProtocolError::UnsupportedVersion { .. } => "unsupported_version",
            ProtocolError::UnsupportedMechanism(_) => "unsupported_mechanism",
            ProtocolError::IncompatibleSocketType { .. } => "incompatible_socket_type",
            ProtocolError::MissingSocketType => "missing_socket_type",
            ProtocolError::ExpectedReady(_) => "expected_ready",
            ProtocolError::FrameTooLarge { .. } => "frame_too_large",
            ProtocolError::MessageTooLarge { .. } => "message_too_large",
            ProtocolError::TooManyParts { .. } => "too_many_parts",
            ProtocolError::CommandTooLarge { .. } => "command_too_large",
            ProtocolError::InvalidFlags(_) => "invalid_flags",
            ProtocolError::MalformedCommand(_) => "malformed_command",
            ProtocolError::PeerError(_) => "peer_error",
        }
    }
}

/// Why a connection ended, or was refused before it became one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    #[error("peer closed the connection")]
    Closed,
    #[error("i/o error: {0}")]
    Io(io::ErrorKind),
    #[error("cannot connect: {0}")]
    Connect(io::ErrorKind),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("ZMTP handshake not finished in time")]
    HandshakeTimeout,
    #[error("no traffic and no heartbeat answer in time")]
    IdleTimeout,
    #[error("listener already holds {limit} connections")]
    ListenerFull { limit: usize },
    #[error("listener already holds {limit} connections from this source")]
    SourceFull { limit: usize },
    #[error("listener already holds {limit} connections that have not finished their handshake")]
    HandshakingFull { limit: usize },
    #[error("listener already holds {limit} connections from this source that have not finished their handshake")]
    SourceHandshakingFull { limit: usize },
    #[error(
        "listener already holds {limit} connections from this source's network (/24, /64), none of them handshaking"
    )]
    NetworkFull { limit: usize },
    #[error("closed before finishing its handshake, to make room for a newer connection at a full cap")]
    Evicted,
    #[error("address not allowed to connect")]
    NotAllowed,
}

impl Reason {
    /// A stable, low-cardinality label for metrics (`protocol` reasons use the
    /// [`ProtocolError::label`] of the violation).
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Closed => "closed",
            Reason::Io(_) => "io",
            Reason::Connect(_) => "connect",
            Reason::Protocol(p) => p.label(),
            Reason::HandshakeTimeout => "handshake_timeout",
            Reason::IdleTimeout => "idle_timeout",
            Reason::ListenerFull { .. } => "listener_full",
            Reason::SourceFull { .. } => "source_full",
            Reason::HandshakingFull { .. } => "handshaking_full",
            Reason::SourceHandshakingFull { .. } => "source_handshaking_full",
            Reason::NetworkFull { .. } => "network_full",
            Reason::Evicted => "evicted",
            Reason::NotAllowed => "not_allowed",
        }
    }

    pub(crate) fn from_io(e: &io::Error) -> Reason {
        match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Reason::Closed,
            kind => Reason::Io(kind),
        }
    }
}

/// What `bind`, `connect` and `request` return when they cannot do their job.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid endpoint {endpoint:?}: {why}")]
    Endpoint { endpoint: String, why: &'static str },
    #[error("invalid limits: {0}")]
    Limits(String),
    #[error("cannot bind {endpoint}: {source}")]
    Bind { endpoint: String, source: io::Error },
    #[error("{endpoint}: {reason}")]
    Connection { endpoint: String, reason: Reason },
    #[error("{endpoint}: deadline passed")]
    Deadline { endpoint: String },
}
