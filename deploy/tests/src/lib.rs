//! Checks of what `deploy/` ships, run by `cargo nextest` with the rest of the workspace: the
//! kustomize overlays and the Helm chart must render and every object must pass offline
//! validation (deploy/tests/validate.py), the Grafana dashboard may only chart metrics the code
//! exports, and the image must run as non-root with no build tools. A manifest that drifts from
//! the binaries (a flag renamed, a metric dropped) fails here instead of in a cluster.

pub mod exported;
pub mod promql;
pub mod tools;
