//! Precise prefix routing in process: a `kvindex::KvIndex` fed with every batch the pods
//! publish (decoded from vLLM's wire format), scored per prompt. The same scores as
//! `kvindex serve` + `ScoreTokens`, without the network hop.

use kvindex::wire::EventBatch;
use kvindex::{KvIndex, KvIndexConfig, ScoreQuery};

use super::{pick_weighted, FleetView, Policy};

pub struct Precise {
    index: KvIndex,
    pod_names: Vec<String>,
    model: String,
    block_size: usize,
    rotate: usize,
}

impl Precise {
    pub fn new(pods: usize, block_size: usize, model: &str) -> Self {
        Precise {
            index: KvIndex::new(KvIndexConfig { block_size, ..KvIndexConfig::default() }),
            pod_names: (0..pods).map(|p| format!("pod-{p}")).collect(),
            model: model.to_string(),
            block_size,
            rotate: 0,
        }
    }
}

impl Policy for Precise {
    fn name(&self) -> &str {
        "precise"
    }

    fn wants_events(&self) -> bool {
        true
    }

    fn observe(&mut self, pod: usize, batch: &EventBatch<'_>) {
        if let Some(name) = self.pod_names.get(pod) {
            self.index.apply(name, &self.model, batch);
        }
    }

    fn choose(&mut self, prompt: &[u32], fleet: &FleetView<'_>) -> usize {
        let result = self.index.score(&ScoreQuery {
            model: &self.model,
            lora_name: None,
            cache_salt: None,
            token_ids: prompt,
            pods: None,
        });
        let mut fractions = vec![0.0; fleet.pods.len()];
        for found in &result.matches {
            let Some(name) = self.index.pods().name(found.pod) else {
                continue;
            };
            if let Some(pod) = self.pod_names.iter().position(|n| **n == *name) {
                fractions[pod] = (found.matched_blocks as usize * self.block_size) as f64 / prompt.len().max(1) as f64;
            }
        }
        self.rotate = self.rotate.wrapping_add(1);
        pick_weighted(fleet, &fractions, self.rotate)
    }
}
