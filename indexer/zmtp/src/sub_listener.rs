//! A bound SUB that engines dial (vLLM's default when its endpoint has no `*`: the engine
//! connects, so one indexer address serves the whole fleet). Accepts many publishers, caps
//! them per listener, per network and per source, handshakes each under a timeout, and turns
//! every connection into [`Event`]s on one queue.
//!
//! One task per bound endpoint accepts (one SUB may listen on several ports, e.g. every DP
//! rank's); one task per connection reads. Connections are capped before the
//! handshake starts (a refused one is closed at once and reported), so a flood of sockets from
//! one address costs us a descriptor for microseconds, not for the handshake timeout. Those
//! still handshaking are capped apart, in total and per source, so sockets that never greet
//! (each holding a descriptor until the handshake timeout) cannot take the room of publishers
//! from other addresses. And when the listener, its handshaking share or a network's share is
//! full, the newcomer takes the place of a connection still handshaking there, which is closed
//! ([`Reason::Evicted`]): the oldest of the source with the most handshaking. An engine
//! handshakes in milliseconds on one connection, so half-open sockets from many addresses
//! cannot keep it out either: re-opened as fast as they are closed, each closes another of
//! its own kind, never the engine's. A newcomer is refused only by its own source's caps, or
//! where every connection has handshaken. Dropping the listener stops the accept task and
//! every connection task with it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::timeout;

use crate::budget::Budget;
use crate::endpoint::Endpoint;
use crate::error::{Error, Reason};
use crate::event::Event;
use crate::handshake::{self, SocketType};
use crate::limits::Limits;
use crate::peer::{ConnId, Peer, Source};
use crate::sub::pump;
use crate::transport::{Listener, SocketFile, Stream};

/// Pause after a failed `accept` (typically EMFILE), so the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A bound SUB socket: [`SubListener::recv`] yields its [`Event`]s.
pub struct SubListener {
    events: mpsc::Receiver<Event>,
    /// As bound, in the order given (at least one).
    endpoints: Vec<String>,
    budget: Budget,
    accept_tasks: Vec<AbortHandle>,
    _socket_files: Vec<SocketFile>,
}

/// Decides, from its address alone, whether a peer may connect at all (the ZAP idea without
/// ZAP): e.g. an allowlist of the engines' CIDRs. Refused peers are closed before the
/// handshake and reported as [`Reason::NotAllowed`].
pub type Admission = Arc<dyn Fn(&Peer) -> bool + Send + Sync>;

struct Shared {
    limits: Limits,
    admission: Option<Admission>,
    subscriptions: Vec<Bytes>,
    budget: Budget,
    sources: Mutex<Sources>,
    events: mpsc::Sender<Event>,
}

#[derive(Default)]
struct Sources {
    total: usize,
    /// Of `total`, those that have not finished their handshake.
    handshaking: usize,
    by_source: HashMap<Source, SourceEntry>,
    /// Connections per network ([`Source::network`]).
    by_network: HashMap<Source, usize>,
    /// The connections still handshaking, oldest first (by admission): those that make room
    /// for a newcomer at a full cap.
    waiting: BTreeMap<u64, Waiting>,
    admitted: u64,
}

struct SourceEntry {
    connections: usize,
    handshaking: usize,
    budget: Budget,
}

/// A handshaking connection, as the caps see it: whose it is, and how to close it.
struct Waiting {
    source: Source,
    network: Source,
    evict: oneshot::Sender<()>,
}

impl Sources {
    /// Gives back one connection's place: in total, its source's and its network's, and, if
    /// it was still handshaking, in those caps too.
    fn release(&mut self, source: &Source, network: &Source, handshaking: bool) {
        let handshaking = usize::from(handshaking);
        self.total -= 1;
        self.handshaking -= handshaking;
        if let Some(entry) = self.by_source.get_mut(source) {
            entry.connections -= 1;
            entry.handshaking -= handshaking;
            if entry.connections == 0 && entry.budget.used() == 0 {
                self.by_source.remove(source);
            }
        }
        if let Some(n) = self.by_network.get_mut(network) {
            *n -= 1;
            if *n == 0 {
                self.by_network.remove(network);
            }
        }
    }

    /// Closes a handshaking connection (of `network`, if given), the oldest of the source with
    /// the most handshaking, and gives its place back at once. False when there is none.
    fn make_room(&mut self, network: Option<&Source>) -> bool {
        let mut pick: Option<(usize, u64)> = None;
        // Oldest first: a later candidate replaces the pick only from a heavier source.
        for (order, w) in &self.waiting {
            if network.is_some_and(|n| w.network != *n) {
                continue;
            }
            let weight = self.by_source.get(&w.source).map_or(0, |e| e.handshaking);
            if pick.is_none_or(|(heaviest, _)| weight > heaviest) {
                pick = Some((weight, *order));
            }
        }
        let Some(victim) = pick.and_then(|(_, k)| self.waiting.remove(&k)) else { return false };
        self.release(&victim.source, &victim.network, true);
        let _ = victim.evict.send(());
        true
    }
}

