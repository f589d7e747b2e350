//! Live sources: the central SUB (bound; engines dial in, their topics name the pods) and
//! per-pod SUBs (we dial each engine's PUB), and the [`registry`] of pods that decides which
//! exist. The ZeroMQ side is [`crate::transport`]; here every message becomes work for its
//! apply worker. A full queue is waited on, not dropped from: the socket is not read
//! meanwhile, so TCP pushes back on the publisher, which queues up to its high-water mark and
//! drops past it (a seq gap here, replayed from its buffer). A dialled pod waits on its own;
//! the central SUB's one reading task hands messages through a door per worker ([`doors`]),
//! so one full worker does not stop the others' sources. A queued message keeps its lease on
//! its socket's byte budget, so the apply queue is bounded in bytes as well as in messages.
//!
//! Every message carries its connection id: a stream whose messages come on a new connection
//! is resynced from seq 0 (a restarted engine may already be past our cursor). A closed
//! connection clears, at once, every stream it carried: a restarted vLLM publishes nothing
//! until it serves a request, so its old process's blocks must not wait for that message.
//! The disconnect is queued behind that connection's messages, so it clears after them. Topic
//! filtering is done by the publisher from our subscription; the worker re-checks the prefix.

pub mod discovery;
mod doors;
pub mod registry;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::apply::{Origin, Work};
use crate::state::ServiceState;
use crate::telemetry as m;
use crate::transport::{self, Backoff, Event, SocketKind, SubDialer, SubListener, TransportError};

/// How often the bytes-in-flight gauge of a socket is refreshed.
const GAUGE_PERIOD: Duration = Duration::from_secs(1);

/// Serves the bound central SUB until `stop` is set.
pub async fn serve_central(state: Arc<ServiceState>, mut sub: SubListener, mut stop: watch::Receiver<bool>) {
    tracing::info!(endpoint = %sub.endpoint(), filter = %transport::escape(&state.config().topic_filter), "central SUB bound");
    let gauge = metrics::gauge!(m::ZMQ_BYTES_IN_FLIGHT, "socket" => SocketKind::Central.label());
    let mut refresh = tokio::time::interval(GAUGE_PERIOD);
    let forward_to = state.clone();
    let doors =
        doors::Doors::open(state.queues().workers(), state.queues().capacity_per_worker(), move |worker, work| {
            let state = forward_to.clone();
            async move { state.queues().send(worker, work).await }
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
            _ = stop.wait_for(|stop| *stop) => return,
        };
        match event {
            Event::Message(msg) => {
                let worker = state.queues().worker_for(msg.frames.first().map_or(&[][..], |f| f.as_ref()));
                let work = Work::Live {
                    origin: Origin::Central,
                    conn: msg.conn,
                    peer: msg.peer,
                    frames: msg.frames,
                    lease: msg.lease,
                    at: msg.received_at,
                };
                tokio::select! {
                    sent = doors.send(worker, work) => if !sent { return },
                    _ = stop.wait_for(|stop| *stop) => return,
                }
            }
            other => {
                match &other {
                    Event::Connected { peer, .. } => state.central_connection(peer.source(), true),
                    Event::Disconnected { conn, peer, .. } => {
                        state.central_connection(peer.source(), false);
                        // Any worker may hold a stream of this connection (one per topic); the
                        // doors keep it behind the connection's messages.
                        for worker in 0..state.queues().workers() {
                            doors.send(worker, Work::Disconnected { origin: Origin::Central, conn: *conn }).await;
                        }
                    }
                    _ => {}
                }
                transport::note_event(SocketKind::Central, "-", &other)
            }
        }
    }
}

/// Dials one pod's PUB endpoint until `stop` is set; re-dials (with backoff) after a refused
/// connect or a disconnect.
pub async fn dial_pod(
    state: Arc<ServiceState>,
    id: Arc<str>,
    model: Arc<str>,
    endpoint: Arc<str>,
    mut stop: watch::Receiver<bool>,
) {
    let worker = state.queues().worker_for(id.as_bytes());
    let origin = Origin::Pod { id: id.clone(), model, endpoint: endpoint.clone() };
    let filter = state.config().topic_filter.clone();
    // One pod's socket holds at most a source's share, and all of them together at most the
    // shared dialler budget (`zmq_max_bytes_in_flight`).
    let mut limits = state.config().zmq_limits.clone();
    limits.max_bytes_in_flight = limits.max_bytes_in_flight_per_source;
    let shared = Some(state.dialer_budget().clone());
    let mut sub = match SubDialer::connect_sharing(&endpoint, &[filter.as_bytes()], limits, Backoff::default(), shared)
    {
        Ok(sub) => sub,
        Err(e) => return TransportError::from_zmtp("connect", &endpoint, &e).record(),
    };
    let mut connected_before = false;
    loop {
        let event = tokio::select! {
            event = sub.recv() => match event {
                Some(event) => event,
                None => return,
            },
            _ = stop.wait_for(|stop| *stop) => return,
        };
        match event {
            Event::Message(msg) => {
                let work = Work::Live {
                    origin: origin.clone(),
                    conn: msg.conn,
                    peer: msg.peer,
                    frames: msg.frames,
                    lease: msg.lease,
                    at: msg.received_at,
                };
                // Waits for room: this pod's socket is not read meanwhile (backpressure).
                tokio::select! {
                    sent = state.queues().send(worker, work) => if !sent { return },
                    _ = stop.wait_for(|stop| *stop) => return,
                }
            }
            other => {
                if matches!(other, Event::Connected { .. }) && std::mem::replace(&mut connected_before, true) {
                    metrics::counter!(m::RECONNECTIONS, "pod" => id.to_string()).increment(1);
                }
                if let Event::Disconnected { conn, .. } = &other {
                    state.queues().send(worker, Work::Disconnected { origin: origin.clone(), conn: *conn }).await;
                }
                transport::note_event(SocketKind::Pod, &id, &other);
            }
        }
    }
}
