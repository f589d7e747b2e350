//! SUB streams over our ZMTP peer ([`super::zmtp`]): a bound endpoint that publishers dial (one
//! task per connection) and a dialled endpoint, re-dialled with backoff until stopped. Every
//! connection gets a fresh [`ConnId`]; everything that happens is reported as a [`SubEvent`].

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::zmtp::{tcp_addr, SubSession};
use super::{ConnId, SubEvent, TransportError};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Ids of live connections (never 0).
static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

fn next_conn() -> ConnId {
    CONNECTIONS.fetch_add(1, Ordering::Relaxed)
}

/// Resolves once `stop` is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// A SUB endpoint bound and listening, not yet accepting: [`BoundSub::serve`] runs it.
pub struct BoundSub {
    listener: TcpListener,
    endpoint: String,
}

/// Binds a SUB at `endpoint` (`tcp://host:port`; port 0 picks a free one).
pub async fn bind_sub(endpoint: &str) -> Result<BoundSub, TransportError> {
    let error = |e: io::Error| TransportError::new("bind", endpoint, e);
    let listener = TcpListener::bind(tcp_addr(endpoint).map_err(error)?).await.map_err(error)?;
    let endpoint = format!("tcp://{}", listener.local_addr().map_err(error)?);
    Ok(BoundSub { listener, endpoint })
}

impl BoundSub {
    /// The bound endpoint, port resolved.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Accepts publishers, subscribes each to `filter` and reports what they send, until
    /// `stop` is set; then every connection is closed.
    pub async fn serve<F>(self, filter: String, on_event: F, mut stop: watch::Receiver<bool>)
    where
        F: Fn(SubEvent) + Send + Sync + 'static,
    {
        let on_event = Arc::new(on_event);
        let filter: Arc<str> = filter.into();
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        connections.spawn(serve_publisher(stream, peer.to_string(), filter.clone(), on_event.clone()));
                    }
                    Err(e) => {
                        on_event(SubEvent::Failed(TransportError::new("accept", &self.endpoint, e)));
                        tokio::time::sleep(FIRST_BACKOFF).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                _ = stopped(&mut stop) => return, // dropping `connections` closes them
            }
        }
    }
}

async fn serve_publisher(stream: TcpStream, peer: String, filter: Arc<str>, on_event: Arc<impl Fn(SubEvent)>) {
    let mut session = match SubSession::handshake(stream, &filter, HANDSHAKE_TIMEOUT).await {
        Ok(session) => session,
        Err(e) => return on_event(SubEvent::Failed(TransportError::new("handshake", &peer, e))),
    };
    let conn = next_conn();
    on_event(SubEvent::Connected { conn, peer: peer.clone() });
    loop {
        match session.recv().await {
            Ok(frames) => on_event(SubEvent::Message { conn, frames }),
            Err(e) => return on_event(SubEvent::Disconnected { conn, error: recv_error(&peer, e), peer }),
        }
    }
}

/// A receive error, or `None` for the peer closing the connection.
fn recv_error(peer: &str, e: io::Error) -> Option<TransportError> {
    (e.kind() != io::ErrorKind::UnexpectedEof).then(|| TransportError::new("recv", peer, e))
}

/// Dials the PUB at `endpoint`, subscribes to `filter` and reports what it sends; re-dials
/// (with backoff while it is unreachable) after every disconnect, until `stop` is set. A
/// refused connection is the normal state of an engine that is not up yet: it is retried,
/// not reported.
pub async fn dial_sub<F>(endpoint: String, filter: String, on_event: F, mut stop: watch::Receiver<bool>)
where
    F: Fn(SubEvent) + Send + Sync + 'static,
{
    let addr = match tcp_addr(&endpoint) {
        Ok(addr) => addr,
        Err(e) => return on_event(SubEvent::Failed(TransportError::new("connect", &endpoint, e))),
    };
    let mut backoff = FIRST_BACKOFF;
    loop {
        if *stop.borrow() {
            return;
        }
        let attempt = async {
            let stream = TcpStream::connect(&addr).await?;
            SubSession::handshake(stream, &filter, HANDSHAKE_TIMEOUT).await
        };
        let mut session = tokio::select! {
            r = attempt => match r {
                Ok(session) => session,
                Err(e) => {
                    if e.kind() != io::ErrorKind::ConnectionRefused {
                        on_event(SubEvent::Failed(TransportError::new("connect", &endpoint, e)));
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stopped(&mut stop) => return,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            },
            _ = stopped(&mut stop) => return,
        };
        backoff = FIRST_BACKOFF;
        let conn = next_conn();
        on_event(SubEvent::Connected { conn, peer: endpoint.clone() });
        loop {
            tokio::select! {
                r = session.recv() => match r {
                    Ok(frames) => on_event(SubEvent::Message { conn, frames }),
                    Err(e) => {
                        let error = recv_error(&endpoint, e);
                        on_event(SubEvent::Disconnected { conn, peer: endpoint.clone(), error });
                        break;
                    }
                },
                _ = stopped(&mut stop) => return,
            }
        }
    }
}
