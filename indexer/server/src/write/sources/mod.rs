//! Live sources: the central SUB (bound; engines dial in, their topics name the pods) and
//! per-pod SUBs (we dial each engine's PUB; which pods exist is `crate::pods`' to decide).
//! The ZeroMQ side is [`crate::write::transport`]; here every message becomes work for its
//! apply worker. A full queue is waited on, not dropped from: the socket is not read
//! meanwhile, so TCP pushes back on the publisher, which queues up to its high-water mark and
//! drops past it (a seq gap here, replayed from its buffer). A dialled pod waits on its own;
//! the central SUB's one reading task hands messages through a relay per worker ([`relay`]),
//! so one full worker does not stop the others' sources. A queued message keeps its lease on
//! its socket's byte budget, so the apply queue is bounded in bytes as well as in messages.
//!
//! Every message carries its connection id: a stream whose messages come on a new connection
//! is resynced from seq 0 (a restarted engine may already be past our cursor). A closed
//! connection clears, at once, every stream it carried: a restarted vLLM publishes nothing
//! until it serves a request, so its old process's blocks must not wait for that message.
//! The disconnect is queued behind that connection's messages, so it clears after them. Topic
//! filtering is done by the publisher from our subscription; the worker re-checks the prefix.

pub mod connections;
mod relay;

use std::sync::Arc;
use std::time::Duration;

use crate::protocols::{LiveSocket, Work};
use crate::queue::Queues;
use crate::shutdown::Shutdown;
use crate::source_series::{self, SourceSeries};
use crate::telemetry as m;
use crate::write::transport::{self, Backoff, Event, SocketKind, SubDialer, SubListener, TransportError};

/// How often the bytes-in-flight gauge of a socket is refreshed.
const GAUGE_PERIOD: Duration = Duration::from_secs(1);

/// Serves the bound central SUB (subscribed to `topic_filter`) until `shutdown`, handing its
/// messages to `queues` and its connections to `connections`.
pub async fn serve_central(
    queues: Arc<Queues>,
    connections: Arc<connections::CentralConnections>,
    topic_filter: String,
    mut sub: SubListener,
    mut shutdown: Shutdown,
) {
    tracing::info!(endpoint = %sub.endpoint(), filter = %transport::escape(&topic_filter), "central SUB bound");
    let gauge = metrics::gauge!(m::ZMQ_BYTES_IN_FLIGHT, "socket" => SocketKind::Central.label());
    let mut refresh = tokio::time::interval(GAUGE_PERIOD);
    let forward_to = queues.clone();
    let relays = relay::Relays::open(queues.workers(), queues.capacity_per_worker(), move |worker, work| {
        let queues = forward_to.clone();
        async move { queues.send(worker, work).await }
    });
    loop {
        let event = tokio::select! {
            event = sub.recv() => match event {
                Some(event) => event,
                None => return,
            },
            _ = refresh.tick() => {
                gauge.set(sub.bytes_in_flight() as f64);
                continue;
            }
            _ = shutdown.recv() => return,
        };
        match event {
            Event::Message(msg) => {
                let worker = queues.worker_for(msg.frames.first().map_or(&[][..], |f| f.as_ref()));
                let work = Work::live(LiveSocket::Central, msg);
                tokio::select! {
                    sent = relays.send(worker, work) => if !sent { return },
                    _ = shutdown.recv() => return,
                }
            }
            other => {
                match &other {
                    Event::Connected { conn, peer, .. } => {
                        connections.note(peer.source(), true);
                        // A stream this address published before may catch up on it (any worker
                        // may hold one); the relays keep this before the connection's messages.
                        for worker in 0..queues.workers() {
                            let work = Work::Connected { origin: LiveSocket::Central, conn: *conn, peer: peer.clone() };
                            relays.send(worker, work).await;
                        }
                    }
                    Event::Disconnected { conn, peer, .. } => {
                        connections.note(peer.source(), false);
                        // Any worker may hold a stream of this connection (one per topic); the
                        // relays keep it behind the connection's messages.
                        for worker in 0..queues.workers() {
                            relays.send(worker, Work::Disconnected { origin: LiveSocket::Central, conn: *conn }).await;
                        }
                    }
                    _ => {}
                }
                transport::note_event(SocketKind::Central, "-", &other)
            }
        }
    }
}

