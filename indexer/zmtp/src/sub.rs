//! What a SUB does with a connected publisher, whether we dialled it or it dialled us: hand
//! each message that matches a subscription to the server, tagged with its connection and
//! peer, until the connection ends.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::connection::Connection;
use crate::error::Reason;
use crate::event::{Event, Message};
use crate::peer::{ConnId, Peer};

/// Delivers a connected SUB's messages until the connection ends; returns why it ended.
pub(crate) async fn pump(
    conn: &mut Connection,
    conn_id: ConnId,
    peer: &Arc<Peer>,
    subscriptions: &[Bytes],
    events: &mpsc::Sender<Event>,
) -> Reason {
    loop {
        match conn.recv().await {
            Ok((frames, lease)) => {
                let received_at = std::time::Instant::now();
                let message = Message { conn: conn_id, peer: peer.clone(), frames, lease, received_at };
                if subscribed(subscriptions, &message) && events.send(Event::Message(message)).await.is_err() {
                    return Reason::Closed;
                }
            }
            Err(reason) => return reason,
        }
    }
}

/// Whether `frames` match one of the prefixes (the publisher filters already; libzmq's SUB
/// checks again, and so do we, so a publisher cannot push topics we did not ask for).
pub(crate) fn subscribed(subscriptions: &[Bytes], message: &Message) -> bool {
    let topic = message.frames.first().map_or(&[][..], |f| &f[..]);
    subscriptions.iter().any(|p| topic.starts_with(p))
}
