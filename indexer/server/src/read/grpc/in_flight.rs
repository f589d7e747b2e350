//! The routers' shared in-flight load as the gRPC services serve it: the reservations a
//! RecordRoute carries go into the [`Reservations`] table, ReleaseRoute's releases end them,
//! and ScoreTokens answers each pod's totals (`ScoreTokensResponse.in_flight`). One lock around
//! the pure table, the server's clock, the checks and the counts; the handlers stay thin.
//!
//! A reservation is taken only for a pod this indexer knows (one it has a source for, or one
//! registered that has not published yet), whatever its state: a DEGRADED pod's cache is
//! unknown, its load is not. So the pods of the table, and of every ScoreTokens answer, are
//! bounded by the indexer's own. Callers are named by peer address, as for credits ([`super::record_route::caller_of`]).

use parking_lot::Mutex;

use kvindex_proto::kvindex::v1 as pb;

use super::score::MAX_NAME;
use crate::config::reservations::ReservationConfig;
use crate::index_handle::IndexHandle;
use crate::pods::lifecycle::Pods;
use crate::read::reservations::{Part, Released, Reservations, Reserve, Reserved, ENTRY_BYTES};
use crate::telemetry as m;

/// Most reservations in one RecordRoute (a pick reserves one pod, two in P/D).
pub const MAX_RESERVATIONS_PER_CALL: usize = 16;
/// Most releases in one ReleaseRoute.
pub const MAX_RELEASES_PER_CALL: usize = 8192;

/// Why a RecordRoute's reservations or a ReleaseRoute's releases were refused as a whole
/// (INVALID_ARGUMENT, counted `invalid`; nothing is reserved or released).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBatch {
    #[error("reservations has {0} entries, more than {MAX_RESERVATIONS_PER_CALL}")]
    TooManyReservations(usize),
    #[error("a reservation's pod must be a non-empty id of at most {MAX_NAME} bytes")]
    PodName,
    #[error("a reservation's prefill_blocks is {got}, more than a prompt of max_tokens has ({max})")]
    PrefillBlocks { got: u32, max: u32 },
    #[error("releases has {0} entries, more than {MAX_RELEASES_PER_CALL}")]
    TooManyReleases(usize),
    #[error("a release's part must be RELEASE_PREFILL or RELEASE_REQUEST, got {0}")]
    ReleasePart(i32),
}

/// The table and what it needs of the service.
pub struct InFlightLoad {
    table: Mutex<Reservations>,
    index: IndexHandle,
    pods: Pods,
    /// Most uncached blocks a reservation may name: the largest prompt's blocks.
    max_prefill_blocks: u32,
}

impl InFlightLoad {
    pub fn new(config: ReservationConfig, index: IndexHandle, pods: Pods, max_tokens: usize) -> InFlightLoad {
        let block_size = index.index().block_size().max(1);
        let max_prefill_blocks = u32::try_from(max_tokens / block_size).unwrap_or(u32::MAX);
        metrics::gauge!(m::RESERVATIONS_HELD).set(0.0);
        InFlightLoad { table: Mutex::new(Reservations::new(config)), index, pods, max_prefill_blocks }
    }

    pub fn enabled(&self) -> bool {
        self.table.lock().enabled()
    }

    /// Approximate memory of the reservations held.
    pub fn approx_bytes(&self) -> usize {
        self.table.lock().entries() * ENTRY_BYTES
    }

    /// The checks of a RecordRoute's reservations that need no lock: their number, pod names
    /// and prefill sizes.
    pub fn check(&self, reservations: &[pb::Reservation]) -> Result<(), InvalidBatch> {
        if reservations.len() > MAX_RESERVATIONS_PER_CALL {
            return Err(InvalidBatch::TooManyReservations(reservations.len()));
        }
        for r in reservations {
            if r.pod.is_empty() || r.pod.len() > MAX_NAME {
                return Err(InvalidBatch::PodName);
            }
            if r.prefill_blocks > self.max_prefill_blocks {
                return Err(InvalidBatch::PrefillBlocks { got: r.prefill_blocks, max: self.max_prefill_blocks });
            }
        }
        Ok(())
    }

