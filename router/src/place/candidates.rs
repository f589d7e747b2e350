//! The pods a request may go to, and each as the cost model and the decision see it: its load
//! now (scraped plus this router's own requests, or every router's requests as the indexer
//! counts their reservations, whichever is more), what the indexer said it holds, and its
//! rendezvous weight for the prompt. One place for both the scored path and the load-only one
//! (a request without a body at the endpoint picker), so they cannot drift apart.
//!
//! A pod whose engine picks among its data-parallel ranks is credited what every rank holds
//! ([`balanced`]): the least any rank matched, and the least any rank holds or was credited.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use kvindex_proto::kvindex::v1 as pb;

use super::cost::Candidate;
use super::decision::{combined, CreditUnit, PodChoice, SharedLoad};
use super::rendezvous;
use crate::error::RouteError;
use crate::pods::fleet::{Fleet, Pod, PodDp};

/// The pods to choose among: every pod, or those of `subset` (the gateway's hint) this router
/// knows (a hint naming a pod whose ranks the router names covers every rank). None:
/// [`RouteError::NoEligiblePods`] when a subset named only unknown pods, else
/// [`RouteError::NoPods`].
pub fn eligible(fleet: &Fleet, subset: Option<&[String]>) -> Result<Vec<Arc<Pod>>, RouteError> {
    let pods: Vec<Arc<Pod>> = match subset {
        None => fleet.snapshot(),
        Some(allowed) => {
            let mut pods: Vec<Arc<Pod>> = allowed.iter().flat_map(|id| fleet.covered_by(id)).collect();
            pods.sort_by(|a, b| a.id.cmp(&b.id));
            pods.dedup_by(|a, b| a.id == b.id);
            pods
        }
    };
    if pods.is_empty() {
        return Err(if subset.is_some() && !fleet.is_empty() {
            RouteError::NoEligiblePods
        } else {
            RouteError::NoPods
        });
    }
    Ok(pods)
}

/// Every eligible pod twice over, index for index: as the cost model reads it, and as the
/// decision explains it (its cost still to fill in).
pub struct Field {
    pub candidates: Vec<Candidate>,
    pub choices: Vec<PodChoice>,
}

/// What the indexer said one entry holds: exact matched blocks, speculative credit, the state
/// of the stream they came from, and the unit its engine reuses.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Held {
    matched: u32,
    speculative: u32,
    state: Option<&'static str>,
    unit: CreditUnit,
}

impl Held {
    fn of(score: Option<&&pb::PodScore>) -> Held {
        score.map_or(Held::default(), |p| Held {
            matched: p.matched_blocks,
            speculative: p.speculative_blocks,
            state: state_label(p.state),
            unit: CreditUnit { tokens: p.credit_unit_tokens, eagle: p.eagle },
        })
    }
}

/// The indexer's ids of the ranks an entry's engine picks among, when the engine picks: a
/// balanced pod's ranks; or, for a pod whose `/metrics` showed `engines` data-parallel engines
/// behind its URL though it was configured as one, one id per engine by the indexer's DP naming
/// (so an engine nobody declared data-parallel is credited what every rank holds, not its rank
/// 0's blocks, from its first scrape on). `None`: the entry is served where it is sent.
pub fn balancer_ranks(pod: &Pod, engines: u32) -> Option<Cow<'_, [String]>> {
    let named = |count: u32| (0..count).map(|r| kvindex::wire::dp_pod_id(&pod.id, Some(i64::from(r)))).collect();
    match &pod.dp {
        PodDp::Rank { .. } => None,
        PodDp::Balanced(ranks) if ranks.len() >= engines as usize => Some(Cow::Borrowed(ranks)),
        PodDp::Balanced(_) => Some(Cow::Owned(named(engines))),
        PodDp::Single if engines > 1 => Some(Cow::Owned(named(engines))),
        PodDp::Single => None,
    }
}

