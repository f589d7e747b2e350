//! The write plane: KV events from the engines' sockets into the index.

pub mod context;
pub mod replay;
pub mod sources;
pub mod table;
pub mod transport;
pub mod worker;
