//! Holds a new pod back from the consumer while its engine is probed, so the consumer is told
//! each pod once, already as what it is (an SGLang pod is never first subscribed as vLLM, then
//! cleared and subscribed again). Pure: the watcher starts and cancels the probes it is asked
//! to and reports each result; a probe is bounded in time, so a pod is held at most that long,
//! and other pods pass meanwhile.
//!
//! The consumer's rules still hold: a pod is added once and removed only once added. A pod
//! removed while held was never told, so its removal is dropped (and its probe cancelled); a
//! removal of a probed pod names the pod as it was told (its probed DP size and ports). A
//! completed list is passed on once the pods held at that moment are told (or gone), so a
//! consumer's readiness still means "every discovered pod is in place".

use std::collections::{BTreeMap, BTreeSet};

use crate::desired::{Change, Outcome};
use crate::server_info::EngineDescriptor;
use crate::target::DiscoveredPod;

/// A probe to start: report its result with [`ProbeGate::finish`] and this token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeRequest {
    pub token: u64,
    pub pod: DiscoveredPod,
}

/// What to do with one outcome of the desired set.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// Tell the consumer this now.
    pub forward: Outcome,
    /// Start these probes.
    pub probe: Vec<ProbeRequest>,
    /// Cancel these probes (their pods went away while held).
    pub cancel: Vec<u64>,
}

/// The pods held for a probe, and what the consumer was told of the probed ones.
#[derive(Debug, Default)]
pub struct ProbeGate {
    probing: bool,
    next_token: u64,
    /// Held pods by pod id: their probe's token and the pod as discovered.
    held: BTreeMap<String, (u64, DiscoveredPod)>,
    /// Probed pods as told, by pod id (a later removal names these).
    told: BTreeMap<String, DiscoveredPod>,
    /// A completed list not passed on yet: the tokens of the pods it waits for.
    sync_waits_for: Option<BTreeSet<u64>>,
}

impl ProbeGate {
    /// `probing`: whether pods are probed at all (else everything passes at once).
    pub fn new(probing: bool) -> Self {
        ProbeGate { probing, ..ProbeGate::default() }
    }

    /// Pods held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Takes one outcome of the desired set.
    pub fn admit(&mut self, outcome: Outcome) -> Admitted {
        let mut admitted = Admitted {
            forward: Outcome { rejections: outcome.rejections, ..Outcome::default() },
            ..Admitted::default()
        };
        for change in outcome.changes {
            match change {
                Change::Remove(pod) => {
                    let id = pod.pod_id();
                    if let Some((token, _)) = self.held.remove(&id) {
                        admitted.cancel.push(token);
                        admitted.forward.synced |= self.no_longer_waited(token);
                        continue;
                    }
                    let told = self.told.remove(&id).unwrap_or(pod);
                    admitted.forward.changes.push(Change::Remove(told));
                }
                Change::Add(pod) if self.probing && pod.wants_probe() => {
                    let token = self.next_token;
                    self.next_token += 1;
                    self.held.insert(pod.pod_id(), (token, pod.clone()));
                    admitted.probe.push(ProbeRequest { token, pod });
                }
                Change::Add(pod) => admitted.forward.changes.push(Change::Add(pod)),
            }
        }
        if outcome.synced {
            if self.held.is_empty() {
                admitted.forward.synced = true;
            } else {
                self.sync_waits_for = Some(self.held.values().map(|(token, _)| *token).collect());
            }
        }
        admitted
    }

    /// A probe ended: its pod, as `described` describes it (`None`: as discovered), is told
    /// now. `None` when the probe is stale (its pod went away meanwhile).
    pub fn finish(&mut self, token: u64, described: Option<&EngineDescriptor>) -> Option<Outcome> {
        let id = self.held.iter().find(|(_, (t, _))| *t == token).map(|(id, _)| id.clone())?;
        let (_, pod) = self.held.remove(&id)?;
        let pod = described.map_or(pod.clone(), |d| d.apply_to(&pod));
        self.told.insert(id, pod.clone());
        let synced = self.no_longer_waited(token);
        Some(Outcome { changes: vec![Change::Add(pod)], rejections: Vec::new(), synced })
    }

