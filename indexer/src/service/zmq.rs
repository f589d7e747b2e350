//! ZeroMQ sources on the pure-Rust `zeromq` crate.
//!
//! Limits of the crate (0.4) and how they are worked around:
//! - `tcp://*:p` is not accepted as a bind host: the config rewrites it to `0.0.0.0`.
//! - No socket options (HWM, reconnect interval, heartbeats). The socket is read only as fast
//!   as we call `recv`, so we never block in it: every message goes to a bounded queue with
//!   `try_send`; overflow is dropped, counted, and recovered through the seq gap's replay.
//! - A connecting SUB does not reconnect after the peer goes away and reports nothing. A
//!   per-pod dialer therefore re-dials when its socket was silent for `reconnect_idle_ms`
//!   (a restarted engine is then seen through its seq going backwards).
//! - `connect` retries a refused endpoint forever: dialers run it in their own task, so an
//!   engine that comes up late is picked up.
//! - `recv` panics (`todo!`) on unexpected ZMTP commands: socket loops run in a supervised
//!   task that is restarted after a panic, counted as a `recv` error.
//! - SUB filtering happens on the publisher side only; the worker re-checks the prefix.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use zeromq::{Socket, SocketRecv, SubSocket};

use super::metrics as m;
use super::{Origin, Shared, Work};

fn zmq_error(op: &'static str, endpoint: &str, error: &dyn std::fmt::Display) {
    metrics::counter!(m::ZMQ_ERRORS, "operation" => op).increment(1);
    tracing::warn!(operation = op, endpoint, error = %error, "zeromq error");
}

async fn open_central(shared: &Shared, endpoint: &str) -> Result<(SubSocket, String), zeromq::ZmqError> {
    let mut sock = SubSocket::new();
    sock.subscribe(&shared.config.topic_filter).await?;
    let bound = sock.bind(endpoint).await?;
    Ok((sock, bound.to_string()))
}

/// Binds the central SUB socket; returns the bound endpoint (port 0 resolved) once listening.
pub async fn start_central(shared: Arc<Shared>, endpoint: &str) -> Result<String, String> {
    let (sock, bound) = open_central(&shared, endpoint).await.map_err(|e| {
        zmq_error("bind", endpoint, &e);
        format!("cannot bind {endpoint}: {e}")
    })?;
    tracing::info!(endpoint = %bound, filter = %shared.config.topic_filter, "central SUB bound");
    let ep = bound.clone();
    tokio::spawn(async move {
        let mut sock = Some(sock);
        loop {
            let s = match sock.take() {
                Some(s) => s,
                None => match open_central(&shared, &ep).await {
                    Ok((s, _)) => s,
                    Err(e) => {
                        zmq_error("bind", &ep, &e);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                },
            };
            let task = tokio::spawn(central_loop(shared.clone(), s));
            if let Err(e) = task.await {
                zmq_error("recv", &ep, &e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    Ok(bound)
}

async fn central_loop(shared: Arc<Shared>, mut sock: SubSocket) {
    loop {
        match sock.recv().await {
            Ok(msg) => {
                let frames = msg.into_vec();
                let worker = shared.worker_for(frames.first().map_or(&[][..], |f| f.as_ref()));
                shared.offer_live(worker, Work::Live { origin: Origin::Central, frames, at: Instant::now() });
            }
            Err(e) => {
                zmq_error("recv", "central", &e);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Dials one pod's PUB endpoint until `stop` is set; re-dials after silence or a panic.
pub async fn dial_pod(shared: Arc<Shared>, id: Arc<str>, model: Arc<str>, endpoint: Arc<str>, stop: watch::Receiver<bool>) {
    let mut connected_before = false;
    loop {
        if *stop.borrow() {
            return;
        }
        let task = tokio::spawn(dial_once(shared.clone(), id.clone(), model.clone(), endpoint.clone(), stop.clone(), connected_before));
        match task.await {
            Ok(Dial::Stopped) => return,
            Ok(Dial::Redial { connected }) => connected_before |= connected,
            Err(e) => {
                zmq_error("recv", &endpoint, &e);
                connected_before = true;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

enum Dial {
    Stopped,
    Redial { connected: bool },
}

async fn dial_once(
    shared: Arc<Shared>,
    id: Arc<str>,
    model: Arc<str>,
    endpoint: Arc<str>,
    mut stop: watch::Receiver<bool>,
    connected_before: bool,
) -> Dial {
    let mut sock = SubSocket::new();
    if let Err(e) = sock.subscribe(&shared.config.topic_filter).await {
        zmq_error("subscribe", &endpoint, &e);
    }
    tokio::select! {
        r = sock.connect(&endpoint) => {
            if let Err(e) = r {
                zmq_error("connect", &endpoint, &e);
                tokio::time::sleep(Duration::from_secs(1)).await;
                return Dial::Redial { connected: false };
            }
        }
        _ = stop.changed() => return Dial::Stopped,
    }
    if connected_before {
        metrics::counter!(m::RECONNECTIONS, "pod" => id.to_string()).increment(1);
    }
    tracing::info!(pod = %id, endpoint = %endpoint, "connected to engine PUB");
    let worker = shared.worker_for(id.as_bytes());
    let idle = Duration::from_millis(shared.config.reconnect_idle_ms);
    let origin = Origin::Pod { id: id.clone(), model, endpoint: endpoint.clone() };
    loop {
        tokio::select! {
            r = tokio::time::timeout(idle, sock.recv()) => match r {
                Ok(Ok(msg)) => shared.offer_live(worker, Work::Live { origin: origin.clone(), frames: msg.into_vec(), at: Instant::now() }),
                Ok(Err(e)) => {
                    zmq_error("recv", &endpoint, &e);
                    return Dial::Redial { connected: true };
                }
                Err(_) => {
                    tracing::debug!(pod = %id, "silent for reconnect_idle_ms: re-dialling");
                    return Dial::Redial { connected: true };
                }
            },
            _ = stop.changed() => return Dial::Stopped,
        }
    }
}
