//! What outlives the process or another replica's: snapshots, dumps, siblings.

pub mod dump;
pub mod sibling;
pub mod sibling_check;
pub mod snapshot;
