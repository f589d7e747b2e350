//! Free loopback ports for servers a test starts after choosing their addresses.

use std::hash::{BuildHasher, Hasher};

/// A loopback TCP port that was free a moment ago, drawn at random below Linux's ephemeral
/// range (32768 and up), not from it: a port the kernel handed out for `:0` and took back could
/// be handed out again, before the test's server binds it, to another `:0` listener or to a
/// client's source port (CI once saw a server's HTTP listener take a publisher's port).
pub fn free_port() -> u16 {
    for attempt in 0u32..10_000 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u32(attempt);
        let port = 20_000 + (h.finish() % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in 20000..32000");
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_free_port_can_be_bound_and_is_below_the_ephemeral_range() {
        let port = super::free_port();
        assert!((20_000..32_000).contains(&port));
        std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
    }
}
