//! A SUB that dials one publisher (per-pod mode: the indexer connects to each engine's bound
//! PUB) and keeps it connected: re-dials with [`Backoff`] after a refused connect (within a
//! second: nothing listens yet), a failed handshake or a disconnect, and reports each as an
//! [`Event`], so the server sees every reconnect (a restarted engine's seq starts again at 0).

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::timeout;

use crate::backoff::Backoff;
use crate::budget::Budget;
use crate::endpoint::Endpoint;
use crate::error::{Error, Reason};
use crate::event::Event;
use crate::handshake::{self, SocketType};
use crate::limits::Limits;
use crate::peer::ConnId;
use crate::sub::pump;
use crate::transport;

/// A dialling SUB socket: [`SubDialer::recv`] yields its [`Event`]s.
pub struct SubDialer {
    events: mpsc::Receiver<Event>,
    budget: Budget,
    task: AbortHandle,
}

impl SubDialer {
    /// Starts dialling `endpoint` (`tcp://10.0.0.7:5557`, `ipc:///run/engine.sock`) and
    /// subscribing to `subscriptions`; returns at once (an engine that is not up yet is
    /// retried). Must be called inside a tokio runtime.
    pub fn connect(
        endpoint: &str,
        subscriptions: &[&[u8]],
        limits: Limits,
        backoff: Backoff,
    ) -> Result<SubDialer, Error> {
        Self::connect_sharing(endpoint, subscriptions, limits, backoff, None)
    }

    /// [`SubDialer::connect`], with every byte this dialler holds also charged to `shared`, a
    /// budget of all the diallers of a process together (each keeps its own
    /// `max_bytes_in_flight` too): many dialled pods cannot hold more than `shared` at once.
    pub fn connect_sharing(
        endpoint: &str,
        subscriptions: &[&[u8]],
        limits: Limits,
        backoff: Backoff,
        shared: Option<Budget>,
    ) -> Result<SubDialer, Error> {
        limits.validate().map_err(Error::Limits)?;
        let parsed = Endpoint::parse(endpoint)?;
        if matches!(&parsed, Endpoint::Tcp { host, .. } if host == "*") {
            return Err(Error::Endpoint { endpoint: endpoint.to_string(), why: "cannot dial the wildcard host *" });
        }
        let (tx, rx) = mpsc::channel(limits.max_queued_events);
        let budget = Budget::new(limits.max_bytes_in_flight);
        let subscriptions = subscriptions.iter().map(|s| Bytes::copy_from_slice(s)).collect();
        let budgets = (budget.clone(), shared);
        let task = tokio::spawn(dial_loop(parsed, endpoint.into(), subscriptions, limits, backoff, budgets, tx));
        Ok(SubDialer { events: rx, budget, task: task.abort_handle() })
    }

    /// The next event; `None` only if the dialler's task is gone.
    pub async fn recv(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Bytes held now (an unfinished message and undropped [`Message`]s), for a gauge.
    pub fn bytes_in_flight(&self) -> usize {
        self.budget.used()
    }
}

impl Drop for SubDialer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn dial_loop(
    endpoint: Endpoint,
    name: Arc<str>,
    subscriptions: Vec<Bytes>,
    limits: Limits,
    backoff: Backoff,
    (budget, shared): (Budget, Option<Budget>),
    events: mpsc::Sender<Event>,
) {
    let mut attempt = 0u32;
    loop {
        let dial = async {
            let (stream, peer) = transport::connect(&endpoint).await.map_err(|e| Reason::Connect(e.kind()))?;
            let lease = match &shared {
                Some(shared) => budget.lease_with(shared.clone()),
                None => budget.lease(),
            };
            let (mut conn, info) = handshake::handshake(stream, SocketType::Sub, &limits, lease).await?;
            handshake::subscribe(&mut conn, &subscriptions).await?;
            Ok::<_, Reason>((conn, info, peer))
        };
        let failure = match timeout(limits.handshake_timeout, dial).await {
            Ok(Ok((mut conn, info, peer))) => {
                attempt = 0;
                let conn_id = ConnId::next();
                let peer = Arc::new(peer);
                if events.send(Event::Connected { conn: conn_id, peer: peer.clone(), info }).await.is_err() {
                    return;
                }
                let reason = pump(&mut conn, conn_id, &peer, &subscriptions, &events).await;
                drop(conn); // its unfinished bytes go back to the budget before the server hears of it
                if events.send(Event::Disconnected { conn: conn_id, peer, reason }).await.is_err() {
                    return;
                }
                None
            }
            Ok(Err(reason)) => Some(reason),
            Err(_) => Some(Reason::HandshakeTimeout),
        };
        // Nothing listens yet (an engine still starting): retried soon whatever the attempt.
        let refused = matches!(
            failure,
            Some(Reason::Connect(std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound))
        );
        let retry_in = if refused { backoff.delay_refused(attempt) } else { backoff.delay(attempt) };
        attempt = attempt.saturating_add(1);
        if let Some(reason) = failure {
            let event = Event::ConnectFailed { endpoint: name.clone(), reason, retry_in };
            if events.send(event).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(retry_in).await;
    }
}