    /// Whether the held list's last awaited pod was `token` (the list may be passed on now).
    fn no_longer_waited(&mut self, token: u64) -> bool {
        let Some(waits) = self.sync_waits_for.as_mut() else { return false };
        waits.remove(&token);
        if waits.is_empty() {
            self.sync_waits_for = None;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use kvindex::wire::Engine;

    use super::*;
    use crate::server_info::Publisher;
    use crate::target::Annotated;

    fn pod(ip: &str) -> DiscoveredPod {
        DiscoveredPod::example(&format!("llm/{ip}"), ip)
    }

    fn outcome(changes: Vec<Change>, synced: bool) -> Outcome {
        Outcome { changes, rejections: Vec::new(), synced }
    }

    fn sglang(dp: u32) -> EngineDescriptor {
        EngineDescriptor {
            version: Some("0.5.23".into()),
            page_size: Some(16),
            dp_size: Some(dp),
            publisher: Some(Publisher { pub_port: 6000, replay_port: None, ..Publisher::default() }),
        }
    }

    #[test]
    fn a_probed_pod_is_told_once_as_what_it_is_and_removed_as_told() {
        let mut gate = ProbeGate::new(true);
        let a = gate.admit(outcome(vec![Change::Add(pod("10.0.0.1"))], true));
        assert!(a.forward.changes.is_empty() && !a.forward.synced, "held, and the list with it");
        assert_eq!(a.probe.len(), 1);
        let told = gate.finish(a.probe[0].token, Some(&sglang(2))).unwrap();
        assert!(told.synced, "the list passes once its held pod is told");
        let Change::Add(p) = &told.changes[0] else { panic!("an add") };
        assert_eq!((p.engine, p.page_size, p.dp_size, p.pub_port), (Some(Engine::Sglang), Some(16), 2, 6000));
        assert_eq!(gate.finish(a.probe[0].token, None), None, "a token is used once");
        // Its removal names the pod as told (two ranks), not as discovered.
        let r = gate.admit(outcome(vec![Change::Remove(pod("10.0.0.1"))], false));
        assert_eq!(r.forward.changes, vec![Change::Remove(p.clone())]);
    }

    #[test]
    fn a_pod_gone_while_held_is_never_told_and_its_probe_is_cancelled() {
        let mut gate = ProbeGate::new(true);
        let a = gate.admit(outcome(vec![Change::Add(pod("10.0.0.1")), Change::Add(pod("10.0.0.2"))], true));
        let tokens: Vec<u64> = a.probe.iter().map(|p| p.token).collect();
        let r = gate.admit(outcome(vec![Change::Remove(pod("10.0.0.1"))], false));
        assert!(r.forward.changes.is_empty(), "never told, so not removed");
        assert_eq!(r.cancel, vec![tokens[0]]);
        assert!(!r.forward.synced, "the list still waits for the other pod");
        assert_eq!(gate.finish(tokens[0], Some(&sglang(1))), None, "a cancelled probe's late result is dropped");
        let told = gate.finish(tokens[1], None).unwrap();
        assert_eq!(told.changes, vec![Change::Add(pod("10.0.0.2"))], "a failed probe tells the pod as discovered");
        assert!(told.synced);
        // Restarted (removed, then added again): probed again.
        let again = gate.admit(outcome(vec![Change::Remove(pod("10.0.0.2")), Change::Add(pod("10.0.0.2"))], false));
        assert_eq!(again.forward.changes, vec![Change::Remove(pod("10.0.0.2"))]);
        assert_eq!(again.probe.len(), 1);
        assert_eq!(gate.held(), 1);
    }

    #[test]
    fn annotated_vllm_pods_and_a_gate_that_does_not_probe_pass_at_once() {
        let vllm = DiscoveredPod {
            engine: Some(Engine::Vllm),
            annotated: Annotated { engine: true, ..Annotated::default() },
            ..pod("10.0.0.3")
        };
        let mut gate = ProbeGate::new(true);
        let a = gate.admit(outcome(vec![Change::Add(vllm.clone())], true));
        assert_eq!((a.forward.changes, a.forward.synced, a.probe.len()), (vec![Change::Add(vllm)], true, 0));
        let mut off = ProbeGate::new(false);
        let a = off.admit(outcome(vec![Change::Add(pod("10.0.0.1"))], true));
        assert_eq!((a.forward.changes.len(), a.forward.synced, a.probe.len()), (1, true, 0));
        let r = off.admit(outcome(vec![Change::Remove(pod("10.0.0.1"))], false));
        assert_eq!(r.forward.changes, vec![Change::Remove(pod("10.0.0.1"))]);
    }
}
