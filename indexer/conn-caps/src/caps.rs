//! Which connections an HTTP listener holds, against its caps: in total, per client address and
//! per network (an IPv4 /24, an IPv6 /64, [`network_of`]); the indexer's `http_max_connections`,
//! `http_max_connections_per_address`, `http_max_connections_per_network`, the router's
//! `--max-connections`, `--max-connections-per-address`, `--max-connections-per-network`. At a full cap a
//! newcomer takes the place of an *idle* connection under that cap, which is closed: the
//! oldest idle one of the address that holds the most connections there. It is refused only
//! when every connection under the cap is answering a request. Taking from the heaviest address
//! matters when the closed clients reconnect at once: each reconnection closes another of
//! theirs, never the lone connection of a probe or of a client that has not sent its request
//! yet.
//!
//! Idle means no request is being answered: a connection that has not sent one yet (a head
//! still arriving or a TLS handshake included), or that waits for its next keep-alive request.
//! Busy means from the moment a request reaches the app until its answer is written out. So
//! silent or trickling connections from a few addresses can no longer hold the listener and
//! keep the kubelet's probes out (four addresses holding 16 silent connections each kept
//! `/healthz` from answering for 25 s), while a request being answered is never cut.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::network_of;

/// The caps of one listener and the connections it holds.
pub struct ConnectionCaps {
    max: usize,
    per_address: usize,
    per_network: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Ids and idle stamps, one counter: a later stamp is a later moment.
    next: u64,
    conns: HashMap<u64, Entry>,
    by_address: HashMap<IpAddr, usize>,
    by_network: HashMap<IpAddr, usize>,
    /// The idle connections by when they became idle, oldest first: (stamp → id).
    idle: BTreeMap<u64, u64>,
}

struct Entry {
    address: IpAddr,
    network: IpAddr,
    /// Requests being answered (hyper answers one at a time; pipelined ones wait).
    answering: usize,
    /// Its stamp in `idle`, while it is idle.
    idle_since: Option<u64>,
    /// Closes the connection when it must make room.
    close: Option<oneshot::Sender<()>>,
}

/// A connection let in: its place (given back when dropped), the signal that it must close to
/// make room, and the cap at which it made room for itself, if it did.
pub struct Admitted {
    pub place: Arc<Place>,
    pub evicted: oneshot::Receiver<()>,
    pub made_room: Option<&'static str>,
}

/// One connection's place under the caps.
pub struct Place {
    caps: Arc<ConnectionCaps>,
    id: u64,
}

/// A request being answered on a connection: it is busy (never closed to make room) until this
/// is dropped.
pub struct Answering {
    place: Arc<Place>,
}

/// Which cap a connection counts against, and so which connections may make room for it.
#[derive(Clone, Copy)]
enum Scope {
    All,
    Address(IpAddr),
    Network(IpAddr),
}

impl ConnectionCaps {
    pub fn new(max: usize, per_address: usize, per_network: usize) -> Arc<ConnectionCaps> {
        Arc::new(ConnectionCaps { max, per_address, per_network, state: Mutex::new(State::default()) })
    }

    /// A place for a connection from `ip`, making room at a full cap; or the cap that refuses it
    /// (`max_connections_per_address`, `max_connections_per_network`, `max_connections`: the
    /// metrics' reasons).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admitted, &'static str> {
        // An IPv4 client on a dual-stack listener is one address, however it is written.
        let address = ip.to_canonical();
        let network = network_of(address);
        let mut state = self.state.lock();
        let mut made_room = None;
        // Each eviction frees a place under every cap; at most one per cap is needed.
        loop {
            let (scope, reason) = if state.by_address.get(&address).is_some_and(|&n| n >= self.per_address) {
                (Scope::Address(address), "max_connections_per_address")
            } else if state.by_network.get(&network).is_some_and(|&n| n >= self.per_network) {
                (Scope::Network(network), "max_connections_per_network")
            } else if state.conns.len() >= self.max {
                (Scope::All, "max_connections")
            } else {
                break;
            };
            if !state.make_room(scope) {
                return Err(reason);
            }
            made_room = Some(reason);
        }
        let id = state.next;
        state.next += 1;
        let (close, evicted) = oneshot::channel();
        // Idle until its first request reaches the app.
        state.idle.insert(id, id);
        state.conns.insert(id, Entry { address, network, answering: 0, idle_since: Some(id), close: Some(close) });
        *state.by_address.entry(address).or_insert(0) += 1;
        *state.by_network.entry(network).or_insert(0) += 1;
        Ok(Admitted { place: Arc::new(Place { caps: self.clone(), id }), evicted, made_room })
    }

    /// Connections held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.state.lock().conns.len()
    }
}

impl State {
    /// Closes an idle connection within `scope`, the oldest of the address holding the most
    /// connections, and gives its place back at once. False when every connection there is
    /// answering a request.
    fn make_room(&mut self, scope: Scope) -> bool {
        let (conns, by_address) = (&self.conns, &self.by_address);
        let mut victim: Option<(usize, u64)> = None;
        // Oldest first: a later candidate replaces the pick only from a heavier address.
        for id in self.idle.values().copied() {
            let Some(e) = conns.get(&id) else { continue };
            let within = match scope {
                Scope::All => true,
                Scope::Address(a) => e.address == a,
                Scope::Network(n) => e.network == n,
            };
            let weight = by_address.get(&e.address).copied().unwrap_or(0);
            if within && victim.is_none_or(|(heaviest, _)| weight > heaviest) {
                victim = Some((weight, id));
            }
        }
        let victim = victim.map(|(_, id)| id);
        let Some(entry) = victim.and_then(|id| self.remove(id)) else { return false };
        if let Some(close) = entry.close {
            let _ = close.send(());
        }
        true
    }

