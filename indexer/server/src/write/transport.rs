//! The ZeroMQ boundary. The server has one ZeroMQ stack, `kvindex-zmtp` (indexer/zmtp): a
//! bounded SUB that engines dial ([`SubListener`], central mode), a SUB that dials each engine
//! ([`SubDialer`], per-pod mode) and a one-request DEALER for replays ([`Dealer`]). Every
//! message carries its connection and peer address; every byte a peer can make us hold is
//! bounded by [`Limits`] (from the config's `zmq_*` keys).
//!
//! What the server adds here: counting and logging what the sockets report
//! ([`note_event`]), with peer-supplied text escaped ([`escape`]), and the failures of
//! operations that are not a connection's life (a replay, a bind) as [`TransportError`]s.

use std::fmt;

use bytes::Bytes;

pub use kvindex_zmtp::{
    Admission, Backoff, ConnId, Dealer, Error as ZmtpError, Event, Lease, Limits, Message, Peer, Reason, Source,
    SubDialer, SubListener,
};

use crate::telemetry as m;

/// One multipart message.
pub type Frames = Vec<Bytes>;

/// Which of the server's sockets an event came from, for metric labels (never a pod id: the
/// label set stays bounded however many pods there are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketKind {
    /// The central SUB (`zmq_bind`).
    Central,
    /// A per-pod dialling SUB.
    Pod,
}

impl SocketKind {
    pub fn label(self) -> &'static str {
        match self {
            SocketKind::Central => "central",
            SocketKind::Pod => "pod",
        }
    }
}

/// Counts and logs every event but a message: connections, disconnects with their reason,
/// refusals, failed dials and accepts. `what` names the pod for a per-pod socket (escaped).
pub fn note_event(socket: SocketKind, what: &str, event: &Event) {
    let s = socket.label();
    match event {
        Event::Message(_) => {}
        Event::Connected { conn, peer, .. } => {
            metrics::counter!(m::ZMQ_CONNECTIONS, "socket" => s).increment(1);
            tracing::info!(socket = s, pod = %escape(what), %conn, peer = %peer, "publisher connected");
        }
        Event::Disconnected { conn, peer, reason } => {
            metrics::counter!(m::ZMQ_DISCONNECTS, "socket" => s, "reason" => reason.label()).increment(1);
            let reason = escape(&reason.to_string());
            if matches!(event, Event::Disconnected { reason: Reason::Closed, .. }) {
                tracing::info!(socket = s, pod = %escape(what), %conn, peer = %peer, %reason, "publisher disconnected");
            } else {
                tracing::warn!(socket = s, pod = %escape(what), %conn, peer = %peer, %reason, "publisher disconnected");
            }
        }
        Event::Rejected { peer, reason } => {
            metrics::counter!(m::ZMQ_REJECTED, "socket" => s, "reason" => reason.label()).increment(1);
            // A flood of refused sockets is counted in full but logged at powers of two, so it
            // cannot flood the log as well.
            static REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(socket = s, peer = %peer, reason = %escape(&reason.to_string()), refused_total = n, "connection refused");
            }
        }
        Event::ConnectFailed { endpoint, reason, retry_in } => {
            // An engine that is not up yet is the normal state of a dialled pod: counted, not logged.
            metrics::counter!(m::ZMQ_ERRORS, "operation" => "connect", "reason" => reason.label()).increment(1);
            if !matches!(reason, Reason::Connect(_)) {
                tracing::warn!(socket = s, pod = %escape(what), endpoint = %escape(endpoint), reason = %escape(&reason.to_string()), ?retry_in, "cannot connect");
            }
        }
        Event::AcceptFailed { error, retry_in } => {
            metrics::counter!(m::ZMQ_ERRORS, "operation" => "accept", "reason" => "io").increment(1);
            tracing::warn!(socket = s, %error, ?retry_in, "accept failed (out of descriptors?)");
        }
    }
}

/// A transport failure outside a connection's life: which operation, against which endpoint,
/// why (a stable `reason` label for `kvindex_zmq_errors_total`), and the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operation} {endpoint}: {message}")]
pub struct TransportError {
    /// Stable label: replay, replay-capacity, replay-incomplete.
    pub operation: &'static str,
    pub reason: &'static str,
    pub endpoint: String,
    pub message: String,
}

impl TransportError {
    pub fn new(operation: &'static str, reason: &'static str, endpoint: &str, message: impl fmt::Display) -> Self {
        TransportError { operation, reason, endpoint: endpoint.to_string(), message: message.to_string() }
    }

    /// A `kvindex-zmtp` error of `operation`, with its reason's label.
    pub fn from_zmtp(operation: &'static str, endpoint: &str, error: &ZmtpError) -> Self {
        let reason = match error {
            ZmtpError::Connection { reason, .. } => reason.label(),
            ZmtpError::Deadline { .. } => "deadline",
            ZmtpError::Endpoint { .. } => "endpoint",
            ZmtpError::Limits(_) => "limits",
            ZmtpError::Bind { .. } => "bind",
        };
        TransportError::new(operation, reason, endpoint, error)
    }

    /// Counts and logs it (`kvindex_zmq_errors_total{operation,reason}`).
    pub fn record(&self) {
        metrics::counter!(m::ZMQ_ERRORS, "operation" => self.operation, "reason" => self.reason).increment(1);
        tracing::warn!(
            operation = self.operation,
            reason = self.reason,
            endpoint = %escape(&self.endpoint),
            error = %escape(&self.message),
            "zeromq error"
        );
    }
}

/// Most characters of a peer-supplied string that a log line or a debug page shows.
pub const MAX_SHOWN: usize = 256;

/// A peer-supplied string made safe to log: control characters (newlines, ANSI escapes) and
/// backslashes escaped as Rust does, cut to [`MAX_SHOWN`] characters with the original length
/// noted, so a crafted id can neither forge a log line nor flood it.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_SHOWN) + 8);
    for (shown, c) in s.chars().enumerate() {
        if shown == MAX_SHOWN {
            out.push_str(&format!("…({} bytes)", s.len()));
            break;
        }
        if c.is_control() || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// [`escape`] for bytes that may not be UTF-8 (a topic).
pub fn escape_bytes(b: &[u8]) -> String {
    escape(&String::from_utf8_lossy(&b[..b.len().min(MAX_SHOWN * 4)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_neutralizes_control_characters_and_bounds_length() {
        assert_eq!(escape("10.0.0.7:8000"), "10.0.0.7:8000");
        assert_eq!(escape("a\nINFO forged\x1b[31m"), "a\\nINFO forged\\u{1b}[31m");
        assert_eq!(escape("back\\slash"), "back\\\\slash");
        let long = "x".repeat(100_000);
        let shown = escape(&long);
        assert!(shown.len() < MAX_SHOWN + 32, "{}", shown.len());
        assert!(shown.ends_with("…(100000 bytes)"));
        assert_eq!(escape_bytes(b"kv@\xff\n"), "kv@\u{fffd}\\n");
    }
}
