//! Whose word about a pod counts: static (the config file, `--pod`, the pods file) >
//! discovered (Kubernetes) > registered (the HTTP and gRPC registration API). One function,
//! so the API's refusal, discovery's "left as configured" and the pods file agree; the router
//! applies the same order to its fleet (issue 24 item 5: the rule is meant to move to
//! `kvindex-discovery` and be shared once it is there).

/// Where a pod's declaration came from, in the order of precedence (later wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    /// The registration API (`grpc`, `http`).
    Registered,
    /// Kubernetes discovery (`discovery`).
    Discovered,
    /// The operator's files and flags (`config`, `pods_file`).
    Static,
}

impl Rank {
    /// The rank of a registry origin label (`config`, `pods_file`, `discovery`, `grpc`, `http`).
    pub fn of(origin: &str) -> Rank {
        match origin {
            "config" | "pods_file" => Rank::Static,
            "discovery" => Rank::Discovered,
            _ => Rank::Registered,
        }
    }
}

/// Whether a declaration from `incoming` may replace or remove a pod that `existing` declared
/// (`None`: the pod is not registered). Equal ranks replace each other (a pods file reload, a
/// re-registration); a lower rank never overrides a higher one.
pub fn may_replace(incoming: &str, existing: Option<&str>) -> bool {
    existing.is_none_or(|existing| Rank::of(incoming) >= Rank::of(existing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_beats_discovered_beats_registered() {
        for api in ["grpc", "http"] {
            assert!(may_replace(api, None));
            assert!(may_replace(api, Some("grpc")) && may_replace(api, Some("http")));
            for operator in ["config", "pods_file", "discovery"] {
                assert!(!may_replace(api, Some(operator)), "{api} over {operator}");
            }
        }
        assert!(may_replace("discovery", Some("grpc")));
        assert!(may_replace("discovery", Some("discovery")));
        assert!(!may_replace("discovery", Some("config")));
        assert!(!may_replace("discovery", Some("pods_file")));
        for existing in ["config", "pods_file", "discovery", "http"] {
            assert!(may_replace("pods_file", Some(existing)), "pods file over {existing}");
        }
    }
}
