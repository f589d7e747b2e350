//! An independent reference of what a vLLM engine holds, built from its events' token
//! prefixes (no hashing, no code shared with the index): what a query must score, by vLLM's
//! rules (full attention alone, or the hybrid coordinator's when the engine publishes several
//! KV-cache groups or a group that is not full attention), in whole units of the engine's
//! blocks and never the prompt's last token. Shared by the core's in-process
//! vectors test and the server's end-to-end tests (included there with `#[path]`), so both hold
//! the index to the same model.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};

use kvindex::wire::{self, Event};

/// Tokens per canonical block.
pub const BLOCK: usize = 16;

/// What the engine holds, as plain token prefixes: engine hash → the canonical prefixes that
/// block covers, and whether they are reachable by a plain query in the model's namespace.
#[derive(Default)]
pub struct Reference {
    pub blocks: HashMap<u64, RefBlock>,
    /// KV-cache groups the engine published: kind, sliding window, largest block size stored.
    pub groups: BTreeMap<u32, (Option<String>, Option<i64>, usize)>,
    /// Per (group, tier): the least common multiple of the engine block sizes (in canonical
    /// blocks) stored there since the last clear: the engine reuses its blocks whole.
    pub units: BTreeMap<(u32, String), usize>,
}

pub struct RefBlock {
    /// Token prefix (from the start of the sequence) ending at each canonical block.
    pub prefixes: Vec<Vec<u32>>,
    /// Namespace tag: None = plain model text; Some(..) = LoRA, salt, mm, lookahead.
    pub special: Option<String>,
    pub group: u32,
    pub tiers: HashSet<String>,
}

impl Reference {
    pub fn apply(&mut self, event: &Event<'_>) {
        match event {
            Event::BlockStored(s) => {
                let group = self.groups.entry(s.group_idx.unwrap_or(0) as u32).or_default();
                if let Some(kind) = s.kv_cache_spec_kind {
                    *group = (Some(kind.to_string()), s.kv_cache_spec_sliding_window, group.2);
                }
                if s.token_ids.as_ref().is_some_and(|t| !t.is_empty()) {
                    group.2 = group.2.max(s.block_size.unwrap_or(0) as usize);
                }
                let tier = s.medium.unwrap_or("GPU").to_ascii_uppercase();
                let tokens = s.token_ids.clone().unwrap_or_default();
                let group_idx = s.group_idx.unwrap_or(0) as u32;
                if tokens.is_empty() {
                    for h in &s.block_hashes {
                        if let Some(b) = self.blocks.get_mut(&h.key()) {
                            b.tiers.insert(tier.clone());
                            let span = b.prefixes.len();
                            let unit = self.units.entry((group_idx, tier.clone())).or_insert(1);
                            *unit = lcm(*unit, span);
                        }
                    }
                    return;
                }
                let bs = s.block_size.unwrap_or(0) as usize;
                if bs > 0 && bs.is_multiple_of(BLOCK) {
                    let unit = self.units.entry((group_idx, tier.clone())).or_insert(1);
                    *unit = lcm(*unit, bs / BLOCK);
                }
                let (mut prefix, mut special) = match &s.parent_block_hash {
                    None => (Vec::new(), None),
                    Some(p) => match self.blocks.get(&p.key()) {
                        Some(b) => (b.prefixes.last().cloned().unwrap_or_default(), b.special.clone()),
                        None => return, // unknown parent: the index must skip it too
                    },
                };
                if let Some(name) = s.lora_name.or(s.lora_id.map(|_| "lora-id")) {
                    special.get_or_insert_with(|| format!("lora:{name}"));
                }
                for (i, h) in s.block_hashes.iter().enumerate() {
                    let extra = s.extra_keys.as_ref().and_then(|e| e.get(i)).filter(|e| !matches!(e, wire::Value::Nil));
                    let lora_only = matches!(extra, Some(wire::Value::Array(items))
                        if items.len() == 1 && matches!(items[0], wire::Value::Str(n) if Some(n) == s.lora_name));
                    if extra.is_some() && !lora_only {
                        special = Some(format!("extra:{extra:?}"));
                    }
                    if s.lookahead_token_ids.is_some() {
                        special = Some("lookahead".into());
                    }
                    let chunk = &tokens[i * bs..(i + 1) * bs];
                    let mut prefixes = Vec::new();
                    for sub in chunk.chunks(BLOCK) {
                        prefix.extend_from_slice(sub);
                        prefixes.push(prefix.clone());
                    }
                    let tiers = HashSet::from([tier.clone()]);
                    let group = s.group_idx.unwrap_or(0) as u32;
                    self.blocks.insert(h.key(), RefBlock { prefixes, special: special.clone(), group, tiers });
                }
            }
            Event::BlockRemoved(r) => {
                self.groups.entry(r.group_idx.unwrap_or(0) as u32).or_default();
                let tier = r.medium.unwrap_or("GPU").to_ascii_uppercase();
                for h in &r.block_hashes {
                    if let Some(b) = self.blocks.get_mut(&h.key()) {
                        b.tiers.remove(&tier);
                        if b.tiers.is_empty() {
                            self.blocks.remove(&h.key());
                        }
                    }
                }
            }
            Event::AllBlocksCleared { .. } => {
                self.blocks.clear();
                self.units.clear();
            }
            Event::Unknown { .. } => {}
        }
    }

