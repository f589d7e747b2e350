//! The pods this router may pick, where their ids come from, and what it knows of their load:
//! the last scrape of each pod's `/metrics` plus this router's own requests in flight.
//!
//! A scrape is already out of date when the router sends the next request, so requests this
//! router started since the last scrape are added on top of it ("fresh" requests); with no
//! recent scrape the router's own in-flight count is all it has. Pods come from four places
//! (static flags, a watched file, Kubernetes discovery, registration); a pod named by the
//! command line cannot be replaced or removed by the others, nor a discovered one by
//! registration.
//!
//! A scrape also lags a burst in a way that counts cannot fix: it says how many requests run,
//! not how much prompt the pod still has to compute before it answers anyone new. So each
//! request this router sends carries the blocks it is expected to prefill there (its uncached
//! blocks), "queued prefill" until the pod's first response byte arrives (the prefill is done)
//! or the request ends; a new request on that pod waits about that long before its own.
//!
//! A configured pod whose engine serves several data-parallel ranks behind its one URL is, by
//! its `dp_routing`, either one entry per rank (the router names the rank in each request, so
//! each rank has its own cache, load and in-flight count) or one entry standing for all its
//! ranks (the engine picks: credited what every rank holds). Sources add and remove configured
//! pods, i.e. all entries of one spec id at once; the picker sees entries.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex_discovery::precedence::{self, PodOrigin};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use tokio::sync::watch;

use super::spec::{DpRouting, PodSpec, Role};
use crate::metrics as m;
use crate::pods::engine_load::EngineLoad;
use crate::pods::reservation::Reservation;

/// Where a pod's entry came from; a source only changes its own entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Static,
    File,
    Registered,
    /// Kubernetes pod discovery.
    Discovered,
}

impl Source {
    /// Its place in the precedence both services share.
    pub fn origin(self) -> PodOrigin {
        match self {
            Source::Static => PodOrigin::Static,
            Source::File => PodOrigin::File,
            Source::Discovered => PodOrigin::Discovered,
            Source::Registered => PodOrigin::Registered,
        }
    }

    /// Where its entries are named, for refusals.
    fn describe(self) -> &'static str {
        match self {
            Source::Static => "configured on the command line",
            Source::File => "listed in the pods file",
            Source::Discovered => "discovered in Kubernetes",
            Source::Registered => "registered",
        }
    }
}

/// A change of the pod table refused: the pod belongs to another source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodRefused {
    /// A source at least as strong holds it (the precedence).
    #[error("pod {id:?} is {} and cannot be changed", .owner.describe())]
    Stronger { id: String, owner: Source },
    /// Only the source that added a pod removes it.
    #[error("pod {id:?} was added by {owner:?} and cannot be removed here")]
    NotOwner { id: String, owner: Source },
    /// One of the spec's ids (its own, or a data-parallel rank's) names another configured
    /// pod's entry: two engines would be credited each other's blocks.
    #[error("pod {id:?} names {taken:?}, which pod {other:?} already uses (as its id or a data-parallel rank's)")]
    IdTaken { id: String, taken: String, other: String },
}

/// Consecutive failed scrapes after which a pod is tried only when no other pod answers.
const UNREACHABLE_AFTER: u32 = 3;

#[derive(Debug, Default)]
struct LoadState {
    scraped: Option<(EngineLoad, Instant)>,
    failures: u32,
    /// Bumped by every successful scrape.
    generation: u64,
    /// Requests in flight that started since the last scrape.
    fresh: u32,
    inflight: u32,
    /// Prompt blocks this router's requests in flight still have to prefill here.
    queued_prefill_blocks: u64,
}

/// Which of its engine's data-parallel ranks an entry stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodDp {
    /// The whole engine (no ranks behind the URL, or a rank with a URL of its own).
    Single,
    /// Rank `rank` of `ranks`, named in every request sent to it (`X-Data-Parallel-Rank`).
    Rank { rank: u32, ranks: u32 },
    /// Every rank, the engine's balancer choosing: the indexer's ids of the ranks, rank 0 first.
    Balanced(Vec<String>),
}

