//! What every kvindex HTTP listener holds its connections to, in one place for both binaries
//! (`kvindex serve` and `kvindex-router serve`; the per-network rule, [`network_of`], also
//! holds the central ZeroMQ SUB): caps in total, per client address and per
//! network, where a newcomer at a full cap takes the place of the oldest idle connection
//! instead of being refused ([`ConnectionCaps`]).

mod caps;
mod network;

pub use caps::{Admitted, Answering, ConnectionCaps, Place};
pub use network::network_of;
