//! A pod as the sources name it (the command line, the pods file, discovery, registration):
//! its id, where to send its requests, what it does in a prefill/decode fleet, and the
//! data-parallel ranks its engine serves behind that one URL. A leaf: the configuration and the
//! pod table both read it.

use serde::{Deserialize, Serialize};

/// What a pod does in a prefill/decode (P/D) disaggregated fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prefill and decode (an ordinary vLLM).
    #[default]
    Both,
    Prefill,
    Decode,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// Who picks the data-parallel rank of a pod whose ranks share one URL (SGLang's `--dp-size`,
/// vLLM's internal load balancer), and so which rank's cache a request meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DpRouting {
    /// The engine's balancer: the router cannot know the rank, so the pod is credited only the
    /// prefix every rank holds (whatever rank the balancer picks serves at least that).
    #[default]
    Engine,
    /// The router: each rank is a pod of its own (the indexer's id for that rank), and every
    /// request names its rank (`X-Data-Parallel-Rank`), which the engine obeys before any
    /// balancing (SGLang 0.5.19+, vLLM).
    Router,
}

impl DpRouting {
    pub fn label(self) -> &'static str {
        match self {
            DpRouting::Engine => "engine",
            DpRouting::Router => "router",
        }
    }
}

/// Most data-parallel ranks behind one pod: the indexer's bound (`dp_size`, 1–128).
pub const MAX_DP_SIZE: u32 = 128;

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// A pod as configured: the indexer's id for it, where to send requests, what it does.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct PodSpec {
    pub id: String,
    pub url: String,
    #[serde(default)]
    pub role: Role,
    /// Data-parallel ranks served behind `url` (1: none, or ranks with their own URLs listed as
    /// pods of their own). The indexer names rank r `kvindex::wire::dp_pod_id(id, r)`.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub dp_size: u32,
    /// Who picks the rank when `dp_size` > 1.
    #[serde(default)]
    pub dp_routing: DpRouting,
}

impl PodSpec {
    /// A pod without data-parallel ranks behind its URL.
    pub fn new(id: impl Into<String>, url: impl Into<String>, role: Role) -> PodSpec {
        PodSpec { id: id.into(), url: url.into(), role, dp_size: 1, dp_routing: DpRouting::Engine }
    }

    /// Why the spec's data-parallel shape cannot be served, if it cannot: a size out of range,
    /// or ranks named to a prefill pod (the decode pod's sidecar asks the prefill endpoint
    /// itself, naming no rank).
    pub fn dp_refusal(&self) -> Option<String> {
        if !(1..=MAX_DP_SIZE).contains(&self.dp_size) {
            return Some(format!("dp_size must be 1–{MAX_DP_SIZE}, got {}", self.dp_size));
        }
        (self.dp_size > 1 && self.dp_routing == DpRouting::Router && self.role == Role::Prefill).then(|| {
            "dp_routing = router cannot name the rank of a prefill pod (the decode side asks it); use dp_routing = engine"
                .to_string()
        })
    }

    /// Applies one `key=value` option of a `--pod` flag (`dp_size=<n>`, `dp_routing=<who>`).
    pub fn set_option(&mut self, option: &str) -> Result<(), String> {
        let (key, value) = option.split_once('=').ok_or_else(|| format!("expected key=value, got {option:?}"))?;
        match key.trim() {
            "dp_size" => {
                self.dp_size = value.trim().parse().map_err(|_| format!("dp_size must be a number, got {value:?}"))?;
            }
            "dp_routing" => {
                self.dp_routing = match value.trim() {
                    "engine" => DpRouting::Engine,
                    "router" => DpRouting::Router,
                    other => return Err(format!("dp_routing must be engine or router, got {other:?}")),
                };
            }
            other => return Err(format!("unknown option {other:?} (dp_size, dp_routing)")),
        }
        Ok(())
    }

    /// The indexer's pod id of rank `rank` (the spec's own id for rank 0).
    pub fn rank_id(&self, rank: u32) -> String {
        kvindex::wire::dp_pod_id(&self.id, Some(i64::from(rank)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_set_the_data_parallel_shape_and_mistakes_are_named() {
        let mut spec = PodSpec::new("h:30000", "http://h:30000", Role::Both);
        spec.set_option("dp_size=2").unwrap();
        spec.set_option(" dp_routing = router ").unwrap();
        assert_eq!((spec.dp_size, spec.dp_routing), (2, DpRouting::Router));
        assert_eq!((spec.rank_id(0), spec.rank_id(1)), ("h:30000".to_string(), "h:30001".to_string()));
        assert_eq!(spec.dp_refusal(), None);
        assert!(spec.set_option("dp_size=two").unwrap_err().contains("number"));
        assert!(spec.set_option("dp_routing=gateway").unwrap_err().contains("engine or router"));
        assert!(spec.set_option("weight=3").unwrap_err().contains("unknown option"));
        assert!(spec.set_option("dp_size").unwrap_err().contains("key=value"));
        for size in [0, MAX_DP_SIZE + 1] {
            assert!(PodSpec { dp_size: size, ..spec.clone() }.dp_refusal().unwrap().contains("1–128"));
        }
        let prefill = PodSpec { role: Role::Prefill, ..spec.clone() };
        assert!(prefill.dp_refusal().unwrap().contains("prefill"));
        assert_eq!(PodSpec { dp_routing: DpRouting::Engine, ..prefill }.dp_refusal(), None);
    }

    #[test]
    fn a_pods_file_entry_may_leave_the_shape_out() {
        let spec: PodSpec = serde_json::from_str(r#"{"id": "a:1", "url": "http://a:1"}"#).unwrap();
        assert_eq!(spec, PodSpec::new("a:1", "http://a:1", Role::Both));
        let spec: PodSpec =
            serde_json::from_str(r#"{"id": "a:1", "url": "http://a:1", "dp_size": 4, "dp_routing": "router"}"#)
                .unwrap();
        assert_eq!((spec.dp_size, spec.dp_routing), (4, DpRouting::Router));
    }
}
