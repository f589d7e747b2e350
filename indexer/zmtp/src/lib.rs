//! kvindex's ZeroMQ: a bounded ZMTP 3.0/3.1 SUB and DEALER on tokio, over `tcp://` and
//! `ipc://`, NULL security mechanism. It exists because the indexer needs what neither the
//! `zeromq` crate nor libzmq gives it: every message tagged with the connection and address it
//! came from, every connection's life reported, and every byte a peer can make us hold bounded
//! and counted (see `README.md` for the measured comparison with libzmq).
//!
//! # The API the server uses
//!
//! ```no_run
//! # async fn demo() -> Result<(), kvindex_zmtp::Error> {
//! use kvindex_zmtp::{Backoff, Dealer, Event, Limits, SubDialer, SubListener};
//! use std::time::Duration;
//!
//! // Central mode: engines dial us.
//! let mut sub = SubListener::bind("tcp://*:5557", &[b"kv@"], Limits::default()).await?;
//! // Per-pod mode: we dial an engine, re-dialling with backoff.
//! let mut pod = SubDialer::connect("tcp://10.0.0.7:5557", &[b"kv@"], Limits::default(), Backoff::default())?;
//! while let Some(event) = sub.recv().await {
//!     match event {
//!         Event::Message(m) => { /* m.conn, m.peer (address), m.frames: [topic, seq, payload] */ }
//!         Event::Connected { conn, peer, .. } => { /* a (re)connected publisher */ }
//!         Event::Disconnected { conn, reason, .. } => { /* count reason.label() */ }
//!         Event::Rejected { peer, reason } => { /* a cap or a failed handshake */ }
//!         Event::ConnectFailed { .. } | Event::AcceptFailed { .. } => {}
//!     }
//! }
//! // Replay: one request, a stream of replies until the caller sees vLLM's end marker.
//! let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
//! let request = [bytes::Bytes::new(), bytes::Bytes::copy_from_slice(&42u64.to_be_bytes())];
//! let mut replay = Dealer::request("tcp://10.0.0.7:5558", &request, &Limits::default(), deadline).await?;
//! let reply = replay.recv().await?; // [b"", (topic,) seq, payload]
//! # drop((pod, reply)); Ok(()) }
//! ```
//!
//! Every bound is a field of [`Limits`]; every refusal or disconnect carries a [`Reason`] with a
//! stable [`Reason::label`] for metrics. A [`Message`] holds its bytes against the socket's
//! in-flight budget until it is dropped.
//!
//! # Layout
//! `endpoint` (strings) → `transport` (tcp/ipc streams) → `greeting`, `frame`, `command`,
//! `decoder` (bytes → items, the untrusted parser) → `connection` (budget, heartbeats) →
//! `handshake` → `sub` / `sub_listener` / `sub_dialer` / `dealer` (the sockets) → `event`.

mod backoff;
mod budget;
mod command;
mod connection;
mod dealer;
pub mod decoder;
mod endpoint;
mod error;
mod event;
mod frame;
mod greeting;
mod handshake;
mod limits;
mod peer;
mod sub;
mod sub_dialer;
mod sub_listener;
mod transport;

pub use backoff::Backoff;
pub use budget::{Budget, Lease};
pub use command::Command;
pub use dealer::Dealer;
pub use endpoint::Endpoint;
pub use error::{Error, ProtocolError, Reason};
pub use event::{Event, Message};
pub use greeting::Greeting;
pub use handshake::PeerInfo;
pub use kvindex_conn_caps::network_of;
pub use limits::Limits;
pub use peer::{ConnId, Peer, Source};
pub use sub_dialer::SubDialer;
pub use sub_listener::{Admission, SubListener};
