//! The watch-event → pod-set logic, without a cluster: add, ready, not-ready, delete, IP
//! change, DP ranks, re-list, and (proptest) that any event sequence leaves the consumer
//! holding exactly the usable pods, told by changes that never add a held id nor remove an
//! unheld one.

use std::collections::{BTreeMap, BTreeSet};

use kvindex_discovery::settings::{DP_SIZE_ANNOTATION, MODEL_ANNOTATION};
use kvindex_discovery::{Change, DesiredSet, PodObservation, Settings, WatchEvent};
use proptest::prelude::*;

fn pod(name: &str, ip: &str) -> PodObservation {
    PodObservation {
        name: format!("ns/{name}"),
        phase: Some("Running".into()),
        ready: true,
        terminating: false,
        ip: Some(ip.into()),
        annotations: BTreeMap::new(),
    }
}

fn not_ready(p: PodObservation) -> PodObservation {
    PodObservation { ready: false, ..p }
}

/// The changes of an outcome as `+id` / `-id`.
fn ids(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match c {
            Change::Add(p) => format!("+{}", p.pod_id()),
            Change::Remove(p) => format!("-{}", p.pod_id()),
        })
        .collect()
}

/// A set that has listed `pods` (a first, empty-or-not list).
fn listed(settings: Settings, pods: &[PodObservation]) -> (DesiredSet, Vec<String>) {
    let mut set = DesiredSet::new(settings);
    assert!(set.apply(WatchEvent::Init).changes.is_empty());
    for p in pods {
        assert!(set.apply(WatchEvent::InitApply(p.clone())).changes.is_empty(), "nothing before InitDone");
    }
    let done = set.apply(WatchEvent::InitDone);
    assert!(done.synced);
    (set, ids(&done.changes))
}

#[test]
fn the_first_list_adds_every_usable_pod_at_once() {
    let (set, changes) =
        listed(Settings::default(), &[pod("a", "10.0.0.1"), not_ready(pod("b", "10.0.0.2")), pod("c", "10.0.0.3")]);
    assert_eq!(changes, ["+10.0.0.1:8000", "+10.0.0.3:8000"]);
    assert!(set.synced_once());
    assert_eq!(set.pods().keys().collect::<Vec<_>>(), ["10.0.0.1:8000", "10.0.0.3:8000"]);
}

#[test]
fn a_pod_is_added_when_it_becomes_ready_and_removed_when_it_stops() {
    let (mut set, _) = listed(Settings::default(), &[]);
    // Created: Pending, no IP yet.
    let pending = PodObservation { phase: Some("Pending".into()), ready: false, ip: None, ..pod("a", "") };
    assert!(set.apply(WatchEvent::Apply(pending)).changes.is_empty());
    // Running with an IP, not Ready yet (model loading).
    assert!(set.apply(WatchEvent::Apply(not_ready(pod("a", "10.0.0.1")))).changes.is_empty());
    let ready = set.apply(WatchEvent::Apply(pod("a", "10.0.0.1")));
    assert_eq!(ids(&ready.changes), ["+10.0.0.1:8000"]);
    // A status update that changes nothing discovery uses: no change.
    assert!(set.apply(WatchEvent::Apply(pod("a", "10.0.0.1"))).changes.is_empty());
    let gone = set.apply(WatchEvent::Apply(not_ready(pod("a", "10.0.0.1"))));
    assert_eq!(ids(&gone.changes), ["-10.0.0.1:8000"]);
    assert_eq!(ids(&set.apply(WatchEvent::Apply(pod("a", "10.0.0.1"))).changes), ["+10.0.0.1:8000"]);
    let terminating = PodObservation { terminating: true, ..pod("a", "10.0.0.1") };
    assert_eq!(ids(&set.apply(WatchEvent::Apply(terminating)).changes), ["-10.0.0.1:8000"], "terminating");
    assert!(set.apply(WatchEvent::Delete(pod("a", "10.0.0.1"))).changes.is_empty(), "already removed");
}

#[test]
fn deletion_removes_a_ready_pod() {
    let (mut set, _) = listed(Settings::default(), &[pod("a", "10.0.0.1"), pod("b", "10.0.0.2")]);
    assert_eq!(ids(&set.apply(WatchEvent::Delete(pod("a", "10.0.0.1"))).changes), ["-10.0.0.1:8000"]);
    assert_eq!(set.pods().len(), 1);
    assert!(set.apply(WatchEvent::Delete(pod("zz", "10.9.9.9"))).changes.is_empty(), "unknown pod");
}

