#!/usr/bin/env bash
# The test suite: formatting and lints first (cheap, and they fail fast), then the Python peers,
# then every Rust test (unit, property, vectors, and integration tests against real sockets).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
bash scripts/setup.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