impl PodDp {
    /// The rank a request names, and whose `/metrics` series are this entry's load.
    pub fn named_rank(&self) -> Option<u32> {
        match self {
            PodDp::Rank { rank, .. } => Some(*rank),
            PodDp::Single | PodDp::Balanced(_) => None,
        }
    }
}

/// One pod (or one named rank of a pod): identity (fixed for the life of this value) and load
/// (changing).
#[derive(Debug)]
pub struct Pod {
    /// The indexer's id for what this entry serves from: the pod's, or its rank's.
    pub id: String,
    pub url: String,
    pub role: Role,
    pub source: Source,
    /// The configured pod's id: the endpoint a gateway knows, and what sources add and remove.
    pub spec_id: String,
    pub dp: PodDp,
    load: Mutex<LoadState>,
    last_picked: AtomicU64,
}

/// A pod's load as the cost model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LoadView {
    /// Queued + running requests (scraped, plus fresh ones), or own in-flight without a scrape.
    pub load: f64,
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    pub kv_usage: Option<f64>,
    /// KV-cache capacity in tokens, as the engine last reported it (a property of the engine,
    /// kept when the scrape goes stale).
    pub kv_tokens: Option<u64>,
    /// Data-parallel engines the pod's `/metrics` showed last (1 until scraped), a property of
    /// the engine kept when the scrape goes stale.
    pub engines: u32,
    pub inflight: u32,
    pub fresh: u32,
    /// Uncached prompt blocks of this router's requests to the pod that have not had their
    /// first response byte yet: prefill work queued ahead of a new request.
    pub queued_prefill_blocks: u64,
    pub reachable: bool,
    /// Age of the scrape used, if any.
    pub scrape_age_ms: Option<u64>,
}

impl LoadView {
    /// A reachable pod with `load` and nothing scraped (the unit tests' pods).
    #[cfg(test)]
    pub(crate) fn unscraped(load: f64) -> LoadView {
        LoadView {
            load,
            waiting: None,
            running: None,
            kv_usage: None,
            kv_tokens: None,
            engines: 1,
            inflight: 0,
            fresh: 0,
            queued_prefill_blocks: 0,
            reachable: true,
            scrape_age_ms: None,
        }
    }
}

impl Pod {
    fn new(spec: &PodSpec, id: String, dp: PodDp, source: Source) -> Pod {
        Pod {
            id,
            url: spec.url.clone(),
            role: spec.role,
            source,
            spec_id: spec.id.clone(),
            dp,
            load: Mutex::new(LoadState::default()),
            last_picked: AtomicU64::new(0),
        }
    }

    /// The entries of one configured pod: itself; or, its ranks behind its URL, one per rank
    /// (the router names the rank) or one for all (the engine picks).
    fn entries(spec: &PodSpec, source: Source) -> Vec<Pod> {
        match (spec.dp_size, spec.dp_routing) {
            (0 | 1, _) => vec![Pod::new(spec, spec.id.clone(), PodDp::Single, source)],
            (ranks, DpRouting::Router) => {
                (0..ranks).map(|r| Pod::new(spec, spec.rank_id(r), PodDp::Rank { rank: r, ranks }, source)).collect()
            }
            (ranks, DpRouting::Engine) => {
                let ids = (0..ranks).map(|r| spec.rank_id(r)).collect();
                vec![Pod::new(spec, spec.id.clone(), PodDp::Balanced(ids), source)]
            }
        }
    }

    /// Whether this entry is what `entry` would be (same spec, same shape, same source).
    fn same_as(&self, entry: &Pod) -> bool {
        self.id == entry.id
            && self.url == entry.url
            && self.role == entry.role
            && self.source == entry.source
            && self.spec_id == entry.spec_id
            && self.dp == entry.dp
    }

