//! Live ZeroMQ sources: the central SUB (bound, engines dial in) and per-pod SUBs (we dial each
//! engine's PUB). Both speak ZMTP through [`super::zmtp`] (see there for why the `zeromq`
//! crate's SUB socket is not used) and never block on index application: every message goes
//! to a bounded queue with `try_send`; overflow is dropped, counted, and recovered through the
//! seq gap's replay.
//!
//! Notes on endpoints: only `tcp://` is supported; `tcp://*:p` is rewritten to `0.0.0.0` by the
//! config. A dialled engine that is not up yet is retried (with backoff) until it is; a dropped
//! connection is re-dialled and counted in `kvindex_subscriber_reconnections_total`. Every
//! message carries its connection id: a stream whose messages come on a new connection is
//! resynced from seq 0 (a restarted engine may already be past our cursor). Topic filtering is done by
//! the publisher from our subscription; the worker re-checks the prefix.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::metrics as m;
use super::zmtp::{tcp_addr, SubSession};
use super::{Origin, Shared, Work};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Ids of live connections (never 0), so workers can tell a publisher's new connection.
static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

fn next_conn() -> u64 {
    CONNECTIONS.fetch_add(1, Ordering::Relaxed)
}

fn zmq_error(op: &'static str, endpoint: &str, error: &dyn std::fmt::Display) {
    metrics::counter!(m::ZMQ_ERRORS, "operation" => op).increment(1);
    tracing::warn!(operation = op, endpoint, error = %error, "zeromq error");
}

/// Binds the central SUB endpoint; returns it (port 0 resolved) once listening.
pub async fn start_central(shared: Arc<Shared>, endpoint: &str) -> Result<String, String> {
    let addr = tcp_addr(endpoint).map_err(|e| e.to_string())?;
    let listener = TcpListener::bind(&addr).await.map_err(|e| {
        zmq_error("bind", endpoint, &e);
        format!("zmq_bind: cannot bind {endpoint}: {e}")
    })?;
    let bound = format!("tcp://{}", listener.local_addr().map_err(|e| e.to_string())?);
    tracing::info!(endpoint = %bound, filter = %shared.config.topic_filter, "central SUB bound");
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    tokio::spawn(central_peer(shared.clone(), stream, peer.to_string()));
                }
                Err(e) => {
                    zmq_error("accept", "central", &e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    Ok(bound)
}

async fn central_peer(shared: Arc<Shared>, stream: TcpStream, peer: String) {
    let mut session = match SubSession::handshake(stream, &shared.config.topic_filter, HANDSHAKE_TIMEOUT).await {
        Ok(s) => s,
        Err(e) => return zmq_error("handshake", &peer, &e),
    };
    tracing::info!(peer = %peer, "publisher connected to the central SUB");
    let conn = next_conn();
    loop {
        match session.recv().await {
            Ok(frames) => {
                let worker = shared.worker_for(frames.first().map_or(&[][..], |f| f.as_ref()));
                shared.offer_live(worker, Work::Live { origin: Origin::Central, conn, frames, at: Instant::now() });
            }
            Err(e) => {
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    zmq_error("recv", &peer, &e);
                }
                tracing::info!(peer = %peer, "publisher disconnected from the central SUB");
                return;
            }
        }
    }
}

/// Dials one pod's PUB endpoint until `stop` is set; re-dials after a disconnect.
pub async fn dial_pod(shared: Arc<Shared>, id: Arc<str>, model: Arc<str>, endpoint: Arc<str>, mut stop: watch::Receiver<bool>) {
    let addr = match tcp_addr(&endpoint) {
        Ok(a) => a,
        Err(e) => return zmq_error("connect", &endpoint, &e),
    };
    let worker = shared.worker_for(id.as_bytes());
    let origin = Origin::Pod { id: id.clone(), model, endpoint: endpoint.clone() };
    let mut connected_before = false;
    let mut backoff = Duration::from_millis(50);
    loop {
        if *stop.borrow() {
            return;
        }
        let attempt = async {
            let stream = TcpStream::connect(&addr).await?;
            SubSession::handshake(stream, &shared.config.topic_filter, HANDSHAKE_TIMEOUT).await
        };
        let mut session = tokio::select! {
            r = attempt => match r {
                Ok(s) => s,
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::ConnectionRefused {
                        zmq_error("connect", &endpoint, &e);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.changed() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        backoff = Duration::from_millis(50);
        if connected_before {
            metrics::counter!(m::RECONNECTIONS, "pod" => id.to_string()).increment(1);
        }
        connected_before = true;
        tracing::info!(pod = %id, endpoint = %endpoint, "connected to engine PUB");
        let conn = next_conn();
        loop {
            tokio::select! {
                r = session.recv() => match r {
                    Ok(frames) => shared.offer_live(worker, Work::Live { origin: origin.clone(), conn, frames, at: Instant::now() }),
                    Err(e) => {
                        if e.kind() != std::io::ErrorKind::UnexpectedEof {
                            zmq_error("recv", &endpoint, &e);
                        }
                        tracing::warn!(pod = %id, endpoint = %endpoint, "engine PUB disconnected; re-dialling");
                        break;
                    }
                },
                _ = stop.changed() => return,
            }
        }
    }
}
