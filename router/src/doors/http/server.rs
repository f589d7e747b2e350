//! Serves an axum app on a listener with the bounds a public port needs, which `axum::serve`
//! cannot set: a header read timeout (hyper's, which also closes keep-alive connections idle
//! that long), a write timeout (a write that makes no progress that long, a client that stopped
//! reading, fails the connection), and caps on open connections in total, per client address
//! and per network (an IPv4 /24, an IPv6 /64), the indexer's own ([`kvindex_conn_caps`]): at a
//! full cap the oldest idle connection under it (no request being answered: silent, or between
//! keep-alive requests) is closed to make room, the oldest of the address holding the most; a
//! newcomer is closed at accept only when every connection under the cap is answering. Both
//! counted. So a few addresses holding silent connections cannot keep new clients out. The
//! body's own bounds (size, time, shared byte budget) are applied where it is read, in
//! [`super::openai`].

use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
pub use kvindex_conn_caps::ConnLimits;
use kvindex_conn_caps::{ConnectionCaps, NotingAnswers};
use tokio::net::TcpListener;
use tokio_io_timeout::TimeoutStream;

use crate::metrics as m;

/// Serves `app` on `listener` until `shutdown`, then lets the open connections finish their
/// requests. `name` labels the metrics (`http`, `admin`, `metrics`, `probe`).
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let caps = ConnectionCaps::new(
        limits.max_connections,
        limits.max_connections_per_address,
        limits.max_connections_per_network,
    );
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let open = metrics::gauge!(m::HTTP_CONNECTIONS, "listener" => name);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of descriptors, most likely: wait for some to be given back.
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let admitted = match caps.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(reason) => {
                metrics::counter!(m::HTTP_CONNECTIONS_REFUSED, "listener" => name, "reason" => reason).increment(1);
                drop(stream);
                continue;
            }
        };
        if let Some(cap) = admitted.made_room {
            metrics::counter!(m::HTTP_CONNECTIONS_EVICTED, "listener" => name, "reason" => cap).increment(1);
        }
        let _ = stream.set_nodelay(true);
        open.increment(1.0);
        let mut timed = TimeoutStream::new(stream);
        timed.set_write_timeout(Some(limits.write_timeout));
        let service = TowerToHyperService::new(NotingAnswers::new(app.clone(), admitted.place));
        let connection = builder.serve_connection(TokioIo::new(Box::pin(timed)), service);
        let connection = graceful.watch(connection);
        let open = open.clone();
        let evicted = admitted.evicted;
        tokio::spawn(async move {
            tokio::select! {
                served = connection => {
                    if let Err(e) = served {
                        let phase = if e.is_timeout() { Some("header") } else { is_write_timeout(&e).then_some("write") };
                        if let Some(phase) = phase {
                            metrics::counter!(m::HTTP_TIMEOUTS, "listener" => name, "phase" => phase).increment(1);
                        }
                    }
                }
                // Idle, and its place went to a newer connection: dropping it closes it.
                Ok(()) = evicted => {}
            }
            open.decrement(1.0);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The connection failed because a write made no progress for the write timeout.
fn is_write_timeout(e: &hyper::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset)
}
