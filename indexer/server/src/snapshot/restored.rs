//! The snapshot records loaded at start that no stream has picked up yet: a stream takes its
//! pod's record when it starts (`apply::live`), and proves it before it is imported. Apart from
//! the loading and writing in `snapshot/`, so the service state that holds it is not tied to them.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::format::StreamRecord;

/// Loaded records not yet picked up by a stream, by DP-resolved pod id.
#[derive(Default)]
pub struct Restored {
    records: Mutex<HashMap<String, StreamRecord>>,
}

impl Restored {
    /// The record of `pod`, once: the stream that takes it owns it.
    pub fn take(&self, pod: &str) -> Option<StreamRecord> {
        self.records.lock().remove(pod)
    }

    pub fn len(&self) -> usize {
        self.records.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn fill(&self, records: Vec<StreamRecord>) {
        let mut map = self.records.lock();
        for r in records {
            map.insert(r.pod().to_string(), r);
        }
    }

    /// The store keys of the records no stream has asked for yet.
    pub(super) fn keys(&self) -> Vec<String> {
        self.records.lock().values().map(StreamRecord::key).collect()
    }

    /// Forgets the records no stream asked for: their engines did not come back in time.
    pub(super) fn drain(&self) -> usize {
        self.records.lock().drain().count()
    }
}