    /// Takes `id` out of every count.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.conns.remove(&id)?;
        if let Some(stamp) = entry.idle_since {
            self.idle.remove(&stamp);
        }
        for (counts, key) in [(&mut self.by_address, entry.address), (&mut self.by_network, entry.network)] {
            if let Some(n) = counts.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&key);
                }
            }
        }
        Some(entry)
    }
}

impl Place {
    /// A request reached the app: the connection is busy until the returned value is dropped.
    pub fn answering(self: &Arc<Self>) -> Answering {
        let mut state = self.caps.state.lock();
        if let Some(entry) = state.conns.get_mut(&self.id) {
            entry.answering += 1;
            if let Some(stamp) = entry.idle_since.take() {
                state.idle.remove(&stamp);
            }
        }
        Answering { place: self.clone() }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let mut state = self.place.caps.state.lock();
        let stamp = state.next;
        let Some(entry) = state.conns.get_mut(&self.place.id) else { return };
        entry.answering = entry.answering.saturating_sub(1);
        if entry.answering == 0 && entry.idle_since.is_none() {
            entry.idle_since = Some(stamp);
            state.next += 1;
            state.idle.insert(stamp, self.place.id);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // Gone already if it was closed to make room.
        self.caps.state.lock().remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn at_the_total_the_oldest_idle_makes_room_and_a_busy_one_never_does() {
        let caps = ConnectionCaps::new(2, 2, 2);
        let mut a = caps.admit(ip("10.0.1.1")).unwrap();
        let b = caps.admit(ip("10.0.2.1")).unwrap();
        let busy_b = b.place.answering();
        let mut c = caps.admit(ip("10.0.3.1")).unwrap();
        assert_eq!(c.made_room, Some("max_connections"));
        assert!(a.evicted.try_recv().is_ok(), "the idle one was told to close");
        assert_eq!(caps.held(), 2, "its place went to the newcomer at once");
        drop(a);
        assert_eq!(caps.held(), 2, "an evicted place is not given back twice");
        let d = caps.admit(ip("10.0.4.1")).unwrap();
        assert!(c.evicted.try_recv().is_ok(), "c was the oldest idle one, not b (busy)");
        let busy_d = d.place.answering();
        assert_eq!(caps.admit(ip("10.0.5.1")).err(), Some("max_connections"), "every connection busy: refused");
        drop(busy_d);
        assert!(caps.admit(ip("10.0.5.1")).is_ok(), "idle again once answered");
        drop((busy_b, b, c));
    }

    #[test]
    fn room_is_taken_from_the_address_holding_the_most() {
        let caps = ConnectionCaps::new(4, 4, 4);
        let mut lone = caps.admit(ip("10.0.1.1")).unwrap();
        let mut heavy: Vec<Admitted> = (0..3).map(|_| caps.admit(ip("10.0.2.1")).unwrap()).collect();
        // The lone connection is the oldest idle one, but 10.0.2.1 holds three.
        let newcomer = caps.admit(ip("10.0.3.1")).unwrap();
        assert_eq!(newcomer.made_room, Some("max_connections"));
        assert!(lone.evicted.try_recv().is_err(), "the lone connection stays");
        assert!(heavy[0].evicted.try_recv().is_ok(), "the heavy address's oldest goes");
        assert!(heavy[1..].iter_mut().all(|h| h.evicted.try_recv().is_err()));
    }

    #[test]
    fn an_address_and_a_network_make_room_only_among_their_own() {
        let caps = ConnectionCaps::new(10, 2, 3);
        let mut first = caps.admit(ip("10.0.1.1")).unwrap();
        let second = caps.admit(ip("10.0.1.1")).unwrap();
        let mut other = caps.admit(ip("10.0.9.1")).unwrap();
        // The address is full: its own oldest idle connection goes, not the older one of another
        // address (the same address, written as IPv6).
        let third = caps.admit(ip("::ffff:10.0.1.1")).unwrap();
        assert_eq!(third.made_room, Some("max_connections_per_address"));
        assert!(first.evicted.try_recv().is_ok());
        assert!(other.evicted.try_recv().is_err());
        // 10.0.1.0/24 holds three: full.
        let fourth = caps.admit(ip("10.0.1.2")).unwrap();
        assert_eq!(fourth.made_room, None);
        let busy: Vec<Answering> = [&second, &third, &fourth].iter().map(|a| a.place.answering()).collect();
        assert_eq!(caps.admit(ip("10.0.1.3")).err(), Some("max_connections_per_network"), "all of it busy");
        assert!(caps.admit(ip("10.0.2.3")).is_ok(), "another network still gets in");
        drop(busy);
        let after = caps.admit(ip("10.0.1.3")).unwrap();
        assert_eq!(after.made_room, Some("max_connections_per_network"), "idle again once answered");
        assert!(other.evicted.try_recv().is_err(), "never the other network's");
        drop((first, second, third, fourth, after));
    }
}
