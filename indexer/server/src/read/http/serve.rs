//! Serves the HTTP admin routes on a listener with the bounds an open port needs and
//! `axum::serve` cannot set (its connections had no header timeout and no cap, so
//! slowloris clients could hold every descriptor and stall every request):
//!
//! - a connection cap per listener (`http_max_connections`), per client address
//!   (`http_max_connections_per_address`) and per network (`http_max_connections_per_network`):
//!   at a full cap the oldest idle connection under it is closed to make room, and a newcomer is
//!   closed at accept (before any byte is read or a TLS handshake starts, and counted) only when
//!   every connection under the cap is answering a request ([`kvindex_conn_caps`]);
//! - a header read timeout (`http_header_timeout_ms`, hyper's own timer), which is also how long
//!   an idle keep-alive connection may wait for its next request;
//! - a write timeout (`http_write_timeout_ms`): a write that makes no progress that long (a
//!   client that never reads its answer) fails the connection, so its descriptor comes back;
//! - a bound on a request head ([`MAX_HEAD_BYTES`], 431) and on what hyper buffers per
//!   connection ([`MAX_BUFFER_BYTES`]).
//!
//! Bodies are bounded where they are read ([`super::body`]). The caps and the app wrapper that
//! marks connections busy are shared with the router's `router/src/doors/http/server.rs`
//! (`kvindex-conn-caps`); the serving loops stay each binary's own (TLS here, their metrics).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use kvindex_conn_caps::{ConnectionCaps, NotingAnswers, Place};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use crate::config::http_limits::ConnLimits;
use crate::shutdown::Shutdown;
use crate::telemetry as m;

/// Largest request head (request line and headers) accepted; a larger one is answered 431.
/// A registration's head is well under 1 KiB; a bearer token and a long pod id fit many times.
pub const MAX_HEAD_BYTES: usize = 32 << 10;

/// Most bytes hyper buffers for one connection (hyper's default is ~400 KiB).
pub const MAX_BUFFER_BYTES: usize = 64 << 10;

/// Serves `app` on `listener` (TLS with `tls`) until `shutdown`, then lets the open
/// connections finish their requests. `name` labels the metrics (`http`, `metrics`, `probe`).
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    app: axum::Router,
    tls: Option<Arc<ServerConfig>>,
    limits: ConnLimits,
    mut shutdown: Shutdown,
) -> io::Result<()> {
    let acceptor = tls.map(TlsAcceptor::from);
    let caps = ConnectionCaps::new(
        limits.max_connections,
        limits.max_connections_per_address,
        limits.max_connections_per_network,
    );
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_BUFFER_BYTES);
    let builder = Arc::new(builder);
    let gauge = metrics::gauge!(m::HTTP_CONNECTIONS, "listener" => name);
    loop {
        let (tcp, peer) = tokio::select! {
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
            () = shutdown.recv() => break,
        };
        let admitted = match caps.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(reason) => {
                metrics::counter!(m::HTTP_REFUSED, "listener" => name, "reason" => reason).increment(1);
                drop(tcp);
                continue;
            }
        };
        if let Some(cap) = admitted.made_room {
            metrics::counter!(m::HTTP_EVICTED, "listener" => name, "reason" => cap).increment(1);
        }
        let _ = tcp.set_nodelay(true);
        gauge.increment(1.0);
        let connection = Connection {
            name,
            builder: builder.clone(),
            app: app.clone(),
            watcher: graceful.watcher(),
            acceptor: acceptor.clone(),
            write_timeout: limits.write_timeout,
            place: admitted.place,
        };
        let gauge = gauge.clone();
        let evicted = admitted.evicted;
        tokio::spawn(async move {
            tokio::select! {
                () = connection.run(tcp, peer) => {}
                // Idle, and its place went to a newer connection: dropping it closes it.
                Ok(()) = evicted => {}
            }
            gauge.decrement(1.0);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// One accepted connection, handshaken (with TLS) and served.
struct Connection {
    name: &'static str,
    builder: Arc<hyper::server::conn::http1::Builder>,
    app: axum::Router,
    watcher: Watcher,
    acceptor: Option<TlsAcceptor>,
    write_timeout: std::time::Duration,
    /// Its place under the listener's caps (given back when the connection ends).
    place: Arc<Place>,
}

impl Connection {
    async fn run(self, tcp: TcpStream, peer: SocketAddr) {
        match self.acceptor.clone() {
            None => self.serve(tcp).await,
            Some(acceptor) => {
                if let Some(stream) = crate::read::tls::handshake(&acceptor, tcp, peer, self.name).await {
                    self.serve(stream).await;
                }
            }
        }
    }

    async fn serve<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(self, io: I) {
        let activity = Arc::new(Activity::default());
        let mut timed = TimeoutStream::new(io);
        timed.set_write_timeout(Some(self.write_timeout));
        let io = Tracked { inner: Box::pin(timed), activity: activity.clone() };
        let service = TowerToHyperService::new(NotingAnswers::new(self.app, self.place));
        let connection = self.watcher.watch(self.builder.serve_connection(TokioIo::new(io), service));
        let Err(e) = connection.await else { return };
        let reason = if e.is_timeout() {
            // An idle keep-alive connection closed after the same timeout is not a refusal.
            (!activity.idle()).then_some("header_timeout")
        } else if e.is_parse_too_large() {
            Some("head_too_large")
        } else if is_write_timeout(&e) {
            Some("write_timeout")
        } else {
            None
        };
        if let Some(reason) = reason {
            metrics::counter!(m::HTTP_REFUSED, "listener" => self.name, "reason" => reason).increment(1);
        }
    }
}

/// What a connection did last, so that a header timeout on a connection idle since its last
/// response (keep-alive) is told apart from a client that started a request and stalled.
#[derive(Default)]
struct Activity(AtomicU8);

const WROTE: u8 = 1;
const READ_SINCE_WRITE: u8 = 2;

impl Activity {
    /// A response went out and not one byte came in since.
    fn idle(&self) -> bool {
        self.0.load(Ordering::Relaxed) == WROTE
    }
}

/// The connection's stream, noting reads and writes in its [`Activity`].
struct Tracked<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.0.fetch_or(READ_SINCE_WRITE, Ordering::Relaxed);
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.0.store(WROTE, Ordering::Relaxed);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.0.store(WROTE, Ordering::Relaxed);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The connection failed because a write made no progress for the write timeout.
fn is_write_timeout(e: &hyper::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<io::Error>())
        .is_some_and(|io| io.kind() == io::ErrorKind::TimedOut)
}

fn is_connection_error(e: &io::Error) -> bool {
    use io::ErrorKind;
    matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset)
}