/// What a dialled pod's SUB needs: the queues its messages go to, the subscription, and the
/// socket bounds with the byte budget every dialled pod shares (`zmq_max_bytes_in_flight`).
#[derive(Clone)]
pub struct Dialer {
    queues: Arc<Queues>,
    topic_filter: String,
    /// The engine of a pod whose entry names none (`default_engine`).
    default_engine: kvindex::wire::Engine,
    /// One pod's socket holds at most a source's share (`zmq_max_bytes_in_flight_per_source`).
    limits: kvindex_zmtp::Limits,
    /// All dialled pods together hold at most this: a thousand registered pods cannot hold a
    /// thousand shares.
    shared: kvindex_zmtp::Budget,
}

impl Dialer {
    /// The dialler of `zmq_limits`' bounds, subscribing to `topic_filter`.
    pub fn new(
        queues: Arc<Queues>,
        topic_filter: String,
        default_engine: kvindex::wire::Engine,
        zmq_limits: kvindex_zmtp::Limits,
    ) -> Dialer {
        let shared = kvindex_zmtp::Budget::new(zmq_limits.max_bytes_in_flight);
        let mut limits = zmq_limits;
        limits.max_bytes_in_flight = limits.max_bytes_in_flight_per_source;
        Dialer { queues, topic_filter, default_engine, limits, shared }
    }

    /// Dials one pod's PUB endpoint until `shutdown`; re-dials (with backoff) after a refused
    /// connect or a disconnect. An SGLang pod is subscribed to every topic: SGLang publishes
    /// topic `""` unless `kv_events_config.topic` is set, and a dialled pod is named by its entry.
    pub async fn dial(
        self,
        id: Arc<str>,
        model: Arc<str>,
        endpoint: Arc<str>,
        engine: Option<kvindex::wire::Engine>,
        mut shutdown: Shutdown,
    ) {
        let queues = &self.queues;
        let worker = queues.worker_for(id.as_bytes());
        let origin = LiveSocket::Pod { id: id.clone(), model, endpoint: endpoint.clone() };
        let any_topic = engine.unwrap_or(self.default_engine) == kvindex::wire::Engine::Sglang;
        let filters = [if any_topic { &b""[..] } else { self.topic_filter.as_bytes() }];
        let limits = self.limits.clone();
        let shared = Some(self.shared.clone());
        let mut sub = match SubDialer::connect_sharing(&endpoint, &filters, limits, Backoff::default(), shared) {
            Ok(sub) => sub,
            Err(e) => return TransportError::from_zmtp("connect", &endpoint, &e).record(),
        };
        let mut connected_before = false;
        // Its series goes when the pod does (this task ends when it is unregistered).
        let counters = SourceSeries::global().dialler(&id);
        loop {
            let event = tokio::select! {
                event = sub.recv() => match event {
                    Some(event) => event,
                    None => return,
                },
                _ = shutdown.recv() => return,
            };
            match event {
                Event::Message(msg) => {
                    let work = Work::live(origin.clone(), msg);
                    // Waits for room: this pod's socket is not read meanwhile (backpressure).
                    tokio::select! {
                        sent = queues.send(worker, work) => if !sent { return },
                        _ = shutdown.recv() => return,
                    }
                }
                other => {
                    if let Event::Connected { conn, peer, .. } = &other {
                        if std::mem::replace(&mut connected_before, true) {
                            source_series::add(&counters.reconnections, 1);
                        }
                        // What the engine published before this subscription reached it is asked
                        // from its replay socket (queued before the connection's messages).
                        let work = Work::Connected { origin: origin.clone(), conn: *conn, peer: peer.clone() };
                        queues.send(worker, work).await;
                    }
                    if let Event::Disconnected { conn, .. } = &other {
                        queues.send(worker, Work::Disconnected { origin: origin.clone(), conn: *conn }).await;
                    }
                    transport::note_event(SocketKind::Pod, &id, &other);
                }
            }
        }
    }
}
