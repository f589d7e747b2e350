//! Prefill/decode disaggregation: when the fleet has prefill pods, a request needs two pods.
//! The prefill pod computes the prompt's KV cache, so it is chosen for cache affinity within a
//! load band; the decode pod only receives that cache, so it is chosen by load and rendezvous.
//! The request goes to the decode pod with `x-prefiller-host-port: <prefill pod id>`, the
//! header llm-d's routing sidecar on the decode pod reads to run the prefill there first
//! ([`crate::upstream::PREFILLER_HEADER`]).

use crate::pods::spec::Role;

/// Candidate indices of each pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pools {
    pub prefill: Vec<usize>,
    pub decode: Vec<usize>,
}

/// The pools when any candidate is prefill-only (P/D mode), else `None`. Pods with both roles
/// belong to both pools.
pub fn pools(roles: &[Role]) -> Option<Pools> {
    if !roles.contains(&Role::Prefill) {
        return None;
    }
    let pick = |keep: fn(Role) -> bool| roles.iter().enumerate().filter(|(_, r)| keep(**r)).map(|(i, _)| i).collect();
    Some(Pools { prefill: pick(|r| r != Role::Decode), decode: pick(|r| r != Role::Prefill) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_pods_turn_pd_mode_on_and_mixed_pods_serve_both_pools() {
        assert_eq!(pools(&[Role::Both, Role::Decode]), None);
        let p = pools(&[Role::Prefill, Role::Decode, Role::Both]).unwrap();
        assert_eq!(p.prefill, [0, 2]);
        assert_eq!(p.decode, [1, 2]);
    }
}