/// A connection's place in the caps; freed when the connection's task ends (or is aborted),
/// or at once when it is evicted.
struct Slot {
    shared: Arc<Shared>,
    source: Source,
    network: Source,
    /// Its place among the handshaking connections, until it has handshaken.
    waiting: Option<u64>,
}

impl Slot {
    /// The handshake is done: the connection leaves the handshaking caps (not the others).
    /// False when it was evicted meanwhile (its place is gone: it must close).
    fn handshaken(&mut self) -> bool {
        let Some(order) = self.waiting.take() else { return true };
        let mut sources = self.shared.sources.lock().unwrap_or_else(|e| e.into_inner());
        if sources.waiting.remove(&order).is_none() {
            return false;
        }
        sources.handshaking -= 1;
        if let Some(entry) = sources.by_source.get_mut(&self.source) {
            entry.handshaking -= 1;
        }
        true
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut sources = self.shared.sources.lock().unwrap_or_else(|e| e.into_inner());
        match self.waiting {
            // Evicted: its place was given back then.
            Some(order) if sources.waiting.remove(&order).is_none() => {}
            waiting => sources.release(&self.source, &self.network, waiting.is_some()),
        }
    }
}

/// What admission gives a connection: its place, its source's byte budget, and the signal
/// that it was evicted.
type Admitted = (Slot, Budget, oneshot::Receiver<()>);

impl Shared {
    /// Takes a slot for `peer` if the caps allow, making room at a full cap by evicting the
    /// oldest handshaking connection that counts against it.
    fn admit(self: &Arc<Self>, peer: &Peer) -> Result<Admitted, Reason> {
        if self.admission.as_ref().is_some_and(|allowed| !allowed(peer)) {
            return Err(Reason::NotAllowed);
        }
        let limits = &self.limits;
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let source = peer.source();
        let network = source.network();
        // A source's own caps refuse the newcomer: it would only make room among its own.
        if let Some(entry) = sources.by_source.get(&source) {
            if entry.connections >= limits.max_connections_per_source {
                return Err(Reason::SourceFull { limit: limits.max_connections_per_source });
            }
            if entry.handshaking >= limits.max_handshaking_per_source {
                return Err(Reason::SourceHandshakingFull { limit: limits.max_handshaking_per_source });
            }
        }
        // Each eviction frees a place under every cap; at most one per cap is needed.
        loop {
            if sources.by_network.get(&network).is_some_and(|&n| n >= limits.max_connections_per_network) {
                if !sources.make_room(Some(&network)) {
                    return Err(Reason::NetworkFull { limit: limits.max_connections_per_network });
                }
            } else if sources.total >= limits.max_connections {
                if !sources.make_room(None) {
                    return Err(Reason::ListenerFull { limit: limits.max_connections });
                }
            } else if sources.handshaking >= limits.max_handshaking {
                if !sources.make_room(None) {
                    return Err(Reason::HandshakingFull { limit: limits.max_handshaking });
                }
            } else {
                break;
            }
        }
        if sources.by_source.len() > 2 * limits.max_connections {
            // Sources whose last connection left while their messages were still queued.
            sources.by_source.retain(|_, e| e.connections > 0 || e.budget.used() > 0);
        }
        let per_source = limits.max_bytes_in_flight_per_source;
        let entry = sources.by_source.entry(source).or_insert_with(|| SourceEntry {
            connections: 0,
            handshaking: 0,
            budget: Budget::new(per_source),
        });
        entry.connections += 1;
        entry.handshaking += 1;
        let budget = entry.budget.clone();
        *sources.by_network.entry(network).or_insert(0) += 1;
        sources.total += 1;
        sources.handshaking += 1;
        sources.admitted += 1;
        let order = sources.admitted;
        let (evict, evicted) = oneshot::channel();
        sources.waiting.insert(order, Waiting { source, network, evict });
        Ok((Slot { shared: self.clone(), source, network, waiting: Some(order) }, budget, evicted))
    }
}

impl SubListener {
    /// Binds `endpoint` (`tcp://*:5557`, `tcp://10.0.0.2:0`, `ipc:///run/kv.sock`) and
    /// subscribes every publisher that connects to `subscriptions` (topic prefixes; `b""` is
    /// everything). Must be called inside a tokio runtime.
    pub async fn bind(endpoint: &str, subscriptions: &[&[u8]], limits: Limits) -> Result<SubListener, Error> {
        SubListener::bind_admitting(endpoint, subscriptions, limits, None).await
    }

    /// [`SubListener::bind`], refusing peers that `admission` does not allow.
    pub async fn bind_admitting(
        endpoint: &str,
        subscriptions: &[&[u8]],
        limits: Limits,
        admission: Option<Admission>,
    ) -> Result<SubListener, Error> {
        SubListener::bind_all_admitting(&[endpoint], subscriptions, limits, admission).await
    }

