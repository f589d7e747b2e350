//! Shared in-flight load, the router's side: each request this router sends is reserved on every
//! indexer it knows (folded into the RecordRoute call a pick already makes, [`super::record`]),
//! and released there at its first response byte (its prefill part) and at its end (the whole
//! request), so every replica's ScoreTokens answers the load of all of them
//! (`ScoreTokensResponse.in_flight`). The indexer's TTL ends the reservations of a router that
//! dies.
//!
//! Releases are batched: one task per indexer sends whatever queued while its previous call was
//! in flight, so at a few requests a second each release goes out at once, and at thousands a
//! second a call carries hundreds (one call per release would double the indexer's calls per
//! pick; see BENCHMARKS.md, "Shared in-flight load"). A queue that is full drops the release
//! (counted): the reservation then ends at its TTL.
//!
//! Request ids are a random per-process base plus a counter, so router replicas on one host (one
//! caller for the indexer, which keys reservations by peer address and id) do not collide.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvindex_proto::kvindex::v1 as pb;
use tokio::sync::mpsc;

use super::indexer::IndexerPool;
use crate::config::IndexerToken;
use crate::metrics as m;
use crate::pods::reservation::Reservation;

/// Releases waiting for one indexer; past it a release is dropped (its reservation expires).
const QUEUE: usize = 65_536;
/// Most releases in one ReleaseRoute call (the indexer takes up to 8192).
const MAX_BATCH: usize = 1024;

/// Reserves this router's requests and queues their releases, one queue per indexer.
pub struct Reservations {
    /// The TTL asked for each reservation (the backstop for a router that dies).
    ttl_ms: u32,
    base: u64,
    next: AtomicU64,
    queues: Arc<[mpsc::Sender<pb::Release>]>,
}

impl Reservations {
    /// Reservations on every endpoint of `indexer` with `token`, asking for `ttl`; `None` when
    /// off: no indexer, no token (the indexer refuses reservations without it), a zero TTL, or
    /// no runtime to send releases on.
    pub fn start(
        indexer: &IndexerPool,
        token: Option<&IndexerToken>,
        ttl: Duration,
        timeout: Duration,
    ) -> Option<Reservations> {
        let token = token?;
        if ttl.is_zero() || indexer.is_empty() {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let queues: Vec<mpsc::Sender<pb::Release>> = indexer
            .clients()
            .into_iter()
            .map(|client| {
                let (tx, rx) = mpsc::channel(QUEUE);
                runtime.spawn(send_releases(client, token.authorization(), rx, timeout));
                tx
            })
            .collect();
        let base = std::hash::RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()));
        Some(Reservations {
            ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
            base,
            next: AtomicU64::new(0),
            queues: queues.into(),
        })
    }

    /// A new reservation of `pod` for a request with `prefill_blocks` uncached prompt blocks to
    /// compute there: what to send (in a RecordRoute), and the handle that releases it.
    pub fn reserve(&self, pod: &str, prefill_blocks: u32) -> (pb::Reservation, Reservation) {
        let request_id = self.base.wrapping_add(self.next.fetch_add(1, Ordering::Relaxed));
        let sent = pb::Reservation { pod: pod.to_string(), request_id, prefill_blocks, ttl_ms: self.ttl_ms };
        let held = Reservation::new(request_id, prefill_blocks > 0, self.queues.clone());
        (sent, held)
    }
}

/// One indexer's release task: sends what queued, in batches, until every sender is gone.
async fn send_releases(
    client: pb::indexer_client::IndexerClient<tonic::transport::Channel>,
    authorization: tonic::metadata::AsciiMetadataValue,
    mut queue: mpsc::Receiver<pb::Release>,
    timeout: Duration,
) {
    let mut releases = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut releases, MAX_BATCH).await > 0 {
        let n = releases.len() as u64;
        let mut call = tonic::Request::new(pb::ReleaseRouteRequest { releases: std::mem::take(&mut releases) });
        call.set_timeout(timeout);
        call.metadata_mut().insert("authorization", authorization.clone());
        let (outcome, released) = match tokio::time::timeout(timeout, client.clone().release_route(call)).await {
            Ok(Ok(answer)) => ("ok", u64::from(answer.into_inner().released).min(n)),
            Ok(Err(status))
                if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) =>
            {
                ("denied", 0)
            }
            Ok(Err(status)) if status.code() != tonic::Code::DeadlineExceeded => ("error", 0),
            _ => ("timeout", 0),
        };
        metrics::counter!(m::RELEASE_CALLS, "outcome" => outcome).increment(1);
        if outcome == "ok" {
            metrics::counter!(m::RELEASES, "outcome" => "released").increment(released);
            metrics::counter!(m::RELEASES, "outcome" => "not_held").increment(n - released);
        } else {
            metrics::counter!(m::RELEASES, "outcome" => "failed").increment(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservations(queues: Vec<mpsc::Sender<pb::Release>>) -> Reservations {
        Reservations { ttl_ms: 5_000, base: u64::MAX, next: AtomicU64::new(0), queues: queues.into() }
    }

    fn drain(rx: &mut mpsc::Receiver<pb::Release>) -> Vec<(u64, pb::ReleasePart)> {
        std::iter::from_fn(|| rx.try_recv().ok()).map(|r| (r.request_id, r.part())).collect()
    }

    #[test]
    fn each_reservation_is_released_on_every_indexer_prefill_once_then_the_request() {
        let ((tx1, mut rx1), (tx2, mut rx2)) = (mpsc::channel(8), mpsc::channel(8));
        let r = reservations(vec![tx1, tx2]);
        let (sent, mut held) = r.reserve("a:1", 12);
        assert_eq!((sent.pod.as_str(), sent.prefill_blocks, sent.ttl_ms), ("a:1", 12, 5_000));
        let (next, _next_held) = r.reserve("a:1", 0);
        assert_eq!(next.request_id, sent.request_id.wrapping_add(1), "ids are unique per router");
        held.prefilled();
        held.prefilled();
        drop(held);
        let expected =
            [(sent.request_id, pb::ReleasePart::ReleasePrefill), (sent.request_id, pb::ReleasePart::ReleaseRequest)];
        assert_eq!(drain(&mut rx1), expected);
        assert_eq!(drain(&mut rx2), expected);
    }

    #[test]
    fn a_request_without_prefill_or_ended_before_its_first_byte_sends_its_end_only() {
        let (tx, mut rx) = mpsc::channel(8);
        let r = reservations(vec![tx]);
        let (cached, mut held) = r.reserve("a:1", 0);
        held.prefilled();
        drop(held);
        let (unanswered, held) = r.reserve("a:1", 9);
        drop(held);
        assert_eq!(
            drain(&mut rx),
            [
                (cached.request_id, pb::ReleasePart::ReleaseRequest),
                (unanswered.request_id, pb::ReleasePart::ReleaseRequest)
            ]
        );
    }

    #[test]
    fn a_full_queue_drops_the_release_instead_of_waiting() {
        let (tx, mut rx) = mpsc::channel(1);
        let r = reservations(vec![tx]);
        let (first, a) = r.reserve("a:1", 0);
        let (_, b) = r.reserve("a:1", 0);
        drop(a);
        drop(b);
        assert_eq!(drain(&mut rx), [(first.request_id, pb::ReleasePart::ReleaseRequest)]);
    }
}
