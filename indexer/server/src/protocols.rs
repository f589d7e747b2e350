//! The messages that cross the service's components: what the sockets, the replay client and
//! the control plane hand to an apply worker, and the names they address streams by
//! ([`StreamKey`], and [`LiveSocket`], the socket a live message came in on). A leaf
//! (Dynamo's `kv_router/protocols.rs` is the model): it holds data, no behaviour, and imports
//! no other part of the service but the snapshot record's format (a leaf itself), so that the
//! components that talk through it are not tied to each other by it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

pub use kvindex_zmtp::{ConnId, Lease, Peer};

use crate::persist::snapshot::format::StreamRecord;

/// One multipart message.
pub type Frames = Vec<Bytes>;

/// One sequenced stream: a source (topic id mapped to a pod, or a dialled pod) and a DP rank.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    /// Pod id of rank 0.
    pub base: Arc<str>,
    pub rank: u32,
}

/// The SUB socket a live message came in on (where it came from): the central one, or a
/// dialled pod's. Named apart from a configuration value's origin (`config::error::ValueOrigin`)
/// and a pod declaration's (`kvindex_discovery::PodOrigin`).
#[derive(Debug, Clone)]
pub enum LiveSocket {
    /// The central SUB socket: the topic names the pod.
    Central,
    /// A dialled pod's SUB socket.
    Pod { id: Arc<str>, model: Arc<str>, endpoint: Arc<str> },
}

/// What a replay request got.
#[derive(Debug)]
pub enum ReplayItem {
    /// The replay got one of the `max_concurrent_replays` slots and starts now (it may have
    /// waited for one): its timeout counts from here.
    Begun,
    Message {
        seq: u64,
        payload: Bytes,
        /// The reply's bytes, counted against the replay socket's budget until the worker has
        /// taken it: a replay's output waiting in the queue is bounded in bytes.
        lease: Lease,
    },
    End,
    Failed {
        timeout: bool,
    },
}

/// Work for an apply worker.
pub enum Work {
    /// A live message; `conn` identifies the connection it came on (a new one for the same
    /// stream means the publisher reconnected, possibly as a new process).
    Live {
        origin: LiveSocket,
        conn: ConnId,
        /// The publisher's address (central mode binds a topic to its source).
        peer: Arc<Peer>,
        frames: Frames,
        /// The frames' bytes, counted against their socket's budget until this work is done.
        lease: Lease,
        at: Instant,
    },
    Replay {
        stream: StreamKey,
        id: u64,
        item: ReplayItem,
    },
    /// Start a replay from 0 before any live message (per-pod sources with a replay socket).
    InitialSync {
        stream: StreamKey,
        model: Arc<str>,
        endpoint: Arc<str>,
        startup: bool,
    },
    /// A publisher's live connection opened (before any message on it): the streams it may
    /// carry whose replay endpoint is known ask it for what was published before our
    /// subscription reached the publisher (a dialled pod's streams; in central mode, the
    /// streams bound to the connection's source address that hold no live connection).
    Connected {
        origin: LiveSocket,
        conn: ConnId,
        peer: Arc<Peer>,
    },
    /// A publisher's live connection closed: every stream whose messages came on it is
    /// cleared and back to CONNECTING (its next connection resyncs). Only the connection that
    /// carried a stream clears it; a foreign one (central mode) never did, so it cannot.
    Disconnected {
        origin: LiveSocket,
        conn: ConnId,
    },
    /// Drop every stream of this pod and everything it holds; answer when done.
    RemovePod {
        pod: String,
        done: tokio::sync::oneshot::Sender<bool>,
    },
    /// Export the pod and cursor of every stream that moved since the stored snapshot
    /// (`held`) for a snapshot (`crate::persist::snapshot`).
    Snapshot {
        held: Arc<HeldMap>,
        /// Where each exported record goes as soon as it is exported (a snapshot store);
        /// None: every record comes back in the reply (a sibling's export).
        sink: Option<Arc<dyn RecordSink>>,
        reply: tokio::sync::oneshot::Sender<Vec<Captured>>,
    },
    /// The server is shutting down: the worker returns.
    Stop,
}

impl Work {
    /// A message read off a live socket of `origin`, with its lease and receive time.
    pub fn live(origin: LiveSocket, msg: kvindex_zmtp::Message) -> Work {
        Work::Live { origin, conn: msg.conn, peer: msg.peer, frames: msg.frames, lease: msg.lease, at: msg.received_at }
    }
}

/// What the store holds for a stream: whether it is still exact, and what it adds up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The record's cursor.
    pub cursor: u64,
    /// The pod's `KvIndex::pod_version` when this process exported it (None: loaded).
    pub version: Option<u64>,
    pub(crate) checksum: u64,
    pub(crate) residencies: u64,
    /// The snapshot generation the record is stored under (0: under its stream key, as a
    /// version-5 store kept it).
    pub(crate) generation: u64,
}

/// Every stored stream record, by store key.
pub type HeldMap = HashMap<String, Held>;

/// A stream's part in a snapshot, as its apply worker captured it.
#[derive(Debug)]
pub enum Captured {
    /// The stored record is still exact: same cursor, the pod unchanged since its export.
    Kept { key: String },
    /// A new record (`version`: the pod's version it was exported at).
    Fresh { key: String, version: Option<u64>, record: Box<StreamRecord> },
    /// A new record, already in the snapshot store (`bytes`: its encoding's size).
    Written { key: String, held: Held, bytes: u64 },
    /// The new record could not be written: the snapshot fails.
    Failed { key: String, error: String },
}

/// Where a snapshot's capture puts each record as soon as it is exported (the snapshot store
/// writes it at once), so a capture holds a few records at a time; what it answers goes back in
/// the capture's reply.
pub trait RecordSink: Send + Sync {
    /// Takes stream `key`'s `record` (its pod exported at `version`).
    fn write(&self, key: String, version: Option<u64>, record: &StreamRecord) -> Captured;
}