/// A pod whose engine's balancer picks among `ranks` (the indexer's ids of its ranks): any
/// rank may serve the request, so the pod is credited what every rank holds, never more: the
/// least matched, and a speculative credit only where every rank holds or was credited past
/// that (the least of each rank's larger of the two). A rank the indexer did not name holds
/// nothing. The state is the state of a rank holding the least; the unit is one every rank's
/// engine reuses whole (the least common multiple of theirs, EAGLE if any rank runs it).
fn balanced(ranks: &[String], by_pod: &HashMap<&str, &pb::PodScore>) -> Held {
    let held: Vec<Held> = ranks.iter().map(|id| Held::of(by_pod.get(id.as_str()))).collect();
    let Some(least) = held.iter().min_by_key(|h| h.matched).copied() else { return Held::default() };
    let credited = held.iter().map(|h| h.matched.max(h.speculative)).min().unwrap_or(0);
    let unit = held.iter().fold(CreditUnit::default(), |u, h| CreditUnit {
        tokens: kvindex::index::units::lcm(u.tokens, h.unit.tokens),
        eagle: u.eagle || h.unit.eagle,
    });
    Held { speculative: if credited > least.matched { credited } else { 0 }, unit, ..least }
}

/// The field of `pods` now, with the indexer's answer (`None`: placed by load, nothing held),
/// every router's reserved load (`None`: own counts only), the prompt's rendezvous `key`, and
/// the block size of the indexer's answer (the unit a pod's
/// KV capacity, reported in tokens, is counted in against `--kv-reference-blocks`).
pub fn gather(
    fleet: &Fleet,
    pods: &[Arc<Pod>],
    scores: Option<&pb::ScoreTokensResponse>,
    shared: Option<&pb::InFlight>,
    key: u64,
    block_size: usize,
) -> Field {
    let by_pod: HashMap<&str, &pb::PodScore> =
        scores.iter().flat_map(|r| r.scores.iter()).map(|p| (p.pod.as_str(), p)).collect();
    let shared_by_pod: HashMap<&str, &pb::PodInFlight> =
        shared.iter().flat_map(|s| s.pods.iter()).map(|p| (p.pod.as_str(), p)).collect();
    let now = Instant::now();
    let stale = fleet.stale_after();
    let mut candidates: Vec<Candidate> = Vec::with_capacity(pods.len());
    let mut choices: Vec<PodChoice> = Vec::with_capacity(pods.len());
    for pod in pods {
        let load = pod.load(now, stale);
        let held = match balancer_ranks(pod, load.engines) {
            Some(ranks) => balanced(&ranks, &by_pod),
            None => Held::of(by_pod.get(pod.id.as_str())),
        };
        let (matched, speculative) = (held.matched, held.speculative);
        // A pod the indexer lists no reservation for has none (when it answers at all).
        let shared = shared.map(|_| {
            shared_by_pod.get(pod.id.as_str()).map_or(SharedLoad::default(), |p| SharedLoad {
                requests: p.requests,
                prefill_blocks: p.prefill_blocks,
            })
        });
        let (requests, queued_prefill_blocks) = combined(&load, shared);
        candidates.push(Candidate {
            matched_blocks: matched,
            speculative_blocks: speculative,
            queued_prefill_blocks: queued_prefill_blocks as f64,
            running: requests - load.waiting.unwrap_or(0.0),
            waiting: load.waiting.unwrap_or(0.0),
            kv_usage: load.kv_usage,
            kv_blocks: load.kv_tokens.map(|tokens| tokens / block_size.max(1) as u64),
            reachable: load.reachable,
            last_picked: pod.last_picked(),
            rendezvous: rendezvous::weight(key, &pod.id),
        });
        choices.push(PodChoice {
            pod: pod.id.clone(),
            role: pod.role,
            matched_blocks: matched,
            speculative_blocks: speculative,
            cached_blocks: 0,
            source_state: held.state,
            credit_unit: held.unit,
            cost: 0.0,
            kv_weight: 0.0,
            kv_cost: 0.0,
            over_kv_cutoff: false,
            in_band: false,
            load,
            shared,
            handle: Some(pod.clone()),
        });
    }
    Field { candidates, choices }
}

