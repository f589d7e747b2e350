//! The service's clock: milliseconds since it started, the time base of the sequencers and of
//! RecordRoute's credits. One value copied into every part that reads it, so the apply workers
//! and the gRPC handlers agree on "now" without sharing anything else.

use std::time::Instant;

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock that starts now.
    pub fn start() -> Clock {
        Clock { start: Instant::now() }
    }

    /// Milliseconds since the clock started.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}