#[test]
fn an_ip_change_removes_the_old_id_before_adding_the_new() {
    let (mut set, _) = listed(Settings::default(), &[pod("a", "10.0.0.1")]);
    let moved = set.apply(WatchEvent::Apply(pod("a", "10.0.0.9")));
    assert_eq!(ids(&moved.changes), ["-10.0.0.1:8000", "+10.0.0.9:8000"]);
    let Change::Remove(old) = &moved.changes[0] else { panic!() };
    assert_eq!(old.ip.to_string(), "10.0.0.1", "the removal names the old IP, whose blocks are cleared");
}

#[test]
fn a_changed_model_or_dp_size_re_adds_the_pod() {
    let (mut set, _) = listed(Settings::default(), &[pod("a", "10.0.0.1")]);
    let mut annotated = pod("a", "10.0.0.1");
    annotated.annotations.insert(DP_SIZE_ANNOTATION.into(), "2".into());
    assert_eq!(ids(&set.apply(WatchEvent::Apply(annotated.clone())).changes), ["-10.0.0.1:8000", "+10.0.0.1:8000"]);
    annotated.annotations.insert(MODEL_ANNOTATION.into(), "m2".into());
    let changed = set.apply(WatchEvent::Apply(annotated));
    assert_eq!(ids(&changed.changes), ["-10.0.0.1:8000", "+10.0.0.1:8000"]);
    let Change::Add(new) = &changed.changes[1] else { panic!() };
    assert_eq!((new.dp_size, new.model.as_deref()), (2, Some("m2")));
}

#[test]
fn dp_ranks_come_from_the_annotation_or_the_configured_count() {
    let settings = Settings { dp_size: 2, ..Settings::default() };
    let mut four = pod("b", "10.0.0.2");
    four.annotations.insert(DP_SIZE_ANNOTATION.into(), "4".into());
    let (set, _) = listed(settings, &[pod("a", "10.0.0.1"), four]);
    let a = &set.pods()["10.0.0.1:8000"];
    let b = &set.pods()["10.0.0.2:8000"];
    assert_eq!((a.dp_size, b.dp_size), (2, 4));
    let ranks: Vec<(String, String, Option<String>)> =
        (0..b.dp_size).map(|r| (b.rank_pod_id(r), b.pub_endpoint(r), b.replay_endpoint(r))).collect();
    assert_eq!(ranks[3], ("10.0.0.2:8003".into(), "tcp://10.0.0.2:5560".into(), Some("tcp://10.0.0.2:5561".into())));
}

#[test]
fn a_bad_annotation_or_missing_ip_is_rejected_and_removes_the_pod() {
    let (mut set, _) = listed(Settings::default(), &[pod("a", "10.0.0.1")]);
    let mut bad = pod("a", "10.0.0.1");
    bad.annotations.insert(DP_SIZE_ANNOTATION.into(), "lots".into());
    let outcome = set.apply(WatchEvent::Apply(bad));
    assert_eq!(ids(&outcome.changes), ["-10.0.0.1:8000"]);
    assert_eq!(outcome.rejections[0].reason, "bad_dp_size");
    let no_ip = PodObservation { ip: None, ..pod("b", "") };
    let outcome = set.apply(WatchEvent::Apply(no_ip));
    assert_eq!((outcome.changes.len(), outcome.rejections[0].reason), (0, "missing_ip"));
}

#[test]
fn a_relist_removes_pods_deleted_while_the_watch_was_down() {
    let (mut set, _) = listed(Settings::default(), &[pod("a", "10.0.0.1"), pod("b", "10.0.0.2"), pod("c", "10.0.0.3")]);
    // The watch restarts: b was deleted, c went NotReady and a changed IP meanwhile; d is new.
    assert!(set.apply(WatchEvent::Init).changes.is_empty());
    for p in [pod("a", "10.0.0.11"), not_ready(pod("c", "10.0.0.3")), pod("d", "10.0.0.4")] {
        assert!(set.apply(WatchEvent::InitApply(p)).changes.is_empty());
    }
    assert_eq!(set.pods().len(), 3, "the old set stays in force until the list is complete");
    let done = set.apply(WatchEvent::InitDone);
    assert_eq!(
        ids(&done.changes),
        ["-10.0.0.1:8000", "-10.0.0.2:8000", "-10.0.0.3:8000", "+10.0.0.11:8000", "+10.0.0.4:8000"]
    );
    // A re-list that is interrupted and started again starts from scratch.
    set.apply(WatchEvent::Init);
    set.apply(WatchEvent::InitApply(pod("x", "10.0.0.99")));
    set.apply(WatchEvent::Init);
    let done = set.apply(WatchEvent::InitDone);
    assert_eq!(ids(&done.changes), ["-10.0.0.11:8000", "-10.0.0.4:8000"], "x was not in the completed list");
}