    /// [`SubListener::bind_admitting`] on several endpoints at once, one SUB as ZeroMQ binds
    /// one socket to several addresses: the caps, budgets and event queue are shared (e.g.
    /// the port of every DP rank, which engines dial at their configured port + rank).
    pub async fn bind_all_admitting(
        endpoints: &[&str],
        subscriptions: &[&[u8]],
        limits: Limits,
        admission: Option<Admission>,
    ) -> Result<SubListener, Error> {
        assert!(!endpoints.is_empty(), "a SUB listener binds at least one endpoint");
        limits.validate().map_err(Error::Limits)?;
        let mut listeners = Vec::with_capacity(endpoints.len());
        let mut bound = Vec::with_capacity(endpoints.len());
        let mut socket_files = Vec::new();
        for endpoint in endpoints {
            let parsed = Endpoint::parse(endpoint)?;
            let bind_error = |source| Error::Bind { endpoint: endpoint.to_string(), source };
            let (listener, socket_file) = Listener::bind(&parsed).await.map_err(bind_error)?;
            bound.push(listener.local_endpoint().map_err(bind_error)?);
            listeners.push(listener);
            socket_files.extend(socket_file);
        }
        let (tx, rx) = mpsc::channel(limits.max_queued_events);
        let budget = Budget::new(limits.max_bytes_in_flight);
        let shared = Arc::new(Shared {
            subscriptions: subscriptions.iter().map(|s| Bytes::copy_from_slice(s)).collect(),
            budget: budget.clone(),
            limits,
            admission,
            sources: Mutex::new(Sources::default()),
            events: tx,
        });
        let accept_tasks =
            listeners.into_iter().map(|l| tokio::spawn(accept_loop(l, shared.clone())).abort_handle()).collect();
        Ok(SubListener { events: rx, endpoints: bound, budget, accept_tasks, _socket_files: socket_files })
    }

    /// The (first) endpoint as bound, with port 0 resolved (`tcp://0.0.0.0:40123`).
    pub fn endpoint(&self) -> &str {
        &self.endpoints[0]
    }

    /// Every endpoint as bound.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The next event; `None` only if the listener's tasks are gone.
    pub async fn recv(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Bytes held now (unfinished messages and undropped [`Message`]s), for a gauge.
    pub fn bytes_in_flight(&self) -> usize {
        self.budget.used()
    }
}

impl Drop for SubListener {
    fn drop(&mut self) {
        for task in &self.accept_tasks {
            task.abort();
        }
    }
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>) {
    // Owned here so that aborting this task aborts every connection task too.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match shared.admit(&peer) {
                    Ok((slot, source_budget, evicted)) => {
                        connections.spawn(serve(shared.clone(), stream, Arc::new(peer), slot, source_budget, evicted));
                    }
                    Err(reason) => {
                        drop(stream);
                        if shared.events.send(Event::Rejected { peer: Arc::new(peer), reason }).await.is_err() {
                            return;
                        }
                    }
                },
                Err(e) => {
                    let event = Event::AcceptFailed { error: e.kind(), retry_in: ACCEPT_RETRY };
                    if shared.events.send(event).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(
    shared: Arc<Shared>,
    stream: Stream,
    peer: Arc<Peer>,
    mut slot: Slot,
    source_budget: Budget,
    evicted: oneshot::Receiver<()>,
) {
    let lease = shared.budget.lease_with(source_budget);
    let handshake = async {
        let (mut conn, info) = handshake::handshake(stream, SocketType::Sub, &shared.limits, lease).await?;
        handshake::subscribe(&mut conn, &shared.subscriptions).await?;
        Ok::<_, Reason>((conn, info))
    };
    let outcome = tokio::select! {
        outcome = timeout(shared.limits.handshake_timeout, handshake) => outcome,
        // Its place went to a newer connection (the sender is only dropped with it: evicted).
        _ = evicted => return drop(shared.events.send(Event::Rejected { peer, reason: Reason::Evicted }).await),
    };
    let (mut conn, info) = match outcome {
        Ok(Ok(done)) => done,
        Ok(Err(reason)) => return drop(shared.events.send(Event::Rejected { peer, reason }).await),
        Err(_) => return drop(shared.events.send(Event::Rejected { peer, reason: Reason::HandshakeTimeout }).await),
    };
    if !slot.handshaken() {
        return drop(shared.events.send(Event::Rejected { peer, reason: Reason::Evicted }).await);
    }
    let conn_id = ConnId::next();
    if shared.events.send(Event::Connected { conn: conn_id, peer: peer.clone(), info }).await.is_err() {
        return;
    }
    let reason = pump(&mut conn, conn_id, &peer, &shared.subscriptions, &shared.events).await;
    drop(conn); // its unfinished bytes go back to the budget before the server hears of it
    let _ = shared.events.send(Event::Disconnected { conn: conn_id, peer, reason }).await;
}
