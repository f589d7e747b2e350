//! Whose word about a pod counts, in the registry's origin labels: the shared rule of
//! `kvindex_discovery::precedence` (static > pods file > discovered > registered), which the
//! router's fleet applies too, so the two services cannot disagree about who owns a pod. Here
//! only the mapping of the registry's labels onto it.

use kvindex_discovery::precedence::{self, PodOrigin};

/// The origin of a registry label (`config`, `pods_file`, `discovery`, `grpc`, `http`).
pub fn origin(label: &str) -> PodOrigin {
    match label {
        "config" => PodOrigin::Static,
        "pods_file" => PodOrigin::File,
        "discovery" => PodOrigin::Discovered,
        _ => PodOrigin::Registered,
    }
}

/// Whether a declaration from `incoming` may replace or remove a pod that `existing` declared
/// (`None`: the pod is not registered). A source updates its own pods (a pods file reload, a
/// re-registration); a weaker one never overrides a stronger one.
pub fn may_replace(incoming: &str, existing: Option<&str>) -> bool {
    existing.is_none_or(|existing| precedence::may_replace(origin(existing), origin(incoming)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_beats_the_pods_file_beats_discovered_beats_registered() {
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
        for existing in ["pods_file", "discovery", "http"] {
            assert!(may_replace("pods_file", Some(existing)), "pods file over {existing}");
        }
        assert!(!may_replace("pods_file", Some("config")), "the command line beats the pods file");
        assert!(may_replace("config", Some("pods_file")));
    }
}
