//! One HTTP/2 connection to a gRPC server (plain TCP), driven by hyper with nothing between the
//! caller's task and the connection's. tonic's `Channel` puts a buffer task in front of its
//! connection: a call is handed to that task, which hands it to the connection's task and hands
//! the answer's future back, so each call wakes two tasks besides the connection's, and on a
//! busy machine each wake is a chance to wait for a thread. Here the caller hands its request
//! straight to the connection (one wake there, one back), on the one warm connection every call
//! shares, opened by the first call (or a warm-up) and reopened by the first call after it closes.
//!
//! The connection is tuned for small unary calls on a long-lived link: `TCP_NODELAY` (a request
//! is written in one go and must not wait for the previous ACK), and HTTP/2 keep-alive pings
//! while idle, so a connection the peer or the network dropped silently is found and replaced
//! between requests rather than by a request missing its deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tonic::body::Body;
use tonic::codegen::http::{self, Uri};
use tonic::codegen::Service;

/// Idle time after which the connection is pinged, and how long the answer may take before it
/// is closed (and reopened by the next call).
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A gRPC channel of one direct HTTP/2 connection to `addr` (`host:port`); cheap to clone (clones
/// share the connection).
#[derive(Clone)]
pub struct DirectChannel {
    inner: Arc<Inner>,
}

struct Inner {
    addr: String,
    origin: Uri,
    connect_timeout: Duration,
    /// The live connection's sender, if one is open.
    sender: parking_lot::Mutex<Option<SendRequest<Body>>>,
    /// Held while connecting, so that calls arriving meanwhile wait for that one connection.
    connecting: tokio::sync::Mutex<()>,
}

/// Why no connection could be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect to {addr}: {source}")]
    Io { addr: String, source: std::io::Error },
    #[error("connect to {addr}: no connection within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("HTTP/2 handshake with {addr}: {source}")]
    Handshake { addr: String, source: hyper::Error },
}

impl DirectChannel {
    /// A channel to `addr` (`host:port`), not connected yet.
    pub fn new(addr: &str, connect_timeout: Duration) -> Result<DirectChannel, http::uri::InvalidUri> {
        let origin: Uri = format!("http://{addr}").parse()?;
        Ok(DirectChannel {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                origin,
                connect_timeout,
                sender: parking_lot::Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// `http://addr`, the origin of every request.
    pub fn origin(&self) -> &Uri {
        &self.inner.origin
    }

    /// A sender on the live connection, opening one first when there is none or it closed.
    pub async fn ready(&self) -> Result<DirectSender, ConnectError> {
        if let Some(sender) = self.live() {
            return Ok(DirectSender(sender));
        }
        let _connecting = self.inner.connecting.lock().await;
        if let Some(sender) = self.live() {
            return Ok(DirectSender(sender));
        }
        let sender = self.connect().await?;
        *self.inner.sender.lock() = Some(sender.clone());
        Ok(DirectSender(sender))
    }

    fn live(&self) -> Option<SendRequest<Body>> {
        self.inner.sender.lock().as_ref().filter(|s| !s.is_closed()).cloned()
    }

    async fn connect(&self) -> Result<SendRequest<Body>, ConnectError> {
        let (addr, timeout) = (&self.inner.addr, self.inner.connect_timeout);
        let stream = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr.as_str())).await {
            Err(_) => return Err(ConnectError::Timeout { addr: addr.clone(), timeout }),
            Ok(Err(source)) => return Err(ConnectError::Io { addr: addr.clone(), source }),
            Ok(Ok(stream)) => stream,
        };
        stream.set_nodelay(true).map_err(|source| ConnectError::Io { addr: addr.clone(), source })?;
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let handshake = builder.handshake(TokioIo::new(stream));
        let (sender, connection) = match tokio::time::timeout(timeout, handshake).await {
            Err(_) => return Err(ConnectError::Timeout { addr: addr.clone(), timeout }),
            Ok(Err(source)) => return Err(ConnectError::Handshake { addr: addr.clone(), source }),
            Ok(Ok(pair)) => pair,
        };
        tokio::spawn(async move {
            // Its end (the peer closed it, a ping went unanswered) shows as a closed sender.
            let _ = connection.await;
        });
        Ok(sender)
    }
}

/// The connection's sender as the service `tonic::client::Grpc` calls.
#[derive(Clone)]
pub struct DirectSender(SendRequest<Body>);

type ResponseFuture = Pin<Box<dyn Future<Output = Result<http::Response<hyper::body::Incoming>, hyper::Error>> + Send>>;

impl Service<http::Request<Body>> for DirectSender {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::net::TcpListener;