fn state_label(state: i32) -> Option<&'static str> {
    match pb::SourceState::try_from(state).ok()? {
        pb::SourceState::Exact => Some("EXACT"),
        pb::SourceState::Degraded => Some("DEGRADED"),
        pb::SourceState::Stale => Some("STALE"),
        pb::SourceState::Unspecified => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pods::fleet::Source;
    use crate::pods::spec::{PodSpec, Role};

    fn fleet(ids: &[&str]) -> Fleet {
        let fleet = Fleet::new(Duration::from_secs(2));
        for id in ids {
            fleet.upsert(&PodSpec::new(*id, format!("http://{id}"), Role::Both), Source::Static).unwrap();
        }
        fleet
    }

    #[test]
    fn a_subset_keeps_the_known_pods_and_says_why_when_none_is_left() {
        let two = fleet(&["a:1", "b:1"]);
        let ids = |pods: Vec<Arc<Pod>>| pods.iter().map(|p| p.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(eligible(&two, None).unwrap()), ["a:1", "b:1"]);
        assert_eq!(ids(eligible(&two, Some(&["b:1".into(), "z:1".into()])).unwrap()), ["b:1"]);
        assert_eq!(eligible(&two, Some(&["z:1".into()])).unwrap_err(), RouteError::NoEligiblePods);
        assert_eq!(eligible(&fleet(&[]), Some(&["z:1".into()])).unwrap_err(), RouteError::NoPods);
        assert_eq!(eligible(&fleet(&[]), None).unwrap_err(), RouteError::NoPods);
    }

    #[test]
    fn what_the_indexer_said_lands_on_its_pod_and_only_there() {
        let two = fleet(&["a:1", "b:1"]);
        let pods = eligible(&two, None).unwrap();
        let answer = pb::ScoreTokensResponse {
            scores: vec![pb::PodScore {
                pod: "b:1".into(),
                matched_blocks: 3,
                speculative_blocks: 5,
                state: pb::SourceState::Stale as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let field = gather(&two, &pods, Some(&answer), None, 7, 16);
        assert_eq!(field.candidates[0].matched_blocks, 0);
        assert_eq!((field.candidates[1].matched_blocks, field.candidates[1].speculative_blocks), (3, 5));
        assert_eq!(field.choices[1].source_state, Some("STALE"));
        assert_eq!(field.candidates[1].rendezvous, rendezvous::weight(7, "b:1"));
        let by_load = gather(&two, &pods, None, None, 0, 16);
        assert!(by_load.candidates.iter().all(|c| c.matched_blocks == 0 && c.speculative_blocks == 0));
        assert!(by_load.choices.iter().all(|c| c.source_state.is_none()));
    }

    #[test]
    fn every_routers_reservations_raise_the_load_and_never_lower_it() {
        let two = fleet(&["a:1", "b:1"]);
        let pods = eligible(&two, None).unwrap();
        let a = two.get("a:1").unwrap();
        // This router: two requests on a, one with 30 blocks still to prefill; no scrape yet.
        let _first = two.begin(&a, 30);
        let _second = two.begin(&a, 0);
        let shared =
            pb::InFlight { pods: vec![pb::PodInFlight { pod: "b:1".into(), requests: 3, prefill_blocks: 50 }] };
        let field = gather(&two, &pods, None, Some(&shared), 0, 16);
        // a: the indexer lists no reservation (its own have not landed): own counts stand.
        assert_eq!((field.candidates[0].running, field.candidates[0].queued_prefill_blocks), (2.0, 30.0));
        assert_eq!(field.choices[0].shared, Some(SharedLoad::default()));
        // b: the other routers' three requests and their prefill.
        assert_eq!((field.candidates[1].running, field.candidates[1].queued_prefill_blocks), (3.0, 50.0));
        assert_eq!(field.choices[1].shared, Some(SharedLoad { requests: 3, prefill_blocks: 50 }));
        assert_eq!(field.choices[1].requests(), 3.0);
        // Without the shared view: own counts only, and nothing to show.
        let own = gather(&two, &pods, None, None, 0, 16);
        assert_eq!((own.candidates[1].running, own.candidates[1].queued_prefill_blocks), (0.0, 0.0));
        assert!(own.choices.iter().all(|c| c.shared.is_none()));
    }

    fn score(pod: &str, matched: u32, speculative: u32) -> pb::PodScore {
        pb::PodScore { pod: pod.into(), matched_blocks: matched, speculative_blocks: speculative, ..Default::default() }
    }

    #[test]
    fn a_pod_whose_engine_picks_the_rank_is_credited_what_every_rank_holds() {
        let fleet = Fleet::new(Duration::from_secs(2));
        let spec = PodSpec { dp_size: 3, ..PodSpec::new("h:30000", "http://h:30000", Role::Both) };
        fleet.upsert(&spec, Source::Static).unwrap();
        let pods = eligible(&fleet, None).unwrap();
        let held = |scores: Vec<pb::PodScore>| {
            let answer = pb::ScoreTokensResponse { scores, ..Default::default() };
            let c = gather(&fleet, &pods, Some(&answer), None, 0, 16).candidates[0];
            (c.matched_blocks, c.speculative_blocks)
        };
        assert_eq!(held(vec![score("h:30000", 5, 0), score("h:30001", 3, 0), score("h:30002", 4, 0)]), (3, 0));
        assert_eq!(held(vec![score("h:30000", 5, 0), score("h:30001", 3, 0)]), (0, 0), "rank 2 holds nothing");
        // Speculative credit counts where every rank holds or was credited past the least.
        let scores = vec![score("h:30000", 5, 0), score("h:30001", 3, 6), score("h:30002", 4, 7)];
        assert_eq!(held(scores), (3, 5));
        let scores = vec![score("h:30000", 3, 0), score("h:30001", 3, 0), score("h:30002", 3, 9)];
        assert_eq!(held(scores), (3, 0));
        // Any rank may serve: the prediction is cut in a unit every rank's engine reuses whole.
        let unit = |pod: &str, tokens: u32, eagle: bool| pb::PodScore {
            credit_unit_tokens: tokens,
            eagle,
            ..score(pod, 12, 0)
        };
        let scores = vec![unit("h:30000", 64, false), unit("h:30001", 48, true), unit("h:30002", 16, false)];
        let answer = pb::ScoreTokensResponse { scores, ..Default::default() };
        let choice = &gather(&fleet, &pods, Some(&answer), None, 0, 16).choices[0];
        assert_eq!(choice.credit_unit, CreditUnit { tokens: 192, eagle: true });
    }

    #[test]
    fn a_pod_given_as_one_whose_metrics_show_several_engines_is_credited_what_every_engine_holds() {
        let fleet = fleet(&["h:30000"]);
        let pods = eligible(&fleet, None).unwrap();
        let answer = pb::ScoreTokensResponse { scores: vec![score("h:30000", 5, 0)], ..Default::default() };
        let matched = || gather(&fleet, &pods, Some(&answer), None, 0, 16).candidates[0].matched_blocks;
        assert_eq!(matched(), 5, "until its /metrics says otherwise, one engine");
        let load = crate::pods::engine_load::EngineLoad { engines: 2, ..Default::default() };
        pods[0].scraped(load, Instant::now());
        assert_eq!(matched(), 0, "rank 1 (h:30001) holds nothing");
        assert_eq!(balancer_ranks(&pods[0], 2).unwrap().as_ref(), ["h:30000", "h:30001"]);
    }

    #[test]
    fn capacity_in_tokens_is_counted_in_blocks_of_the_indexers_size() {
        let fleet = fleet(&["a:1"]);
        let pods = eligible(&fleet, None).unwrap();
        let load = crate::pods::engine_load::EngineLoad { kv_tokens: Some(20_480), ..Default::default() };
        pods[0].scraped(load, Instant::now());
        assert_eq!(gather(&fleet, &pods, None, None, 0, 16).candidates[0].kv_blocks, Some(1280));
        assert_eq!(gather(&fleet, &pods, None, None, 0, 64).candidates[0].kv_blocks, Some(320));
    }
}
