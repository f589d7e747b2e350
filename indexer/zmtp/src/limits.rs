//! What a peer may make us hold, wait for or allocate: every bound of the crate in one plain
//! struct, so the server declares them once in its config and tests can shrink them.
//!
//! Every port is a door: each field bounds one resource a peer controls (bytes declared in a
//! frame header, bytes sent but never finished, descriptors, time). A violation closes that
//! peer's connection with a [`crate::Reason`] the server can count; it never affects other
//! connections and never allocates what the peer merely declared.

use std::time::Duration;

/// Bounds for one socket (a listener, a dialer or a dealer request). Start from
/// [`Limits::default`] and override fields; [`Limits::validate`] rejects unusable values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame body accepted. A header declaring more closes the connection before a
    /// byte of the body is read or allocated. vLLM batches are well under 1 MiB (a chunked
    /// prefill step stores at most a few thousand blocks). Default 16 MiB.
    pub max_frame_size: usize,
    /// Largest message (the sum of its frames). It is also the most a connection can hold for
    /// an unfinished multi-part message: a frame header that would take the message past it
    /// closes the connection. Default 16 MiB.
    pub max_message_size: usize,
    /// Most frames in one message (vLLM sends 3 live, 3 or 4 in a replay). Default 16.
    pub max_parts: usize,
    /// Bytes one socket may hold at once: unfinished messages of every connection plus
    /// delivered messages the server has not dropped yet. When it is reached, connections stop
    /// reading (TCP pushes back; a PUB then drops at its high-water mark, which shows as a seq
    /// gap) until the server drops messages. Default 512 MiB.
    pub max_bytes_in_flight: usize,
    /// The same, for the connections of one source (an IP address, or a uid for `ipc://`) on a
    /// listener, so one address holding unfinished messages on many connections cannot spend
    /// the whole budget and stall the other publishers. Default 64 MiB.
    pub max_bytes_in_flight_per_source: usize,
    /// Most connections a listener holds, handshaking ones included. At the cap a newcomer
    /// takes the place of a connection still handshaking (the oldest of the source with the
    /// most; closed and reported as [`crate::Reason::Evicted`]), and is refused only when
    /// every connection has handshaken.
    /// Default 1024.
    pub max_connections: usize,
    /// Most connections a listener holds from one source (an IP address, or a uid for
    /// `ipc://`), so one address cannot lock the others out; past it a newcomer is refused.
    /// Default 32.
    pub max_connections_per_source: usize,
    /// Most connections a listener holds from one network (an IPv4 /24, an IPv6 /64; see
    /// [`crate::network_of`]), so a few addresses of one owner cannot take the listener either.
    /// At the cap a newcomer takes the place of one of the network's handshaking connections
    /// (the same pick), and is refused when there is none. Default 512 (half of `max_connections`).
    pub max_connections_per_network: usize,
    /// Most connections a listener holds that have not finished their handshake yet. A
    /// socket that never greets still holds a descriptor until `handshake_timeout`, so these
    /// are bounded apart from (and well below) `max_connections`: half-open sockets can never
    /// take the room of publishers that did handshake. At the cap a newcomer takes the place
    /// of one of them (the same pick), so half-open sockets cannot keep a publisher from
    /// handshaking either. Default 256.
    pub max_handshaking: usize,
    /// The same, from one source: an address holding many half-open sockets cannot keep a
    /// publisher from another address from handshaking; past it a newcomer is refused. Default
    /// 4 (an engine handshakes in milliseconds, and a node's DP ranks dial one after another).
    pub max_handshaking_per_source: usize,
    /// Time from accept (or connect) to a finished ZMTP handshake. Default 10 s.
    pub handshake_timeout: Duration,
    /// Silence after which we PING a ZMTP 3.1 peer (3.0 has no heartbeat). Default 10 s.
    pub heartbeat_interval: Duration,
    /// Silence (no byte at all, PONG included) after which a connection is closed. A 3.1 peer
    /// answers our PINGs, so only a dead or hostile one reaches it; a 3.0 peer that publishes
    /// nothing for this long is closed (and re-dials). Default 60 s.
    pub idle_timeout: Duration,
    /// Events queued for the server before connections wait for it (the byte bound is
    /// `max_bytes_in_flight`). Default 1024.
    pub max_queued_events: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_size: 16 << 20,
            max_message_size: 16 << 20,
            max_parts: 16,
            max_bytes_in_flight: 512 << 20,
            max_bytes_in_flight_per_source: 64 << 20,
            max_connections: 1024,
            max_connections_per_source: 32,
            max_connections_per_network: 512,
            max_handshaking: 256,
            max_handshaking_per_source: 4,
            handshake_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_queued_events: 1024,
        }
    }
}

impl Limits {
    /// Checks that every bound can be met: sizes and counts above zero, a message at least as
    /// large as a frame, budgets that fit one whole message (the source's within the total), timeouts above zero and a
    /// heartbeat shorter than the idle timeout.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_frame_size", self.max_frame_size),
            ("max_message_size", self.max_message_size),
            ("max_parts", self.max_parts),
            ("max_bytes_in_flight", self.max_bytes_in_flight),
            ("max_bytes_in_flight_per_source", self.max_bytes_in_flight_per_source),
            ("max_connections", self.max_connections),
            ("max_connections_per_source", self.max_connections_per_source),
            ("max_connections_per_network", self.max_connections_per_network),
            ("max_handshaking", self.max_handshaking),
            ("max_handshaking_per_source", self.max_handshaking_per_source),
            ("max_queued_events", self.max_queued_events),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be above 0"));
        }
        if self.max_message_size < self.max_frame_size {
            return Err("max_message_size must be at least max_frame_size".into());
        }
        if self.max_bytes_in_flight_per_source < self.max_message_size {
            return Err("max_bytes_in_flight_per_source must hold at least one max_message_size message".into());
        }
        if self.max_bytes_in_flight < self.max_bytes_in_flight_per_source {
            return Err("max_bytes_in_flight must be at least max_bytes_in_flight_per_source".into());
        }
        for (name, d) in [
            ("handshake_timeout", self.handshake_timeout),
            ("heartbeat_interval", self.heartbeat_interval),
            ("idle_timeout", self.idle_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("{name} must be above 0"));
            }
        }
        if self.heartbeat_interval >= self.idle_timeout {
            return Err("heartbeat_interval must be shorter than idle_timeout".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_each_bad_value_is_named() {
        assert_eq!(Limits::default().validate(), Ok(()));
        let bad = Limits { max_parts: 0, ..Limits::default() };
        assert!(bad.validate().unwrap_err().contains("max_parts"));
        let bad = Limits { max_message_size: 1, ..Limits::default() };
        assert!(bad.validate().unwrap_err().contains("max_message_size"));
        let bad = Limits { heartbeat_interval: Duration::from_secs(60), ..Limits::default() };
        assert!(bad.validate().unwrap_err().contains("heartbeat_interval"));
    }
}