    use super::*;
    use crate::kvindex::v1 as pb;
    use crate::kvindex::v1::indexer_server::{Indexer, IndexerServer};
    use crate::score_query::{score_tokens_direct, ScoreQuery};

    /// Answers ScoreTokens with the sum of the ids it received (so a test sees them arrive whole).
    struct Summing;

    #[tonic::async_trait]
    impl Indexer for Summing {
        async fn score_tokens(
            &self,
            request: tonic::Request<pb::ScoreTokensRequest>,
        ) -> Result<tonic::Response<pb::ScoreTokensResponse>, tonic::Status> {
            let sum = request.get_ref().token_ids.iter().map(|&id| u64::from(id)).sum::<u64>();
            Ok(tonic::Response::new(pb::ScoreTokensResponse { total_blocks: sum as u32, ..Default::default() }))
        }
        async fn register_pod(
            &self,
            _: tonic::Request<pb::RegisterPodRequest>,
        ) -> Result<tonic::Response<pb::RegisterPodResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("test"))
        }
        async fn unregister_pod(
            &self,
            _: tonic::Request<pb::UnregisterPodRequest>,
        ) -> Result<tonic::Response<pb::UnregisterPodResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("test"))
        }
        async fn record_route(
            &self,
            _: tonic::Request<pb::RecordRouteRequest>,
        ) -> Result<tonic::Response<pb::RecordRouteResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("test"))
        }
        async fn release_route(
            &self,
            _: tonic::Request<pb::ReleaseRouteRequest>,
        ) -> Result<tonic::Response<pb::ReleaseRouteResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("test"))
        }
    }

    /// Serves [`Summing`] on `listener` until `stop` fires (then closes its connections).
    fn serve(listener: TcpListener, stop: tokio::sync::oneshot::Receiver<()>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            tonic::transport::Server::builder()
                .add_service(IndexerServer::new(Summing))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stop.await;
                })
                .await
                .unwrap();
        })
    }

    async fn ask(channel: &DirectChannel, ids: Vec<u32>) -> Result<u32, tonic::Status> {
        let query = ScoreQuery::new(pb::ScoreTokensRequest::default(), Arc::new(ids));
        Ok(score_tokens_direct(channel, tonic::Request::new(query)).await?.into_inner().total_blocks)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_on_one_connection_and_reconnects_after_the_server_restarts() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let first = serve(listener, stopped);
        let channel = DirectChannel::new(&addr.to_string(), Duration::from_secs(5)).unwrap();
        let ids: Vec<u32> = (0..9_000).collect();
        let sum = ids.iter().sum::<u32>();
        assert_eq!(ask(&channel, ids.clone()).await.unwrap(), sum);
        let connection = channel.live().expect("a live connection");
        assert_eq!(ask(&channel.clone(), vec![1, 2, 3]).await.unwrap(), 6);
        assert!(channel.live().is_some_and(|now| now.is_ready() && connection.is_ready()), "the same connection");

        // The server goes away and comes back on the same address: the next calls reconnect.
        stop.send(()).unwrap();
        first.await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while channel.live().is_some() {
            assert!(tokio::time::Instant::now() < deadline, "the closed connection was never noticed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let refused = ask(&channel, vec![1]).await.expect_err("nothing listens");
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        let (_stop, stopped) = tokio::sync::oneshot::channel();
        let _second = serve(TcpListener::bind(addr).await.unwrap(), stopped);
        assert_eq!(ask(&channel, ids).await.unwrap(), sum);
    }
}
