//! Which source addresses hold a live connection on the central SUB. The central task counts
//! them as connections open and close; an apply worker moves a topic bound to one source
//! address to another only once its source has none. A leaf: both sides share this alone.

use std::collections::HashMap;

use kvindex_zmtp::Source;
use parking_lot::Mutex;

#[derive(Default)]
pub struct CentralConnections {
    by_source: Mutex<HashMap<Source, usize>>,
}

impl CentralConnections {
    /// A connection from `source` opened (`true`) or closed.
    pub fn note(&self, source: Source, opened: bool) {
        let mut sources = self.by_source.lock();
        let n = sources.entry(source).or_insert(0);
        if opened {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                sources.remove(&source);
            }
        }
    }

    /// Whether `source` holds a live connection.
    pub fn connected(&self, source: &Source) -> bool {
        self.by_source.lock().contains_key(source)
    }
}
