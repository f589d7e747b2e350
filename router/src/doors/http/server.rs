//! Serves an axum app on a listener with the bounds a public port needs, which `axum::serve`
//! cannot set: a header read timeout (hyper's, which also closes keep-alive connections idle
//! that long), a write timeout (a write that makes no progress that long, a client that stopped
//! reading, fails the connection), and a cap on open connections (past it a new connection is accepted and closed
//! at once, counted). The body's own bounds (size, time, shared byte budget) are applied where
//! it is read, in [`super::openai`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutStream;

use crate::metrics as m;

/// The per-listener connection bounds.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Time for a request's head (request line and headers) to arrive, and for an idle
    /// keep-alive connection to start its next request.
    pub header_timeout: Duration,
    /// Time a write may make no progress (a client that stopped reading) before the connection
    /// is closed.
    pub write_timeout: Duration,
    /// Most connections open at once on this listener.
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown`, then lets the open connections finish their
/// requests. `name` labels the metrics (`http`, `admin`, `metrics`).
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let open = metrics::gauge!(m::HTTP_CONNECTIONS, "listener" => name);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
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
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::counter!(m::HTTP_CONNECTIONS_REFUSED, "listener" => name).increment(1);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        open.increment(1.0);
        let mut timed = TimeoutStream::new(stream);
        timed.set_write_timeout(Some(limits.write_timeout));
        let connection = builder.serve_connection(TokioIo::new(Box::pin(timed)), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        let open = open.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                let phase = if e.is_timeout() { Some("header") } else { is_write_timeout(&e).then_some("write") };
                if let Some(phase) = phase {
                    metrics::counter!(m::HTTP_TIMEOUTS, "listener" => name, "phase" => phase).increment(1);
                }
            }
            open.decrement(1.0);
            drop(permit);
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
