//! Checks of what `deploy/` ships, run by `cargo nextest` with the rest of the workspace: the
//! kustomize overlays and the Helm chart must render and every object must pass offline
//! validation (deploy/tests/validate.py), the Grafana dashboard may only chart metrics the code
//! exports, and the image must run as non-root with no build tools. A manifest that drifts from
//! the binaries (a flag renamed, a metric dropped) fails here instead of in a cluster.
//!
//! The same crate also holds the repository's source-layout check (`imports`: no import circle
//! of more than one file in a crate), since it reads the workspace's files the same way.

pub mod exported;
pub mod imports;
pub mod promql;
pub mod tools;
