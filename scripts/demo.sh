#!/usr/bin/env bash
# The main job, end to end on this machine: `kvindex serve` indexing a simulated fleet (3 vLLM pods, 1 SGLang)
# (`kvindex-sim`, real ZeroMQ wire format), and a precise router loop that asks ScoreTokens
# before every request, prints where it routed and why, and checks the engine's cached_tokens.
# `--gateway envoy`: the same fleet behind a real Envoy (the endpoint-picker config deploy/
# ships), kvindex-router as its ext_proc endpoint picker.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
cargo build -q -p kvindex-server --bin kvindex -p kvindex-loadtest --bin kvindex-sim -p kvindex-router --bin kvindex-router
exec "$KVINDEX_PYTHON" scripts/demo.py "$@"
