#!/usr/bin/env bash
# kvindex against real vLLM engines, in one command. Installs vLLM (setup.sh, reused
# when present), builds kvindex, kvindex-router and kvindex-tokenizer (debug; PROFILE=release
# for a release build), then agreement.py starts two real vLLM CPU engines (one with a 40-block
# KV cache, so it evicts), `kvindex serve`, `kvindex-tokenizer` and `kvindex-router`, runs a
# workload through the router (chats, shared system prompts, token-id prompts, evictions, a
# /reset_prefix_cache, an engine restart) and compares, request by request, the router's
# prediction for the pod that served with the engine's cached_tokens.
#
# Last line: `agreement <agreeing>/<requests>, over-predicted <n>`. Exit 0 only with >= 99%
# agreement, nothing over-predicted, kvindex-tokenizer's ids equal to the engine's, and no
# block-hash mismatch. Every process it starts is stopped on exit (also on Ctrl-C / failure).
#
# Env: KVINDEX_VLLM_VENV (setup.sh), KVINDEX_VENV (project test venv: grpcio-tools for the
# tokenizer stubs; scripts/setup.sh makes it), CARGO_TARGET_DIR, PROFILE (debug|release),
# KVINDEX_BIN_DIR (use these binaries, skip the build), OUT (results dir, default a temp dir),
# BASE_PORT (default 18400; uses BASE_PORT..BASE_PORT+12), FENCE_RESTARTED=1 (fence the
# restarted engine before it can be routed to: hides the restart window, see README),
# FENCES_ONLY=1 (stop after every engine's first fence: the start-up race alone, exit 0 if both
# passed; cheap to repeat with KVINDEX_BIN_DIR), ENGINE_BLOCK_SIZE (the engines' --block-size,
# default 32, a multiple of 32: e.g. 128 runs the shape "engine block 128 behind kvindex
# --block-size 32"; kvindex, its recorder and the router keep --block-size 32).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
source scripts/env.sh
start=$(date +%s)
venv="${KVINDEX_VLLM_VENV:-/var/tmp/kvindex-vllm-venv}"
out="${OUT:-$(mktemp -d /tmp/kvindex-real-vllm-run.XXXXXX)}"
mkdir -p "$out"
profile="${PROFILE:-debug}"

driver=""
build=""
cleanup() {
  if [ -n "$build" ] && kill -0 "$build" 2>/dev/null; then kill -TERM "$build" 2>/dev/null || true; fi
  # agreement.py stops its engines and services itself (also on SIGTERM); this is the backstop:
  # its process group, SIGKILL after 20 s. What it started (own process groups) has
  # PR_SET_PDEATHSIG set, so it gets SIGTERM when the driver dies.
  if [ -n "$driver" ] && kill -0 "$driver" 2>/dev/null; then
    kill -TERM -- "-$driver" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$driver" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$driver" 2>/dev/null || true
  fi
  rm -rf "${stubs:-}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The install (mostly downloads) and the build (CPU) overlap: on a fresh machine each takes minutes.
if [ -n "${KVINDEX_BIN_DIR:-}" ]; then
  bin_dir="$KVINDEX_BIN_DIR"
else
  flag=(); [ "$profile" = release ] && flag=(--release)
  nice cargo build --quiet "${flag[@]}" -p kvindex-server -p kvindex-router -p kvindex-tokenizer --bins &
  build=$!
  bin_dir="$CARGO_TARGET_DIR/$profile"
fi
bash "$here/setup.sh"
if [ -n "$build" ]; then
  wait "$build" || { echo "run.sh: the build failed" >&2; build=""; exit 1; }
  build=""
fi
echo "binaries from $bin_dir ($(( $(date +%s) - start )) s so far)"

if ! "$KVINDEX_PYTHON" -c 'import grpc_tools' 2>/dev/null; then
  bash scripts/setup.sh
fi
stubs="$(mktemp -d /tmp/kvindex-tok-stubs.XXXXXX)"
"$KVINDEX_PYTHON" -m grpc_tools.protoc -Iproto --python_out="$stubs" --grpc_python_out="$stubs" \
  proto/tokenization/tokenizer.proto

echo "results in $out; setup and build took $(( $(date +%s) - start )) s"
# The driver in its own process group, so the trap can stop everything it started.
set +e
setsid "$venv/bin/python" "$here/agreement.py" --bin-dir "$bin_dir" --stubs "$stubs" --out "$out" \
  --base-port "${BASE_PORT:-18400}" --engine-block-size "${ENGINE_BLOCK_SIZE:-32}" ${FENCE_RESTARTED:+--fence-restarted} ${FENCES_ONLY:+--fences-only} &
driver=$!
wait "$driver"
rc=$?
set -e

# Item 6: agreement.py recorded the per-pod engine with `kvindex record` ($out/big-engine.jsonl.gz).
# KEEP_FIXTURE=1 turns a passing run into the replay fixture indexer/server/tests/it/real_engine_dump.rs reads.
# The fixture's test assumes the default shape (engine block 32).
if [ "$rc" = 0 ] && [ -n "${KEEP_FIXTURE:-}" ] && [ "${ENGINE_BLOCK_SIZE:-32}" != 32 ]; then
  echo "run.sh: KEEP_FIXTURE is for ENGINE_BLOCK_SIZE=32; no fixture written" >&2
elif [ "$rc" = 0 ] && [ -n "${KEEP_FIXTURE:-}" ]; then
  "$venv/bin/python" "$here/make_fixture.py" "$out" "$repo/testdata/real-vllm"
fi
exit "$rc"
