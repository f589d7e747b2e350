//! Who is on the other end of a connection, and which "source" that counts as for caps and for
//! binding a topic to its publisher: the IP address for TCP (the port changes on every
//! reconnect), the uid for `ipc://` (the only stable identity a Unix socket peer has; the pid
//! changes when the engine restarts).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvindex_conn_caps::network_of;

/// One connection, unique within the process for its lifetime (never reused, never 0). A
/// publisher that reconnects gets a new id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

impl ConnId {
    pub(crate) fn next() -> ConnId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ConnId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn#{}", self.0)
    }
}

/// The peer's address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    Tcp(SocketAddr),
    /// A Unix socket at `path`; the peer's credentials as the kernel reports them.
    Ipc {
        path: Arc<str>,
        uid: Option<u32>,
        pid: Option<i32>,
    },
}

/// The stable part of a peer's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Ip(IpAddr),
    Uid(u32),
    /// An `ipc://` peer whose credentials the kernel did not give.
    UnknownIpc,
}

impl Source {
    /// The network this source belongs to ([`network_of`]); an `ipc://` source is its own.
    pub fn network(&self) -> Source {
        match self {
            Source::Ip(ip) => Source::Ip(network_of(*ip)),
            other => *other,
        }
    }
}

impl Peer {
    pub fn source(&self) -> Source {
        match self {
            Peer::Tcp(addr) => Source::Ip(addr.ip().to_canonical()),
            Peer::Ipc { uid: Some(uid), .. } => Source::Uid(*uid),
            Peer::Ipc { uid: None, .. } => Source::UnknownIpc,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(addr) => write!(f, "{addr}"),
            Peer::Ipc { path, uid, pid } => {
                write!(f, "ipc://{path}")?;
                if let Some(uid) = uid {
                    write!(f, " uid={uid}")?;
                }
                if let Some(pid) = pid {
                    write!(f, " pid={pid}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Ip(ip) => write!(f, "{ip}"),
            Source::Uid(uid) => write!(f, "uid={uid}"),
            Source::UnknownIpc => f.write_str("ipc"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_ignore_ports_and_pids() {
        let a: Peer = Peer::Tcp("10.0.0.7:40000".parse().unwrap());
        let b: Peer = Peer::Tcp("10.0.0.7:40001".parse().unwrap());
        let mapped: Peer = Peer::Tcp("[::ffff:10.0.0.7]:1".parse().unwrap());
        assert_eq!(a.source(), b.source());
        assert_eq!(a.source(), mapped.source());
        let p1 = Peer::Ipc { path: "/x".into(), uid: Some(7), pid: Some(1) };
        let p2 = Peer::Ipc { path: "/x".into(), uid: Some(7), pid: Some(2) };
        assert_eq!(p1.source(), p2.source());
        assert_eq!(p1.to_string(), "ipc:///x uid=7 pid=1");
        assert!(ConnId::next() < ConnId::next());
    }

    #[test]
    fn a_sources_network_is_its_addresss() {
        let a = Peer::Tcp("10.1.2.3:1".parse().unwrap()).source().network();
        assert_eq!(a, Peer::Tcp("10.1.2.200:2".parse().unwrap()).source().network());
        assert_ne!(a, Peer::Tcp("10.1.3.3:1".parse().unwrap()).source().network());
        assert_eq!(Source::Uid(7).network(), Source::Uid(7));
    }
}
