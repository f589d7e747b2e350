//! The write plane: KV events from the engines' sockets into the index, in flow order.
//! [`transport`] is the ZeroMQ boundary; [`sources`] read its sockets and hand each message to
//! its worker's lane in `crate::queue`; a [`worker`] takes it, lets its stream [`table`] admit,
//! name, decode and sequence it, and carries the resulting steps out on the index, asking
//! [`replay`] for what a gap lost. [`context`] is what the workers share. Nothing here is
//! named by the read plane (`crate::read`).

pub mod context;
pub mod replay;
pub mod sources;
pub mod table;
pub mod transport;
pub mod worker;
