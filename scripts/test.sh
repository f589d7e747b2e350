#!/usr/bin/env bash
# The test suite: formatting first (cheap, fails fast), the system libraries and Python peers,
# lints, then every Rust test (unit, property, vectors, and integration tests against real sockets).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo fmt --all --check
bash scripts/setup.sh   # system libraries the build links (RocksDB), then the Python peers
cargo clippy --workspace --all-targets -- -D warnings
# At least four tests at a time: most integration tests spend their time waiting on sockets and
# the processes they start, so on a 2-core CI box two at a time left a quarter of the CPU idle.
threads="${KVINDEX_TEST_THREADS:-$(( $(nproc) > 4 ? $(nproc) : 4 ))}"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast --test-threads "$threads" "$@"
else
  cargo test --workspace --no-fail-fast "$@" -- --test-threads "$threads"
fi