    /// Plain prefixes held (any tier) in KV-cache group `group`, for exact-match checks.
    pub fn plain_prefixes(&self, group: u32) -> HashSet<Vec<u32>> {
        self.blocks
            .values()
            .filter(|b| b.special.is_none() && b.group == group)
            .flat_map(|b| b.prefixes.iter().cloned())
            .collect()
    }

    /// Whether group 0, as full attention, decides the score.
    pub fn plain(&self) -> bool {
        let full = |k: &Option<String>| matches!(k.as_deref(), None | Some("full_attention"));
        self.groups.keys().all(|&g| g == 0) && self.groups.get(&0).is_none_or(|g| full(&g.0))
    }

    /// The unit a plain engine is credited in: the lcm over the tiers of group 0.
    fn plain_unit(&self) -> usize {
        self.units.iter().filter(|((g, _), _)| *g == 0).fold(1, |a, (_, &u)| lcm(a, u))
    }

    /// Expected matched blocks for a plain query.
    pub fn expected(&self, query: &[u32]) -> u32 {
        // vLLM caps a hit at the prompt's tokens minus one.
        let cap = query.len().saturating_sub(1) / BLOCK;
        if self.plain() {
            let held = self.plain_prefixes(0);
            let mut n = 0;
            while (n + 1) * BLOCK <= query.len() && held.contains(&query[..(n + 1) * BLOCK]) {
                n += 1;
            }
            let unit = self.plain_unit();
            return (n.min(cap) / unit * unit) as u32;
        }
        // The longest length every group can serve; lengths are multiples of every group's
        // block (and of every unit stored).
        let ratio = |g: &(Option<String>, Option<i64>, usize)| (g.2 / BLOCK).max(1);
        let units = self.units.values().fold(1, |a, &u| lcm(a, u));
        let step = self.groups.values().map(ratio).fold(units, lcm);
        let held: BTreeMap<u32, HashSet<Vec<u32>>> = self.groups.keys().map(|&g| (g, self.plain_prefixes(g))).collect();
        let has = |g: u32, l: usize| l == 0 || held[&g].contains(&query[..l * BLOCK]);
        'lengths: for l in (0..=cap).rev().filter(|l| l % step == 0) {
            for (&g, spec) in &self.groups {
                let ok = match spec.0.as_deref() {
                    None
                    | Some("full_attention" | "mla_attention" | "sink_full_attention" | "chunked_local_attention") => {
                        (1..=l).all(|k| has(g, k))
                    }
                    Some("sliding_window" | "sliding_window_mla") => {
                        let Some(window) = spec.1.filter(|w| *w > 0) else { return 0 };
                        let group_block = ratio(spec) * BLOCK;
                        let need = (window as usize - 1).div_ceil(group_block) * ratio(spec);
                        (l.saturating_sub(need) + 1..=l).all(|k| has(g, k))
                    }
                    Some("mamba") => has(g, l),
                    Some(_) => return 0, // a kind vLLM's coordinator we do not model: not scored
                };
                if !ok {
                    continue 'lengths;
                }
            }
            return l as u32;
        }
        0
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
