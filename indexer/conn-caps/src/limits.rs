//! The bounds one HTTP listener holds its connections to, as plain values (each binary's
//! configuration fills them, its serving loop applies them with [`crate::ConnectionCaps`]).

use std::time::Duration;

/// The per-listener connection bounds: the indexer's `http_header_timeout_ms`,
/// `http_write_timeout_ms`, `http_max_connections`, `http_max_connections_per_address`,
/// `http_max_connections_per_network`; the router's `--http-header-timeout-ms`, … alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Time for a request's head to arrive, and for an idle keep-alive connection to start its
    /// next request.
    pub header_timeout: Duration,
    /// Time a write to the client may make no progress (a client that does not read its
    /// answer) before the connection is closed.
    pub write_timeout: Duration,
    /// Most connections open at once on the listener.
    pub max_connections: usize,
    /// Most connections open at once from one client IP address.
    pub max_connections_per_address: usize,
    /// Most connections open at once from one network (an IPv4 /24, an IPv6 /64).
    pub max_connections_per_network: usize,
}

/// Connections a probe listener (`probe_addr`, `--probe-addr`) holds: the kubelet opens one per
/// probe and closes it, and its answers are immediate, so a few suffice, and an idle one makes
/// room.
pub const PROBE_MAX_CONNECTIONS: usize = 16;

impl ConnLimits {
    /// The bounds of the probe listener: these timeouts, at most [`PROBE_MAX_CONNECTIONS`]
    /// connections, from one address or network alike (the kubelet probes from its node's).
    pub fn for_probes(&self) -> ConnLimits {
        let max = PROBE_MAX_CONNECTIONS.min(self.max_connections);
        ConnLimits { max_connections: max, max_connections_per_address: max, max_connections_per_network: max, ..*self }
    }
}
