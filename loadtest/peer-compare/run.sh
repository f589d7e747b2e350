#!/usr/bin/env bash
# peer-compare: kvindex-router against vllm-router and sglang-router in front of the same
# simulated fleet. Creates the pinned venvs (requirements.txt) under $PEER_VENVS, builds the
# release binaries unless KVINDEX_BIN_DIR points at a build, runs bench.py and draws the plot.
#
#   bash loadtest/peer-compare/run.sh                    # the full bench (~10 min on 2 cores)
#   bash loadtest/peer-compare/run.sh --smoke            # seconds: kvindex-router + direct only
#   KVINDEX_BIN_DIR=/path/to/release bash loadtest/peer-compare/run.sh --out /tmp/after
#   bash loadtest/peer-compare/run.sh --routers kvindex --kvindex-router-args "--kv-weight 16"
#   bash loadtest/peer-compare/run.sh --routers kvindex --replicas 4 --variants two-indexers,kill-indexer --no-probe
#                                                        # an indexer replica SIGKILLed mid-run
# Any other flag goes to bench.py (`bench.py --help`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/scripts/env.sh"
: "${PEER_VENVS:=/var/tmp/peer-venvs}"
export PEER_VENVS

# One venv per requirements.txt section, recreated when its pins change.
venv_for() {  # name -> its pinned requirement lines
  awk -v want="$1" '/^# venv: /{cur=$3; next} /^#/||!NF{next} cur==want' "$here/requirements.txt"
}
smoke=0
for arg in "$@"; do [[ "$arg" == --smoke ]] && smoke=1; done
names=(bench)
[[ $smoke == 1 ]] || names+=(vllm-router sglang-router)
for name in "${names[@]}"; do
  dir="$PEER_VENVS/$name"
  pins="$(venv_for "$name")"
  if [[ ! -x "$dir/bin/python" || "$(cat "$dir/.pins" 2>/dev/null)" != "$pins" ]]; then
    echo "peer-compare: creating $dir ($(echo $pins))" >&2
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/pip" install -q $pins
    echo "$pins" > "$dir/.pins"
  fi
done

if [[ -z "${KVINDEX_BIN_DIR:-}" ]]; then
  if [[ $smoke == 1 ]]; then profile=debug; flags=(); else profile=release; flags=(--release); fi
  (cd "$root" && nice -n 10 cargo build "${flags[@]}" -p kvindex-router --bin kvindex-router \
     -p kvindex-loadtest --bin kvindex-sim -p kvindex-server --bin kvindex)
  export KVINDEX_BIN_DIR="$CARGO_TARGET_DIR/$profile"
fi
if [[ ! -f "$KVINDEX_FIXTURES/models/deepseek/tokenizer.json" ]]; then
  bash "$root/scripts/setup.sh"
fi

out=/tmp/peer-compare
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do [[ "${args[i]}" == --out ]] && out="${args[i+1]}"; done
"$PEER_VENVS/bench/bin/python" "$here/bench.py" --out "$out" "$@"
"$PEER_VENVS/bench/bin/python" "$here/plot.py" "$out/results.json" "$out/peer-compare.png"
echo "plot: $out/peer-compare.png"
