//! The stream table's live connections: a connection that opens catches up the streams it may
//! carry, one that closes clears the streams it carried.
//!
//! A SUB receives only what its publisher sends after our subscription reached it, so when a
//! connection opens, each stream it may carry, with a replay endpoint, asks that endpoint for
//! everything after its cursor (the sequencer's `on_connected`). A dialled pod's connection
//! carries the streams of its endpoint. A central-mode connection names no topic until it
//! sends: it may carry the streams bound to its source address whose connection closed (an
//! engine that reconnects or restarts), and it then carries them (its close clears them). The
//! central SUB reports each connection on its own, so a reconnecting engine's new connection
//! may be seen before its old one's close: the table remembers the central connections that
//! have carried nothing yet ("fresh"), and a stream cleared by a close catches up on a fresh
//! connection from its address. A stream no message ever made is unknown here (central mode:
//! an engine's first connection; its first message, if past seq 0, replays from 0).

use std::collections::HashMap;

use kvindex::sequencer::SourceState;
use kvindex_zmtp::Source;

use super::{Effect, Ext, Fleet, Mode, StreamTable};
use crate::protocols::{ConnId, LiveSocket, Peer, StreamKey};

impl<X: Ext> StreamTable<X> {
    /// A publisher's live connection opened, before any message on it: the streams it may
    /// carry catch up (see the module doc). Streams without a replay endpoint are left as they
    /// were (their next message resyncs them).
    pub fn connected(
        &mut self,
        fleet: &dyn Fleet,
        origin: &LiveSocket,
        conn: ConnId,
        peer: Option<&Peer>,
        now: u64,
        out: &mut Vec<Effect<X>>,
    ) {
        let source = peer.map(Peer::source);
        if let (LiveSocket::Central, Some(source)) = (origin, source) {
            self.fresh.insert(conn, source);
        }
        let mut keys: Vec<StreamKey> = self
            .streams
            .iter()
            .filter(|(key, st)| match origin {
                LiveSocket::Pod { id, endpoint, .. } => {
                    st.mode == Mode::PerPod && key.base == *id && st.endpoint.as_ref() == Some(endpoint)
                }
                LiveSocket::Central => {
                    st.mode == Mode::Central && st.conn.is_none() && source.is_some() && st.bound == source
                }
            })
            .map(|(key, _)| key.clone())
            .collect();
        // In key order, as `disconnect`.
        keys.sort();
        for key in keys {
            self.catch_up(fleet, &key, conn, now, out);
        }
    }

    /// A publisher's live connection closed: every stream whose messages came on it is
    /// cleared and back to CONNECTING. Only the connection that carried a stream clears it; a
    /// foreign one (central mode) never did, so it cannot. A central stream cleared here
    /// catches up on a fresh connection from its address, if one opened before this close.
    pub fn disconnect(
        &mut self,
        fleet: &dyn Fleet,
        origin: &LiveSocket,
        conn: ConnId,
        now: u64,
        out: &mut Vec<Effect<X>>,
    ) {
        self.fresh.remove(&conn);
        let mut keys: Vec<StreamKey> = self
            .streams
            .iter()
            .filter(|(key, st)| match st.conn {
                Some(c) => c == conn,
                // A dialled pod's stream filled by its start-up replay before any live message
                // came: the dialer's connection is the only one that pod has.
                None => match origin {
                    LiveSocket::Pod { id, endpoint, .. } => {
                        key.base == *id
                            && st.endpoint.as_ref() == Some(endpoint)
                            && st.seq.state() != SourceState::Connecting
                    }
                    LiveSocket::Central => false,
                },
            })
            .map(|(key, _)| key.clone())
            .collect();
        // In key order, so a replay offline carries the clears out as the live worker did.
        keys.sort();
        for key in keys {
            let Some(st) = self.streams.get_mut(&key) else { continue };
            st.conn = None;
            let mut steps = Vec::new();
            st.seq.on_disconnect(&mut steps);
            out.push(Effect::Disconnected { key: key.clone(), conn });
            out.push(Effect::Steps { key: key.clone(), steps });
            let bound = st.bound.filter(|_| st.mode == Mode::Central);
            if let Some(fresh) = bound.and_then(|source| newest_from(&self.fresh, source)) {
                self.catch_up(fleet, &key, fresh, now, out);
            }
        }
    }

    /// A message came on `conn`: it is no longer fresh.
    pub(super) fn carried(&mut self, conn: ConnId) {
        if !self.fresh.is_empty() {
            self.fresh.remove(&conn);
        }
    }

    /// `key`'s stream is carried by `conn` from now on and, with a replay endpoint, catches up.
    fn catch_up(&mut self, fleet: &dyn Fleet, key: &StreamKey, conn: ConnId, now: u64, out: &mut Vec<Effect<X>>) {
        let Some(st) = self.streams.get_mut(key) else { return };
        let generation = fleet.generation();
        if st.registry_generation != generation {
            st.seq.set_replay(fleet.has_replay(&key.base, key.rank));
            st.registry_generation = generation;
        }
        if !st.seq.config().replay {
            return;
        }
        let mut steps = Vec::new();
        if st.conn.is_some_and(|c| c != conn) {
            out.push(Effect::Reconnected { key: key.clone() });
            st.seq.on_reconnect();
        }
        st.conn = Some(conn);
        st.seq.on_connected(now, &mut steps);
        st.saw(&steps);
        out.push(Effect::Steps { key: key.clone(), steps });
    }
}

/// The newest fresh connection from `source`.
fn newest_from(fresh: &HashMap<ConnId, Source>, source: Source) -> Option<ConnId> {
    fresh.iter().filter(|(_, s)| **s == source).map(|(c, _)| *c).max()
}
