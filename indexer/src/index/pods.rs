//! Pod identities: the strings the EPP uses for endpoints, interned to small integers.
//!
//! A residency stores a `PodId`, not a string, so that holders stay 4 bytes. Ids are never
//! reused while the process runs; a pod that comes back gets its old id.

use std::sync::Arc;

use parking_lot::RwLock;
use rustc_hash::FxHashMap;

/// Interned pod identifier. Fits in 24 bits (16M pods), see `index::Holder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId(pub u32);

/// The largest pod count a holder can address (24 bits, less two values the index reserves).
pub const MAX_PODS: u32 = (1 << 24) - 2;

#[derive(Debug, Default)]
pub struct Pods {
    inner: RwLock<PodsInner>,
}

#[derive(Debug, Default)]
struct PodsInner {
    by_name: FxHashMap<Arc<str>, PodId>,
    names: Vec<Arc<str>>,
}

impl Pods {
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `name`, registering it on first sight. `None` past [`MAX_PODS`].
    pub fn intern(&self, name: &str) -> Option<PodId> {
        if let Some(id) = self.get(name) {
            return Some(id);
        }
        let mut inner = self.inner.write();
        if let Some(&id) = inner.by_name.get(name) {
            return Some(id);
        }
        let next = inner.names.len() as u32;
        if next >= MAX_PODS {
            return None;
        }
        let name: Arc<str> = Arc::from(name);
        inner.names.push(name.clone());
        inner.by_name.insert(name, PodId(next));
        Some(PodId(next))
    }

    pub fn get(&self, name: &str) -> Option<PodId> {
        self.inner.read().by_name.get(name).copied()
    }

    pub fn name(&self, id: PodId) -> Option<Arc<str>> {
        self.inner.read().names.get(id.0 as usize).cloned()
    }

    pub fn len(&self) -> usize {
        self.inner.read().names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable() {
        let pods = Pods::new();
        let a = pods.intern("10.0.0.1:8000").unwrap();
        let b = pods.intern("10.0.0.2:8000").unwrap();
        assert_ne!(a, b);
        assert_eq!(pods.intern("10.0.0.1:8000"), Some(a));
        assert_eq!(pods.name(b).as_deref(), Some("10.0.0.2:8000"));
        assert_eq!(pods.get("nope"), None);
    }
}
