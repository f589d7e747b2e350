//! vLLM's KV-event transport, as the simulator speaks it: the msgpack batch encoding
//! ([`encode`]), the numbered PUB stream with fault knobs ([`publisher`]) and the replay
//! ROUTER over a `buffer_steps` window ([`replay`], [`replay_buffer`]).

pub mod encode;
pub mod publisher;
pub mod replay;
pub mod replay_buffer;

pub use encode::{encode_batch, WireVersion};
pub use publisher::{PubEndpoint, Publisher, PublisherConfig, PublisherStats};
