//! What every kvindex HTTP listener holds its connections to, in one place for both binaries
//! (`kvindex serve` and `kvindex-router serve`; the per-network rule, [`network_of`], also
//! holds the central ZeroMQ SUB): caps in total, per client address and per
//! network, where a newcomer at a full cap takes the place of the oldest idle connection
//! instead of being refused ([`ConnectionCaps`]), and the bounds that configure them
//! ([`ConnLimits`]). With the `http` feature, the axum app wrapper
//! that tells the caps which connections are answering a request ([`NotingAnswers`]).

#[cfg(feature = "http")]
mod answering;
mod caps;
mod limits;
mod network;

#[cfg(feature = "http")]
pub use answering::NotingAnswers;
pub use caps::{Admitted, Answering, ConnectionCaps, Place};
pub use limits::{ConnLimits, PROBE_MAX_CONNECTIONS};
pub use network::network_of;
