//! What outlives the process or comes from another replica: [`snapshot`]s (warm restarts, a
//! sibling's bootstrap), [`dump`]s (record and replay), and the [`sibling`] client with its
//! digest check ([`sibling_check`]). Captures run on the apply workers through the queue; the
//! workers name only the record format, the export pool, the restored records and the recorder.

pub mod dump;
pub mod sibling;
pub mod sibling_check;
pub mod snapshot;