    /// Takes `caller`'s reservations (checked already, [`check`](Self::check)); returns how
    /// many are held and the TTL applied. Each refusal is counted by why.
    pub fn reserve(&self, caller: &str, reservations: &[pb::Reservation]) -> (u32, u32) {
        if reservations.is_empty() {
            return (0, 0);
        }
        let known = self.known(reservations);
        let now = self.index.now_ms();
        let mut table = self.table.lock();
        if !table.enabled() {
            drop(table);
            metrics::counter!(m::RESERVATIONS, "result" => "disabled").increment(reservations.len() as u64);
            return (0, 0);
        }
        let expired = table.sweep(now);
        let mut held = 0;
        let mut ttl = 0;
        let mut outcomes: Vec<(&'static str, Option<&'static str>)> = Vec::with_capacity(reservations.len());
        for (r, known) in reservations.iter().zip(known) {
            if !known {
                outcomes.push(("unknown_pod", None));
                continue;
            }
            let ask = Reserve {
                pod: &r.pod,
                request_id: r.request_id,
                prefill_blocks: r.prefill_blocks,
                ttl_ms: u64::from(r.ttl_ms),
            };
            ttl = table.ttl(ask.ttl_ms);
            match table.reserve(caller, ask, now) {
                Ok(outcome) => {
                    held += 1;
                    outcomes.push((
                        match outcome {
                            Reserved::New => "reserved",
                            Reserved::Renewed => "renewed",
                            Reserved::ReleasedEarly => "released_early",
                        },
                        None,
                    ));
                }
                Err(bound) => outcomes.push(("refused", Some(bound.label()))),
            }
        }
        let entries = table.entries();
        drop(table);
        count_expired(expired);
        metrics::gauge!(m::RESERVATIONS_HELD).set(entries as f64);
        for (result, bound) in outcomes {
            match bound {
                Some(bound) => metrics::counter!(m::RESERVATIONS, "result" => result, "bound" => bound).increment(1),
                None => metrics::counter!(m::RESERVATIONS, "result" => result).increment(1),
            }
        }
        (held, u32::try_from(ttl).unwrap_or(u32::MAX))
    }

    /// Whether each reservation's pod is one this indexer knows: a source, else a registered
    /// pod (one lock at a time).
    fn known(&self, reservations: &[pb::Reservation]) -> Vec<bool> {
        let mut known: Vec<bool> = {
            let states = self.index.status().pod_states();
            reservations.iter().map(|r| states.contains_key(&r.pod)).collect()
        };
        if known.contains(&false) {
            let registry = self.pods.registry();
            for (k, r) in known.iter_mut().zip(reservations) {
                *k = *k || registry.get(&r.pod).is_some();
            }
        }
        known
    }

    /// Ends `caller`'s `releases` (a caller releases only its own); returns how many found
    /// their reservation. INVALID_ARGUMENT (nothing released) for a batch over
    /// [`MAX_RELEASES_PER_CALL`] or a release naming no part.
    pub fn release(&self, caller: &str, releases: &[pb::Release]) -> Result<u32, InvalidBatch> {
        if releases.len() > MAX_RELEASES_PER_CALL {
            return Err(InvalidBatch::TooManyReleases(releases.len()));
        }
        let parts: Vec<Part> = releases
            .iter()
            .map(|r| match pb::ReleasePart::try_from(r.part) {
                Ok(pb::ReleasePart::ReleasePrefill) => Ok(Part::Prefill),
                Ok(pb::ReleasePart::ReleaseRequest) => Ok(Part::Request),
                _ => Err(InvalidBatch::ReleasePart(r.part)),
            })
            .collect::<Result<_, _>>()?;
        let now = self.index.now_ms();
        let mut counts = [[0u64; 2]; 2];
        let mut table = self.table.lock();
        let before = table.entries();
        let expired = table.sweep(now);
        for (r, part) in releases.iter().zip(&parts) {
            let found = table.release(caller, r.request_id, *part, now) == Released::Ended;
            counts[(*part == Part::Request) as usize][found as usize] += 1;
        }
        let entries = table.entries();
        drop(table);
        count_expired(expired);
        if entries != before {
            metrics::gauge!(m::RESERVATIONS_HELD).set(entries as f64);
        }
        for (p, part) in ["prefill", "request"].into_iter().enumerate() {
            for (f, result) in ["not_held", "ended"].into_iter().enumerate() {
                if counts[p][f] > 0 {
                    metrics::counter!(m::RESERVATION_RELEASES, "part" => part, "result" => result)
                        .increment(counts[p][f]);
                }
            }
        }
        Ok((counts[0][1] + counts[1][1]) as u32)
    }

    /// Each pod's reserved load for a ScoreTokens answer (of `filter`'s pods, if any); `None`
    /// while reservations are off.
    pub fn answer(&self, filter: &[String]) -> Option<pb::InFlight> {
        let now = self.index.now_ms();
        let filter: Option<Vec<&str>> = (!filter.is_empty()).then(|| filter.iter().map(String::as_str).collect());
        let mut table = self.table.lock();
        if !table.enabled() {
            return None;
        }
        let expired = table.sweep(now);
        let loads = table.loads(filter.as_deref(), now);
        let entries = table.entries();
        drop(table);
        if expired > 0 {
            count_expired(expired);
            metrics::gauge!(m::RESERVATIONS_HELD).set(entries as f64);
        }
        let mut pods: Vec<pb::PodInFlight> = loads
            .into_iter()
            .map(|(pod, load)| pb::PodInFlight {
                pod: pod.to_string(),
                requests: load.requests,
                prefill_blocks: load.prefill_blocks,
            })
            .collect();
        pods.sort_by(|a, b| a.pod.cmp(&b.pod));
        pods.dedup_by(|a, b| a.pod == b.pod);
        Some(pb::InFlight { pods })
    }
}

fn count_expired(expired: usize) {
    if expired > 0 {
        metrics::counter!(m::RESERVATIONS_EXPIRED).increment(expired as u64);
    }
}
