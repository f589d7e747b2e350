//! A small LRU of loaded models, because a 129k-vocab tokenizer costs tens of MB and a fleet
//! may name many models; loads happen outside the lock so one slow load blocks nobody else.
use std::sync::Arc;

use parking_lot::Mutex;

use crate::loaded_model::LoadedModel;

/// Bounded, least-recently-used cache of `Arc<LoadedModel>` keyed by model name.
#[derive(Debug)]
pub struct ModelCache {
    capacity: usize,
    /// Most recently used last. Linear scans are fine: capacity is a handful of models.
    entries: Mutex<Vec<(String, Arc<LoadedModel>)>>,
}

impl ModelCache {
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), entries: Mutex::new(Vec::new()) }
    }

    /// The cached model, marked as most recently used.
    pub fn get(&self, name: &str) -> Option<Arc<LoadedModel>> {
        let mut entries = self.entries.lock();
        let pos = entries.iter().position(|(n, _)| n == name)?;
        let entry = entries.remove(pos);
        let model = entry.1.clone();
        entries.push(entry);
        Some(model)
    }

    /// Inserts a freshly loaded model (or returns the one a concurrent loader inserted first),
    /// evicting the least recently used beyond capacity. Returns the models evicted.
    pub fn insert(&self, name: &str, model: Arc<LoadedModel>) -> (Arc<LoadedModel>, Vec<Arc<LoadedModel>>) {
        let mut entries = self.entries.lock();
        if let Some((_, existing)) = entries.iter().find(|(n, _)| n == name) {
            return (existing.clone(), Vec::new());
        }
        entries.push((name.to_string(), model.clone()));
        let mut evicted = Vec::new();
        while entries.len() > self.capacity {
            evicted.push(entries.remove(0).1);
        }
        (model, evicted)
    }

    /// Names currently loaded, least recently used first.
    pub fn loaded(&self) -> Vec<String> {
        self.entries.lock().iter().map(|(n, _)| n.clone()).collect()
    }
}
