//! The pods a request may go to, and each as the cost model and the decision see it: its load
//! now (scraped plus this router's own requests, or every router's requests as the indexer
//! counts their reservations, whichever is more), what the indexer said it holds, and its
//! rendezvous weight for the prompt. One place for both the scored path and the load-only one
//! (a request without a body at the endpoint picker), so they cannot drift apart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use kvindex_proto::kvindex::v1 as pb;

use super::cost::Candidate;
use super::decision::{combined, PodChoice, SharedLoad};
use super::rendezvous;
use crate::error::RouteError;
use crate::pods::fleet::{Fleet, Pod};

/// The pods to choose among: every pod, or those of `subset` (the gateway's hint) this router
/// knows. None: [`RouteError::NoEligiblePods`] when a subset named only unknown pods, else
/// [`RouteError::NoPods`].
pub fn eligible(fleet: &Fleet, subset: Option<&[String]>) -> Result<Vec<Arc<Pod>>, RouteError> {
    let pods: Vec<Arc<Pod>> = match subset {
        None => fleet.snapshot(),
        Some(allowed) => allowed.iter().filter_map(|id| fleet.get(id)).collect(),
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

/// The field of `pods` now, with the indexer's answer (`None`: placed by load, nothing held),
/// every router's reserved load (`None`: own counts only) and the prompt's rendezvous `key`.
pub fn gather(
    fleet: &Fleet,
    pods: &[Arc<Pod>],
    scores: Option<&pb::ScoreTokensResponse>,
    shared: Option<&pb::InFlight>,
    key: u64,
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
        let found = by_pod.get(pod.id.as_str());
        let matched = found.map_or(0, |p| p.matched_blocks);
        let speculative = found.map_or(0, |p| p.speculative_blocks);
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
            kv_blocks: load.kv_blocks,
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
            source_state: found.and_then(|p| state_label(p.state)),
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
            fleet
                .upsert(&PodSpec { id: id.to_string(), url: format!("http://{id}"), role: Role::Both }, Source::Static)
                .unwrap();
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
        let field = gather(&two, &pods, Some(&answer), None, 7);
        assert_eq!(field.candidates[0].matched_blocks, 0);
        assert_eq!((field.candidates[1].matched_blocks, field.candidates[1].speculative_blocks), (3, 5));
        assert_eq!(field.choices[1].source_state, Some("STALE"));
        assert_eq!(field.candidates[1].rendezvous, rendezvous::weight(7, "b:1"));
        let by_load = gather(&two, &pods, None, None, 0);
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
        let field = gather(&two, &pods, None, Some(&shared), 0);
        // a: the indexer lists no reservation (its own have not landed): own counts stand.
        assert_eq!((field.candidates[0].running, field.candidates[0].queued_prefill_blocks), (2.0, 30.0));
        assert_eq!(field.choices[0].shared, Some(SharedLoad::default()));
        // b: the other routers' three requests and their prefill.
        assert_eq!((field.candidates[1].running, field.candidates[1].queued_prefill_blocks), (3.0, 50.0));
        assert_eq!(field.choices[1].shared, Some(SharedLoad { requests: 3, prefill_blocks: 50 }));
        assert_eq!(field.choices[1].requests(), 3.0);
        // Without the shared view: own counts only, and nothing to show.
        let own = gather(&two, &pods, None, None, 0);
        assert_eq!((own.candidates[1].running, own.candidates[1].queued_prefill_blocks), (0.0, 0.0));
        assert!(own.choices.iter().all(|c| c.shared.is_none()));
    }
}
