//! A DEALER for one request and its stream of replies: vLLM's replay (the engine's ROUTER sends
//! every buffered batch from a seq, then an end marker). One connection per request, read only
//! when the caller asks for the next reply, so it holds at most one message and its read
//! buffer; every read is bounded by the caller's deadline and by the same [`Limits`] as the
//! live streams (a ROUTER declaring a 2^36-byte frame is refused on the header).
//!
//! The crate knows nothing of vLLM's frames: the caller builds the request (`[b"", seq_be8]`)
//! and decides when the replies end (the `ff…ff` seq marker).

use std::sync::Arc;

use bytes::Bytes;
use tokio::time::{timeout_at, Instant};

use crate::budget::Budget;
use crate::connection::Connection;
use crate::endpoint::Endpoint;
use crate::error::{Error, Reason};
use crate::event::Message;
use crate::handshake::{self, PeerInfo, SocketType};
use crate::limits::Limits;
use crate::peer::{ConnId, Peer};
use crate::transport;

/// A connected DEALER with its request sent; [`Dealer::recv`] returns the replies.
pub struct Dealer {
    conn: Connection,
    conn_id: ConnId,
    peer: Arc<Peer>,
    info: PeerInfo,
    endpoint: String,
    deadline: Instant,
}

impl Dealer {
    /// Connects to `endpoint`, handshakes and sends `frames` as one message, all before
    /// `deadline` (which also bounds every later [`Dealer::recv`]).
    pub async fn request(
        endpoint: &str,
        frames: &[Bytes],
        limits: &Limits,
        deadline: Instant,
    ) -> Result<Dealer, Error> {
        limits.validate().map_err(Error::Limits)?;
        let parsed = Endpoint::parse(endpoint)?;
        let failed = |reason| Error::Connection { endpoint: endpoint.to_string(), reason };
        let handshake_deadline = deadline.min(Instant::now() + limits.handshake_timeout);
        let connect = async {
            let (stream, peer) = transport::connect(&parsed).await.map_err(|e| Reason::Connect(e.kind()))?;
            let lease = Budget::new(limits.max_bytes_in_flight).lease();
            let (conn, info) = handshake::handshake(stream, SocketType::Dealer, limits, lease).await?;
            Ok::<_, Reason>((conn, info, peer))
        };
        let (mut conn, info, peer) = match timeout_at(handshake_deadline, connect).await {
            Ok(result) => result.map_err(failed)?,
            Err(_) if handshake_deadline < deadline => return Err(failed(Reason::HandshakeTimeout)),
            Err(_) => return Err(Error::Deadline { endpoint: endpoint.to_string() }),
        };
        match timeout_at(deadline, conn.send_message(frames)).await {
            Ok(result) => result.map_err(failed)?,
            Err(_) => return Err(Error::Deadline { endpoint: endpoint.to_string() }),
        }
        Ok(Dealer {
            conn,
            conn_id: ConnId::next(),
            peer: Arc::new(peer),
            info,
            endpoint: endpoint.to_string(),
            deadline,
        })
    }

    /// The next reply, or why there is none: the deadline passed, or the connection ended
    /// (closed by the peer, idle, or a broken bound).
    pub async fn recv(&mut self) -> Result<Message, Error> {
        match timeout_at(self.deadline, self.conn.recv()).await {
            Ok(Ok((frames, lease))) => Ok(Message {
                conn: self.conn_id,
                peer: self.peer.clone(),
                frames,
                lease,
                received_at: std::time::Instant::now(),
            }),
            Ok(Err(reason)) => Err(Error::Connection { endpoint: self.endpoint.clone(), reason }),
            Err(_) => Err(Error::Deadline { endpoint: self.endpoint.clone() }),
        }
    }

    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    pub fn peer_info(&self) -> &PeerInfo {
        &self.info
    }
}