#[test]
fn two_pods_claiming_one_id_resolve_to_the_first_by_name() {
    let (mut set, changes) = listed(Settings::default(), &[pod("b", "10.0.0.1"), pod("a", "10.0.0.1")]);
    assert_eq!(changes, ["+10.0.0.1:8000"]);
    assert_eq!(set.pods()["10.0.0.1:8000"].name, "ns/a");
    let outcome = set.apply(WatchEvent::Delete(pod("a", "10.0.0.1")));
    assert_eq!(ids(&outcome.changes), ["-10.0.0.1:8000", "+10.0.0.1:8000"], "b takes the id over, cleared first");
    assert_eq!(set.pods()["10.0.0.1:8000"].name, "ns/b");
}

// --- property: any event sequence ---

#[derive(Debug, Clone)]
enum Step {
    Apply { name: u8, ip: u8, ready: bool, running: bool, dp: u8 },
    Delete { name: u8 },
    Relist { keep: Vec<bool> },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..5u8, 0..4u8, any::<bool>(), any::<bool>(), 0..4u8)
            .prop_map(|(name, ip, ready, running, dp)| Step::Apply { name, ip, ready, running, dp }),
        2 => (0..5u8).prop_map(|name| Step::Delete { name }),
        1 => proptest::collection::vec(any::<bool>(), 5).prop_map(|keep| Step::Relist { keep }),
    ]
}

fn observation(name: u8, ip: u8, ready: bool, running: bool, dp: u8) -> PodObservation {
    let mut p = pod(&format!("p{name}"), &format!("10.0.0.{ip}"));
    p.ready = ready;
    p.phase = Some(if running { "Running" } else { "Pending" }.into());
    if dp > 0 {
        // dp 3 is out of range for the test's settings: a rejected annotation.
        p.annotations.insert(DP_SIZE_ANNOTATION.into(), if dp == 3 { "0".into() } else { dp.to_string() });
    }
    p
}

proptest! {
    #[test]
    fn consumers_hold_exactly_the_usable_pods(steps in proptest::collection::vec(step(), 1..60)) {
        let mut set = DesiredSet::new(Settings::default());
        // The cluster as the API server sees it, and the consumer as told by changes.
        let mut cluster: BTreeMap<String, PodObservation> = BTreeMap::new();
        let mut held: BTreeMap<String, String> = BTreeMap::new(); // pod id -> k8s name
        let tell = |changes: &[Change], held: &mut BTreeMap<String, String>| {
            for c in changes {
                match c {
                    Change::Remove(p) => prop_assert_eq!(held.remove(&p.pod_id()), Some(p.name.clone()), "removes a held id"),
                    Change::Add(p) => prop_assert!(held.insert(p.pod_id(), p.name.clone()).is_none(), "adds an unheld id"),
                }
            }
            Ok(())
        };
        let first = std::iter::once(WatchEvent::Init).chain(std::iter::once(WatchEvent::InitDone));
        for e in first {
            let o = set.apply(e);
            tell(&o.changes, &mut held)?;
        }
        for s in steps {
            match s {
                Step::Apply { name, ip, ready, running, dp } => {
                    let p = observation(name, ip, ready, running, dp);
                    cluster.insert(p.name.clone(), p.clone());
                    tell(&set.apply(WatchEvent::Apply(p)).changes, &mut held)?;
                }
                Step::Delete { name } => {
                    if let Some(p) = cluster.remove(&format!("ns/p{name}")) {
                        tell(&set.apply(WatchEvent::Delete(p)).changes, &mut held)?;
                    }
                }
                Step::Relist { keep } => {
                    // Pods deleted while the watch was down are missing from the list.
                    let names: Vec<String> = cluster.keys().cloned().collect();
                    for (i, n) in names.iter().enumerate() {
                        if !keep[i % keep.len()] {
                            cluster.remove(n);
                        }
                    }
                    tell(&set.apply(WatchEvent::Init).changes, &mut held)?;
                    for p in cluster.values() {
                        tell(&set.apply(WatchEvent::InitApply(p.clone())).changes, &mut held)?;
                    }
                    tell(&set.apply(WatchEvent::InitDone).changes, &mut held)?;
                }
            }
            // The reference: serving pods with valid data, one per id, first by name.
            let mut expected: BTreeMap<String, String> = BTreeMap::new();
            for p in cluster.values() {
                let dp_ok = p.annotations.get(DP_SIZE_ANNOTATION).is_none_or(|v| v != "0");
                if p.ready && p.phase.as_deref() == Some("Running") && dp_ok {
                    expected.entry(format!("{}:8000", p.ip.as_deref().unwrap())).or_insert_with(|| p.name.clone());
                }
            }
            prop_assert_eq!(&held, &expected);
            let ids: BTreeSet<&String> = set.pods().keys().collect();
            prop_assert_eq!(ids, held.keys().collect::<BTreeSet<_>>());
        }
    }
}