    /// Records a scrape: it now includes every request started before it.
    pub fn scraped(&self, load: EngineLoad, at: Instant) {
        let mut s = self.load.lock();
        let before = s.scraped.map_or(1, |(l, _)| l.engines);
        if load.engines > 1 && before <= 1 && self.dp == PodDp::Single {
            tracing::warn!(
                pod = %self.id,
                engines = load.engines,
                "the pod's /metrics shows several data-parallel engines behind its URL, but it is configured without \
                 dp_size: credited only what every rank holds; configure dp_size (and dp_routing) for it"
            );
        }
        s.scraped = Some((load, at));
        s.failures = 0;
        s.generation += 1;
        s.fresh = 0;
    }

    pub fn scrape_failed(&self) {
        self.load.lock().failures += 1;
    }

    pub fn load(&self, now: Instant, stale_after: Duration) -> LoadView {
        let s = self.load.lock();
        let recent = s.scraped.filter(|(_, at)| now.saturating_duration_since(*at) <= stale_after);
        let reachable = s.failures < UNREACHABLE_AFTER;
        match recent {
            Some((l, at)) => LoadView {
                load: l.waiting + l.running + f64::from(s.fresh),
                waiting: Some(l.waiting),
                running: Some(l.running),
                kv_usage: l.kv_usage,
                kv_tokens: l.kv_tokens,
                engines: l.engines,
                inflight: s.inflight,
                fresh: s.fresh,
                queued_prefill_blocks: s.queued_prefill_blocks,
                reachable,
                scrape_age_ms: Some(now.saturating_duration_since(at).as_millis() as u64),
            },
            None => LoadView {
                load: f64::from(s.inflight),
                waiting: None,
                running: None,
                kv_usage: None,
                kv_tokens: s.scraped.and_then(|(l, _)| l.kv_tokens),
                engines: s.scraped.map_or(1, |(l, _)| l.engines),
                inflight: s.inflight,
                fresh: s.fresh,
                queued_prefill_blocks: s.queued_prefill_blocks,
                reachable,
                scrape_age_ms: None,
            },
        }
    }

    pub fn last_picked(&self) -> u64 {
        self.last_picked.load(Ordering::Relaxed)
    }
}

/// A request in flight on a pod; dropping it (the response ended, or the client went away)
/// releases the count, and its queued prefill if the first byte never came, here and in the
/// indexers' shared view (its reservation, if any).
#[derive(Debug)]
pub struct InFlight {
    pod: Arc<Pod>,
    generation: u64,
    /// Blocks still counted in the pod's queued prefill (0 once the first byte came).
    queued_prefill_blocks: u32,
    /// The request as the indexers count it for every router (released with this count).
    reservation: Option<Reservation>,
}

impl InFlight {
    pub fn pod(&self) -> &Arc<Pod> {
        &self.pod
    }

    /// Releases `reservation` with this count: its prefill part at [`prefilled`](Self::prefilled),
    /// the whole when this is dropped.
    pub fn hold(&mut self, reservation: Reservation) {
        self.reservation = Some(reservation);
    }

    /// The pod answered (its first response byte): the prompt is computed, so it no longer
    /// delays what comes after it. Idempotent.
    pub fn prefilled(&mut self) {
        if let Some(reservation) = &mut self.reservation {
            reservation.prefilled();
        }
        if self.queued_prefill_blocks > 0 {
            let mut s = self.pod.load.lock();
            s.queued_prefill_blocks = s.queued_prefill_blocks.saturating_sub(u64::from(self.queued_prefill_blocks));
            self.queued_prefill_blocks = 0;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Its end releases its prefill too: no separate prefill release is sent.
        drop(self.reservation.take());
        self.prefilled();
        let mut s = self.pod.load.lock();
        s.inflight = s.inflight.saturating_sub(1);
        if s.generation == self.generation {
            s.fresh = s.fresh.saturating_sub(1);
        }
        drop(s);
        metrics::gauge!(m::INFLIGHT, "pod" => self.pod.id.clone()).decrement(1.0);
    }
}

/// The pod table. Reads take a snapshot; changes bump a version that the scraper watches.
pub struct Fleet {
    pods: RwLock<BTreeMap<String, Arc<Pod>>>,
    picks: AtomicU64,
    version: watch::Sender<u64>,
    stale_after: Duration,
}

impl Fleet {
    pub fn new(stale_after: Duration) -> Fleet {
        Fleet {
            pods: RwLock::new(BTreeMap::new()),
            picks: AtomicU64::new(0),
            version: watch::channel(0).0,
            stale_after,
        }
    }

    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// Every entry, in id order.
    pub fn snapshot(&self) -> Vec<Arc<Pod>> {
        self.pods.read().values().cloned().collect()
    }

