//! From the engine's bytes to typed events: ZeroMQ frames ([`frames`]), msgpack payloads
//! ([`msgpack`]) of any engine family ([`engine`]) into [`EventBatch`]es ([`event`]), the llm-d topic and pod-id conventions
//! ([`topic`]), and one typed [`WireError`] for anything malformed. Pure functions over
//! borrowed bytes; nothing here knows about sockets or the index.

pub mod engine;
pub mod error;
pub mod event;
pub mod frames;
mod limits;
pub mod msgpack;
pub mod topic;

pub use engine::{Engine, UnknownEngine, ENGINES};
pub use error::WireError;
pub use event::{BlockRemoved, BlockStored, EngineHash, Event, EventBatch, OddTokens, Value};
pub use frames::{parse_live, parse_replay, Epoch, RawMessage, ReplayReply, END_OF_REPLAY_SEQ};
pub use msgpack::{decode_batch, decode_batch_as};
pub use topic::{canonical_port, dp_pod_id, parse_topic, topic_id_refusal, Topic};
