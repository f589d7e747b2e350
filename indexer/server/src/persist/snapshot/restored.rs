//! The snapshot records loaded at start (or streamed from a sibling, `bootstrap`) that no
//! stream has picked up yet: a stream takes its pod's record when it starts (`write::worker::live`),
//! and proves it before it is imported. Apart from the loading and writing in `persist/snapshot/`, so
//! the service state that holds it is not tied to them.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::format::StreamRecord;
use crate::readiness::HoldPart;

/// A record waiting for its stream, and, for a sibling's, its part of `/readyz`'s wait.
struct Waiting {
    record: StreamRecord,
    hold: Option<HoldPart>,
}

/// Loaded records not yet picked up by a stream, by DP-resolved pod id.
#[derive(Default)]
pub struct Restored {
    records: Mutex<HashMap<String, Waiting>>,
}

impl Restored {
    /// The record of `pod`, once: the stream that takes it owns it (and its part of
    /// readiness, done when the stream has proven or dropped the record).
    pub fn take(&self, pod: &str) -> Option<(StreamRecord, Option<HoldPart>)> {
        self.records.lock().remove(pod).map(|w| (w.record, w.hold))
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
            map.insert(r.pod().to_string(), Waiting { record: r, hold: None });
        }
    }

    /// Replaces every record with a sibling's, each with its part of readiness.
    pub(super) fn replace(&self, records: Vec<(StreamRecord, HoldPart)>) {
        let mut map = self.records.lock();
        map.clear();
        for (record, hold) in records {
            map.insert(record.pod().to_string(), Waiting { record, hold: Some(hold) });
        }
    }

    /// The store keys of the records no stream has asked for yet.
    pub(super) fn keys(&self) -> Vec<String> {
        self.records.lock().values().map(|w| w.record.key()).collect()
    }

    /// Forgets the records no stream asked for: their engines did not come back in time.
    pub(super) fn drain(&self) -> usize {
        self.records.lock().drain().count()
    }
}