    /// The entry `id` (a pod's id, or a named rank's).
    pub fn get(&self, id: &str) -> Option<Arc<Pod>> {
        self.pods.read().get(id).cloned()
    }

    /// The entries a gateway's name for a pod covers: the entry of that id, and when it is
    /// the endpoint of ranks the router names, every rank there (the gateway knows the
    /// endpoint, not its ranks). A few map lookups: hints name up to every pod of a fleet.
    pub fn covered_by(&self, id: &str) -> Vec<Arc<Pod>> {
        let pods = self.pods.read();
        let Some(pod) = pods.get(id) else { return Vec::new() };
        match pod.dp {
            PodDp::Rank { ranks, .. } if pod.spec_id == id => {
                let ids = (0..ranks).map(|r| kvindex::wire::dp_pod_id(id, Some(i64::from(r))));
                ids.filter_map(|rank_id| pods.get(&rank_id).filter(|p| p.spec_id == id).cloned()).collect()
            }
            _ => vec![pod.clone()],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pods.read().is_empty()
    }

    /// Notified on every change of the table.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Adds or updates a configured pod from `source` (all its entries). Unchanged entries keep
    /// their load state. A pod a stronger source holds is refused
    /// ([`kvindex_discovery::precedence`]), and so is a spec any of whose ids another
    /// configured pod uses.
    pub fn upsert(&self, spec: &PodSpec, source: Source) -> Result<(), PodRefused> {
        let entries = Pod::entries(spec, source);
        {
            let mut pods = self.pods.write();
            let group: Vec<&Arc<Pod>> = pods.values().filter(|p| p.spec_id == spec.id).collect();
            if let Some(existing) = group.first() {
                if !precedence::may_replace(existing.source.origin(), source.origin()) {
                    return Err(PodRefused::Stronger { id: spec.id.clone(), owner: existing.source });
                }
                let unchanged =
                    group.len() == entries.len() && entries.iter().all(|e| group.iter().any(|p| p.same_as(e)));
                if unchanged {
                    return Ok(());
                }
            }
            let ids = entries.iter().map(|e| e.id.as_str()).chain(dp_rank_ids(&entries));
            for taken in ids {
                let other = pods.values().find(|p| p.spec_id != spec.id && pod_names(p).any(|id| id == taken));
                if let Some(other) = other {
                    return Err(PodRefused::IdTaken {
                        id: spec.id.clone(),
                        taken: taken.to_string(),
                        other: other.spec_id.clone(),
                    });
                }
            }
            pods.retain(|_, p| p.spec_id != spec.id);
            for entry in entries {
                pods.insert(entry.id.clone(), Arc::new(entry));
            }
        }
        self.changed();
        Ok(())
    }

    /// Removes a configured pod (all its entries) that `source` added; `Err` when another
    /// source owns it.
    pub fn remove(&self, id: &str, source: Source) -> Result<bool, PodRefused> {
        let removed = {
            let mut pods = self.pods.write();
            match pods.values().find(|p| p.spec_id == id) {
                None => false,
                Some(pod) if pod.source != source => {
                    return Err(PodRefused::NotOwner { id: id.to_string(), owner: pod.source });
                }
                Some(_) => {
                    pods.retain(|_, p| p.spec_id != id);
                    true
                }
            }
        };
        if removed {
            self.changed();
        }
        Ok(removed)
    }

    /// Makes `source`'s entries exactly those of `specs` (a re-read pods file). Ids owned by
    /// another source are skipped and returned.
    pub fn replace_source(&self, source: Source, specs: &[PodSpec]) -> Vec<String> {
        let mut refused = Vec::new();
        let ids: std::collections::HashSet<&str> = specs.iter().map(|s| s.id.as_str()).collect();
        let stale: std::collections::BTreeSet<String> = self
            .pods
            .read()
            .values()
            .filter(|p| p.source == source && !ids.contains(p.spec_id.as_str()))
            .map(|p| p.spec_id.clone())
            .collect();
        for id in stale {
            let _ = self.remove(&id, source);
        }
        for spec in specs {
            if let Err(e) = self.upsert(spec, source) {
                tracing::warn!(pod = %spec.id, error = %e, "pod entry refused");
                refused.push(spec.id.clone());
            }
        }
        refused
    }

    /// Marks `pod` chosen for a request now in flight that has `prefill_blocks` uncached
    /// prompt blocks to compute there (0 when it computes none there or nobody knows).
    pub fn begin(&self, pod: &Arc<Pod>, prefill_blocks: u32) -> InFlight {
        let tick = self.picks.fetch_add(1, Ordering::Relaxed) + 1;
        pod.last_picked.store(tick, Ordering::Relaxed);
        let generation = {
            let mut s = pod.load.lock();
            s.inflight += 1;
            s.fresh += 1;
            s.queued_prefill_blocks += u64::from(prefill_blocks);
            s.generation
        };
        metrics::gauge!(m::INFLIGHT, "pod" => pod.id.clone()).increment(1.0);
        InFlight { pod: pod.clone(), generation, queued_prefill_blocks: prefill_blocks, reservation: None }
    }

    fn changed(&self) {
        // Entries, not configured pods: a pod whose router-named ranks are entries counts each.
        let pods = self.pods.read();
        for role in [Role::Both, Role::Prefill, Role::Decode] {
            let n = pods.values().filter(|p| p.role == role).count();
            metrics::gauge!(m::PODS, "role" => role.label()).set(n as f64);
        }
        drop(pods);
        self.version.send_modify(|v| *v += 1);
    }
}

/// Every id an entry answers to in the indexer: its own, and for a balanced pod its ranks'.
fn pod_names(pod: &Pod) -> impl Iterator<Item = &str> {
    let ranks = match &pod.dp {
        PodDp::Balanced(ids) => ids.as_slice(),
        PodDp::Single | PodDp::Rank { .. } => &[],
    };
    std::iter::once(pod.id.as_str()).chain(ranks.iter().map(String::as_str))
}

/// The rank ids balanced entries answer to besides their own.
fn dp_rank_ids(entries: &[Pod]) -> impl Iterator<Item = &str> {
    entries.iter().flat_map(|e| pod_names(e).skip(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str) -> PodSpec {
        PodSpec::new(id, format!("http://{id}"), Role::Both)
    }

    #[test]
    fn fresh_requests_add_to_the_scrape_until_the_next_one() {
        let fleet = Fleet::new(Duration::from_secs(2));
        fleet.upsert(&spec("a:1"), Source::Static).unwrap();
        let pod = fleet.get("a:1").unwrap();
        let now = Instant::now();
        assert_eq!(pod.load(now, fleet.stale_after()).load, 0.0);
        let first = fleet.begin(&pod, 0);
        let second = fleet.begin(&pod, 0);
        assert_eq!(pod.load(now, fleet.stale_after()).load, 2.0, "no scrape yet: own in-flight");
        pod.scraped(EngineLoad { waiting: 1.0, running: 2.0, kv_usage: Some(0.5), kv_tokens: None, engines: 1 }, now);
        assert_eq!(pod.load(now, fleet.stale_after()).load, 3.0, "the scrape includes both");
        let third = fleet.begin(&pod, 0);
        assert_eq!(pod.load(now, fleet.stale_after()).load, 4.0);
        drop(first);
        assert_eq!(pod.load(now, fleet.stale_after()).load, 4.0, "an older request ending is the scrape's business");
        drop(third);
        assert_eq!(pod.load(now, fleet.stale_after()).load, 3.0);
        let later = now + Duration::from_secs(3);
        assert_eq!(pod.load(later, fleet.stale_after()).load, 1.0, "stale scrape: own in-flight only");
        drop(second);
        assert_eq!(pod.load(later, fleet.stale_after()).inflight, 0);
    }

    #[test]
    fn queued_prefill_lasts_until_the_first_byte_or_the_end_of_the_request_whatever_the_scrapes() {
        let fleet = Fleet::new(Duration::from_secs(2));
        fleet.upsert(&spec("a:1"), Source::Static).unwrap();
        let pod = fleet.get("a:1").unwrap();
        let queued = |pod: &Pod| pod.load(Instant::now(), fleet.stale_after()).queued_prefill_blocks;
        let mut first = fleet.begin(&pod, 60);
        let second = fleet.begin(&pod, 40);
        let _cached = fleet.begin(&pod, 0);
        assert_eq!(queued(&pod), 100);
        pod.scraped(
            EngineLoad { waiting: 0.0, running: 3.0, kv_usage: None, kv_tokens: None, engines: 1 },
            Instant::now(),
        );
        assert_eq!(queued(&pod), 100, "a scrape counts requests, not the prompt still to compute");
        first.prefilled();
        first.prefilled();
        assert_eq!(queued(&pod), 40, "released once, at the first byte");
        drop(first);
        assert_eq!(queued(&pod), 40);
        drop(second);
        assert_eq!(queued(&pod), 0, "a request that ends unanswered releases its own");
    }

    #[test]
    fn sources_own_their_entries() {
        let fleet = Fleet::new(Duration::from_secs(2));
        fleet.upsert(&spec("a:1"), Source::Static).unwrap();
        assert!(fleet.upsert(&spec("a:1"), Source::Registered).is_err());
        assert!(fleet.remove("a:1", Source::File).is_err());
        fleet.upsert(&spec("b:1"), Source::File).unwrap();
        fleet.upsert(&spec("c:1"), Source::File).unwrap();
        let refused = fleet.replace_source(Source::File, &[spec("c:1"), spec("a:1"), spec("d:1")]);
        assert_eq!(refused, ["a:1"]);
        let ids: Vec<String> = fleet.snapshot().iter().map(|p| p.id.clone()).collect();
        assert_eq!(ids, ["a:1", "c:1", "d:1"]);
        assert_eq!(fleet.get("a:1").unwrap().source, Source::Static);
    }

    #[test]
    fn the_pods_file_outranks_discovery_and_registration() {
        let fleet = Fleet::new(Duration::from_secs(2));
        fleet.upsert(&spec("f:1"), Source::File).unwrap();
        let refused = fleet.upsert(&spec("f:1"), Source::Discovered).unwrap_err();
        assert_eq!(refused.to_string(), "pod \"f:1\" is listed in the pods file and cannot be changed");
        assert!(fleet.upsert(&spec("f:1"), Source::Registered).is_err());
        assert_eq!(fleet.get("f:1").unwrap().source, Source::File);
        fleet.upsert(&spec("d:1"), Source::Discovered).unwrap();
        fleet.upsert(&spec("d:1"), Source::File).unwrap();
        assert_eq!(fleet.get("d:1").unwrap().source, Source::File, "the file takes over a discovered pod");
        fleet.upsert(&spec("r:1"), Source::Registered).unwrap();
        fleet.upsert(&spec("r:1"), Source::Discovered).unwrap();
        assert_eq!(fleet.get("r:1").unwrap().source, Source::Discovered, "discovery takes over a registration");
    }

    fn dp_spec(id: &str, dp_size: u32, dp_routing: DpRouting) -> PodSpec {
        PodSpec { dp_size, dp_routing, ..spec(id) }
    }

    fn ids(fleet: &Fleet) -> Vec<String> {
        fleet.snapshot().iter().map(|p| p.id.clone()).collect()
    }

    #[test]
    fn ranks_the_router_names_are_entries_of_their_own_and_ranks_the_engine_picks_one_entry() {
        let fleet = Fleet::new(Duration::from_secs(2));
        fleet.upsert(&dp_spec("h:30000", 2, DpRouting::Router), Source::Static).unwrap();
        fleet.upsert(&dp_spec("g:30000", 3, DpRouting::Engine), Source::File).unwrap();
        assert_eq!(ids(&fleet), ["g:30000", "h:30000", "h:30001"]);
        let rank1 = fleet.get("h:30001").unwrap();
        assert_eq!(
            (rank1.url.as_str(), rank1.spec_id.as_str(), &rank1.dp),
            ("http://h:30000", "h:30000", &PodDp::Rank { rank: 1, ranks: 2 })
        );
        assert_eq!(rank1.dp.named_rank(), Some(1));
        let balanced = fleet.get("g:30000").unwrap();
        assert_eq!(balanced.dp, PodDp::Balanced(vec!["g:30000".into(), "g:30001".into(), "g:30002".into()]));
        assert_eq!(balanced.dp.named_rank(), None);
        // A gateway names the endpoint: it covers every rank there.
        let covered: Vec<String> = fleet.covered_by("h:30000").iter().map(|p| p.id.clone()).collect();
        assert_eq!(covered, ["h:30000", "h:30001"]);
        // An unchanged spec keeps its entries (and their load); a changed one replaces them all.
        fleet.upsert(&dp_spec("h:30000", 2, DpRouting::Router), Source::Static).unwrap();
        assert!(Arc::ptr_eq(&rank1, &fleet.get("h:30001").unwrap()));
        fleet.replace_source(Source::File, &[dp_spec("g:30000", 2, DpRouting::Router)]);
        assert_eq!(ids(&fleet), ["g:30000", "g:30001", "h:30000", "h:30001"]);
        // Sources remove configured pods, all entries at once; a rank alone is no pod.
        assert_eq!(fleet.remove("h:30001", Source::Static), Ok(false));
        assert_eq!(fleet.remove("h:30000", Source::Static), Ok(true));
        fleet.replace_source(Source::File, &[]);
        assert!(fleet.is_empty());
    }

    #[test]
    fn a_pod_whose_ids_another_pod_uses_is_refused() {
        let fleet = Fleet::new(Duration::from_secs(2));
        fleet.upsert(&dp_spec("h:30000", 2, DpRouting::Router), Source::File).unwrap();
        fleet.upsert(&dp_spec("g:8000", 2, DpRouting::Engine), Source::File).unwrap();
        for (taken, other) in [("h:30001", "h:30000"), ("g:8001", "g:8000")] {
            let refused = fleet.upsert(&spec(taken), Source::Static).unwrap_err();
            let want = PodRefused::IdTaken { id: taken.into(), taken: taken.into(), other: other.into() };
            assert_eq!(refused, want);
        }
        // The other way round: ranks that would name pods already there.
        fleet.upsert(&spec("k:9001"), Source::Static).unwrap();
        for routing in [DpRouting::Router, DpRouting::Engine] {
            let refused = fleet.upsert(&dp_spec("k:9000", 2, routing), Source::File).unwrap_err();
            assert!(refused.to_string().contains("names \"k:9001\""), "{refused}");
        }
        assert_eq!(ids(&fleet), ["g:8000", "h:30000", "h:30001", "k:9001"]);
    }

    #[test]
    fn a_pod_whose_metrics_fail_becomes_unreachable_and_recovers_on_a_scrape() {
        let fleet = Fleet::new(Duration::from_secs(2));
        fleet.upsert(&spec("a:1"), Source::Static).unwrap();
        let pod = fleet.get("a:1").unwrap();
        for _ in 0..UNREACHABLE_AFTER {
            pod.scrape_failed();
        }
        let now = Instant::now();
        assert!(!pod.load(now, fleet.stale_after()).reachable);
        pod.scraped(EngineLoad::default(), now);
        assert!(pod.load(now, fleet.stale_after()).reachable);
    }
}
