#!/usr/bin/env bash
# The test suite: sets up the Python peers, then runs every Rust test (unit, property,
# vectors, and integration tests against real sockets).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
