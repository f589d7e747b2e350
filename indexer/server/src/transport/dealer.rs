//! The replay DEALER, on the `zeromq` crate (one peer, short-lived). It runs on a runtime of its
//! own with a single thread: the crate's fair queue loses wake-ups when polled from several
//! threads. A panic inside the crate (`todo!()` on unexpected peer input) ends that request's
//! task, which the caller sees as the reply stream ending early.

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout_at, Instant};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::{Frames, TransportError};

/// Replies buffered between the DEALER and the caller.
const REPLY_BUFFER: usize = 64;

/// Issues replay requests. Owns the DEALERs' runtime; dropping the client stops it.
pub struct ReplayClient {
    runtime: tokio::runtime::Handle,
    _stop: oneshot::Sender<()>,
}

impl ReplayClient {
    pub fn new() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new().name("kvindex-zmq".into()).spawn(move || {
            runtime.block_on(async {
                let _ = stopped.await;
            })
        })?;
        Ok(ReplayClient { runtime: handle, _stop: stop })
    }

    /// Sends the start seq `from` to the ROUTER at `endpoint` and yields every reply's frames, in
    /// order, until the caller drops the stream. Connecting and sending must finish by
    /// `deadline`; receiving is bounded by the caller.
    pub fn request(&self, endpoint: &str, from: u64, deadline: Instant) -> ReplayReplies {
        let (replies, rx) = mpsc::channel(REPLY_BUFFER);
        self.runtime.spawn(fetch(endpoint.to_string(), from, deadline, replies));
        ReplayReplies { rx }
    }
}

/// The replies to one replay request.
pub struct ReplayReplies {
    rx: mpsc::Receiver<Result<Frames, TransportError>>,
}

impl ReplayReplies {
    /// The next reply, or an error after which nothing follows; `None` when the request's task
    /// ended without saying why (a panic inside the `zeromq` crate).
    pub async fn next(&mut self) -> Option<Result<Frames, TransportError>> {
        self.rx.recv().await
    }

    /// A reply or error that is already waiting, without waiting for one.
    pub fn try_next(&mut self) -> Option<Result<Frames, TransportError>> {
        self.rx.try_recv().ok()
    }
}

async fn fetch(endpoint: String, from: u64, deadline: Instant, replies: mpsc::Sender<Result<Frames, TransportError>>) {
    let error = |operation, message: &dyn std::fmt::Display| TransportError::new(operation, &endpoint, message);
    let fail = |operation, message: &dyn std::fmt::Display| Err(error(operation, message));
    let mut sock = DealerSocket::new();
    let connected = match timeout_at(deadline, sock.connect(&endpoint)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => fail("replay-connect", &e),
        Err(_) => fail("replay-connect", &"connect timed out"),
    };
    let sent = match connected {
        Ok(()) => {
            let request: ZmqMessage =
                vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())].try_into().expect("two frames");
            match timeout_at(deadline, sock.send(request)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => fail("replay-send", &e),
                Err(_) => fail("replay-send", &"send timed out"),
            }
        }
        Err(e) => Err(e),
    };
    if let Err(e) = sent {
        let _ = replies.send(Err(e)).await;
        return;
    }
    loop {
        let reply = tokio::select! {
            r = sock.recv() => r,
            _ = replies.closed() => return, // the caller has what it needs, or gave up
        };
        let item = reply.map(ZmqMessage::into_vec).map_err(|e| error("replay-recv", &e));
        let failed = item.is_err();
        if replies.send(item).await.is_err() || failed {
            return;
        }
    }
}
