//! The desired set of engine pods, kept from watch events, and the changes that bring a
//! consumer's set to it. Events follow kube-runtime's watcher: a (re-)list is `Init`, one
//! `InitApply` per listed pod, then `InitDone`; afterwards `Apply` and `Delete` per change. A
//! pod missing from a re-list was deleted while the watch was down, so it is removed at
//! `InitDone`.
//!
//! The consumer is told changes by pod id (`<podIP>:<http_port>`): a pod whose IP changed is a
//! removal of the old id and an addition of the new one, and a pod that stops being usable
//! (NotReady, not Running, terminating, deleted, bad data) is a removal. Removals come before
//! additions, so a consumer never holds two entries for one id. Two Kubernetes pods claiming
//! one id (host-network pods on one node) are resolved to the first by name; the other is
//! rejected (`duplicate_id`) until the id is free.

use std::collections::BTreeMap;

use crate::observe::{PodObservation, Rejection};
use crate::settings::Settings;
use crate::target::DiscoveredPod;

/// One event of the watch stream, over any pod representation `P`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent<P> {
    /// A (re-)list starts.
    Init,
    /// A pod of the list.
    InitApply(P),
    /// The list is complete: pods not in it are gone.
    InitDone,
    /// A pod was added or modified.
    Apply(P),
    /// A pod was deleted.
    Delete(P),
}

/// A change a consumer applies to its set of pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Subscribe to / route to this pod (an id the consumer does not hold).
    Add(DiscoveredPod),
    /// Remove this pod and clear everything held for it (an id the consumer holds).
    Remove(DiscoveredPod),
}

/// What one event did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub changes: Vec<Change>,
    /// Pods whose data could not be used (count and log them).
    pub rejections: Vec<Rejection>,
    /// This event completed a (re-)list: the set now reflects the whole namespace.
    pub synced: bool,
}

/// The discovered pods, and what the consumer was last told.
#[derive(Debug, Clone)]
pub struct DesiredSet {
    settings: Settings,
    /// Usable pods by Kubernetes name.
    usable: BTreeMap<String, DiscoveredPod>,
    /// During a re-list: the usable pods listed so far.
    relist: Option<BTreeMap<String, DiscoveredPod>>,
    /// What the consumer holds, by pod id.
    emitted: BTreeMap<String, DiscoveredPod>,
    synced_once: bool,
}

impl DesiredSet {
    pub fn new(settings: Settings) -> Self {
        DesiredSet { settings, usable: BTreeMap::new(), relist: None, emitted: BTreeMap::new(), synced_once: false }
    }

    /// The pods the consumer holds, by pod id.
    pub fn pods(&self) -> &BTreeMap<String, DiscoveredPod> {
        &self.emitted
    }

    /// Whether a list has completed at least once.
    pub fn synced_once(&self) -> bool {
        self.synced_once
    }

    /// Applies one watch event.
    pub fn apply(&mut self, event: WatchEvent<PodObservation>) -> Outcome {
        let mut outcome = Outcome::default();
        match event {
            WatchEvent::Init => {
                self.relist = Some(BTreeMap::new());
                return outcome;
            }
            WatchEvent::InitApply(pod) => {
                let usable = self.classify(&pod, &mut outcome);
                let relist = self.relist.get_or_insert_with(BTreeMap::new);
                if let Some(usable) = usable {
                    relist.insert(pod.name, usable);
                }
                return outcome;
            }
            WatchEvent::InitDone => {
                self.usable = self.relist.take().unwrap_or_default();
                self.synced_once = true;
                outcome.synced = true;
            }
            WatchEvent::Apply(pod) => {
                let usable = self.classify(&pod, &mut outcome);
                for set in [Some(&mut self.usable), self.relist.as_mut()].into_iter().flatten() {
                    match &usable {
                        Some(u) => set.insert(pod.name.clone(), u.clone()),
                        None => set.remove(&pod.name),
                    };
                }
            }
            WatchEvent::Delete(pod) => {
                self.usable.remove(&pod.name);
                if let Some(relist) = self.relist.as_mut() {
                    relist.remove(&pod.name);
                }
            }
        }
        if self.relist.is_none() {
            self.reconcile(&mut outcome);
        }
        outcome
    }

    fn classify(&self, pod: &PodObservation, outcome: &mut Outcome) -> Option<DiscoveredPod> {
        match pod.classify(&self.settings) {
            Ok(usable) => usable,
            Err(rejection) => {
                outcome.rejections.push(rejection);
                None
            }
        }
    }

    /// Diffs the usable pods (one per id, first by name) against what was emitted.
    fn reconcile(&mut self, outcome: &mut Outcome) {
        let mut desired: BTreeMap<String, DiscoveredPod> = BTreeMap::new();
        for pod in self.usable.values() {
            let id = pod.pod_id();
            match desired.get(&id) {
                Some(first) => outcome.rejections.push(Rejection {
                    pod: pod.name.clone(),
                    reason: "duplicate_id",
                    detail: format!("pod id {id} is already {}'s", first.name),
                }),
                None => {
                    desired.insert(id, pod.clone());
                }
            }
        }
        let removed: Vec<String> =
            self.emitted.iter().filter(|(id, old)| desired.get(*id) != Some(old)).map(|(id, _)| id.clone()).collect();
        for id in removed {
            if let Some(old) = self.emitted.remove(&id) {
                outcome.changes.push(Change::Remove(old));
            }
        }
        for (id, pod) in desired {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.emitted.entry(id) {
                slot.insert(pod.clone());
                outcome.changes.push(Change::Add(pod));
            }
        }
    }
}
