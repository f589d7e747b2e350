//! The indexers' count of one request in flight, as this router holds it: the pods' side of
//! shared in-flight load. [`InFlight`](super::fleet::InFlight) keeps it beside its own count so
//! both end together; the pipeline makes it (`place/reserve.rs`) and sends what it queues.

use std::sync::Arc;

use kvindex_proto::kvindex::v1 as pb;
use tokio::sync::mpsc;

use crate::metrics as m;

/// A reservation this router holds: [`prefilled`](Self::prefilled) at the first response byte,
/// dropped at the end of the response (or when the request is abandoned).
#[derive(Debug)]
pub struct Reservation {
    request_id: u64,
    /// Its prefill part is still to release.
    prefill: bool,
    queues: Arc<[mpsc::Sender<pb::Release>]>,
}

impl Reservation {
    /// A reservation of request `request_id` (with a prefill part to release when `prefill`),
    /// whose releases go to every indexer's queue in `queues`.
    pub fn new(request_id: u64, prefill: bool, queues: Arc<[mpsc::Sender<pb::Release>]>) -> Reservation {
        Reservation { request_id, prefill, queues }
    }

    /// The pod answered: its prefill part ends. Idempotent.
    pub fn prefilled(&mut self) {
        if std::mem::take(&mut self.prefill) {
            self.release(pb::ReleasePart::ReleasePrefill);
        }
    }

    fn release(&self, part: pb::ReleasePart) {
        for queue in self.queues.iter() {
            if queue.try_send(pb::Release { request_id: self.request_id, part: part as i32 }).is_err() {
                metrics::counter!(m::RELEASES, "outcome" => "dropped").increment(1);
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // The request's end ends its prefill too.
        self.release(pb::ReleasePart::ReleaseRequest);
    }
}
