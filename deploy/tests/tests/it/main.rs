//! kvindex-deploy-tests' integration tests, one binary (ripgrep's `tests/tests.rs` layout): one
//! link of the crate and its test dependencies instead of one per file. Each module is a former
//! test file; run one with `cargo nextest run -p kvindex-deploy-tests --test it manifests::`.

mod admin_token;
mod dashboard;
mod dockerfile;
mod envoy_docs;
mod import_circles;
mod manifests;
mod router_rooms;
mod server_rooms;
