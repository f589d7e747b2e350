//! One pod, one owner: which stream feeds each pod id. A pod id (after DP naming) belongs to
//! the first stream that names it, until that stream is gone from its table; another stream
//! that would name it is refused before it is made. So no stream can credit, extend, remove,
//! clear or withhold the blocks of a pod it does not own, whatever named it (a DP rank's port
//! offset, `dp_naming = "topic"`, a topic map, a dialled pod beside a central topic), and every
//! pod's blocks, engine-hash map and snapshot record belong to one stream.
//!
//! One map serves every apply worker's table: the central SUB shards its messages by topic and
//! dialled pods by pod id, so two streams naming one pod may sit on two workers.
//!
//! A refused claim marks the pod contested: its owner gives the pod up ([`StreamTable`]'s tick)
//! once it may be reclaimed by the table's rules and its publisher's connection has closed (the
//! engine is gone), so an engine that takes the place of a departed one is served; or at once
//! if a registration made since keeps the pod for its own streams (an operator's word).
//!
//! [`StreamTable`]: super::StreamTable

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::naming::Mode;
use crate::protocols::StreamKey;
use kvindex_zmtp::Source;

/// The stream that owns a pod id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Told apart from any other stream, even one of the same key in another table.
    pub claim: u64,
    pub key: StreamKey,
    pub mode: Mode,
    /// Central mode: the source address the stream's topic is bound to.
    pub source: Option<Source>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    pods: HashMap<Arc<str>, Owner>,
    /// Owned pods another stream asked for: their owners' keys and claims.
    contested: HashMap<Arc<str>, (StreamKey, u64)>,
}

/// Every owned pod id, shared by the tables of one service.
#[derive(Default)]
pub struct PodOwners {
    inner: Mutex<Inner>,
    /// `inner.contested.len()`, read without the lock on every tick.
    contested: AtomicUsize,
}

impl PodOwners {
    /// Gives `pod` to `key`'s new stream, if no other stream owns it: the claim to keep (and
    /// give back with [`PodOwners::release`]), else the owner (the pod is then contested).
    pub fn claim(&self, pod: &Arc<str>, key: &StreamKey, mode: Mode, source: Option<Source>) -> Result<u64, Owner> {
        let mut inner = self.inner.lock();
        if let Some(owner) = self.contest_locked(&mut inner, pod) {
            return Err(owner);
        }
        inner.next += 1;
        let claim = inner.next;
        inner.pods.insert(pod.clone(), Owner { claim, key: key.clone(), mode, source });
        Ok(claim)
    }

    /// Another stream asked for `pod`: its owner, if it has one (the pod is then contested).
    pub fn contest(&self, pod: &str) -> Option<Owner> {
        self.contest_locked(&mut self.inner.lock(), pod)
    }

    fn contest_locked(&self, inner: &mut Inner, pod: &str) -> Option<Owner> {
        let (pod, owner) = inner.pods.get_key_value(pod).map(|(p, o)| (p.clone(), o.clone()))?;
        inner.contested.insert(pod, (owner.key.clone(), owner.claim));
        self.contested.store(inner.contested.len(), Ordering::Relaxed);
        Some(owner)
    }

    /// `pod`'s owner's stream is gone: the pod is free (a stale claim changes nothing).
    pub fn release(&self, pod: &str, claim: u64) {
        let mut inner = self.inner.lock();
        if inner.pods.get(pod).is_some_and(|o| o.claim == claim) {
            inner.pods.remove(pod);
            inner.contested.remove(pod);
            self.contested.store(inner.contested.len(), Ordering::Relaxed);
        }
    }

    /// The owner's topic moved to `source` (its old address holds no connection any more).
    pub fn rebind(&self, pod: &str, claim: u64, source: Source) {
        if let Some(owner) = self.inner.lock().pods.get_mut(pod).filter(|o| o.claim == claim) {
            owner.source = Some(source);
        }
    }

    /// A central-mode stream of topic `base` bound to a source address other than `source`
    /// that `connected` says still holds a connection: a bound topic binds all its DP ranks.
    pub fn bound_elsewhere(&self, base: &str, source: Source, connected: impl Fn(&Source) -> bool) -> Option<Owner> {
        let inner = self.inner.lock();
        inner
            .pods
            .values()
            .find(|o| {
                o.mode == Mode::Central
                    && &*o.key.base == base
                    && o.source.is_some_and(|s| s != source && connected(&s))
            })
            .cloned()
    }

    /// The owners of contested pods: their keys and claims (empty, without locking, when no
    /// pod is contested).
    pub fn contested(&self) -> Vec<(StreamKey, u64)> {
        if self.contested.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        self.inner.lock().contested.values().cloned().collect()
    }

    /// Whether `pod` is owned (tests and diagnostics).
    pub fn owner(&self, pod: &str) -> Option<Owner> {
        self.inner.lock().pods.get(pod).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn key(base: &str, rank: u32) -> StreamKey {
        StreamKey { base: Arc::from(base), rank }
    }

    fn ip(last: u8) -> Source {
        Source::Ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
    }

    #[test]
    fn the_first_stream_owns_a_pod_until_it_gives_it_back() {
        let owners = PodOwners::default();
        let pod: Arc<str> = Arc::from("h:8001");
        let claim = owners.claim(&pod, &key("h:8000", 1), Mode::Central, Some(ip(2))).unwrap();
        let owner = owners.claim(&pod, &key("h:8001", 0), Mode::Central, Some(ip(3))).unwrap_err();
        assert_eq!((owner.claim, owner.key, owner.source), (claim, key("h:8000", 1), Some(ip(2))));
        assert_eq!(owners.contested(), [(key("h:8000", 1), claim)]);
        // Even the same key, from another table, is another stream.
        assert!(owners.claim(&pod, &key("h:8000", 1), Mode::Central, Some(ip(2))).is_err());
        owners.release("h:8001", claim + 100);
        assert!(owners.owner("h:8001").is_some(), "a stale claim frees nothing");
        owners.release("h:8001", claim);
        assert!(owners.contested().is_empty());
        let next = owners.claim(&pod, &key("h:8001", 0), Mode::Central, Some(ip(3))).unwrap();
        assert_ne!(next, claim);
    }

    #[test]
    fn a_bound_topic_binds_its_ranks_while_its_address_is_connected() {
        let owners = PodOwners::default();
        let claim = owners.claim(&Arc::from("h:8000"), &key("h:8000", 0), Mode::Central, Some(ip(2))).unwrap();
        let up = |_: &Source| true;
        let down = |_: &Source| false;
        assert_eq!(owners.bound_elsewhere("h:8000", ip(3), up).map(|o| o.claim), Some(claim));
        assert_eq!(owners.bound_elsewhere("h:8000", ip(2), up), None, "its own address");
        assert_eq!(owners.bound_elsewhere("h:8000", ip(3), down), None, "the bound address is gone");
        assert_eq!(owners.bound_elsewhere("h:9000", ip(3), up), None, "another topic");
        owners.rebind("h:8000", claim, ip(3));
        assert_eq!(owners.bound_elsewhere("h:8000", ip(3), up), None, "moved");
        assert!(owners.bound_elsewhere("h:8000", ip(2), up).is_some());
    }
}
