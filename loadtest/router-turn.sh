#!/usr/bin/env bash
# The router's turn, every stage, and ScoreTokens over gRPC beside its floor (a trivial tonic
# echo), in one command; baseline vs new in the same invocation when given two staged builds.
#
#   bash loadtest/router-turn.sh --stage DIR [CHECKOUT]  # build CHECKOUT's (default: this one's)
#                                                  # executables with this script, copy to DIR
#   bash loadtest/router-turn.sh NEW_DIR           # run one staged build
#   bash loadtest/router-turn.sh BASE_DIR NEW_DIR  # both, alternating, medians and ratios
#   bash loadtest/router-turn.sh                   # stage this checkout to a temp dir and run it
#
# A staged DIR holds `overhead`, `e2e_ingest` and `wire` (the bench executables), `kvindex` and
# `kvindex-sim`. What it prints:
# 1. `router/benches/overhead` (tokenize + ScoreTokens + pick of ~8.8k-token chats through the
#    library router, real DeepSeek tokenizer, real `kvindex serve`), REPS runs per build,
#    alternating base / new: each figure's median over the runs, and new / base.
# 2. ScoreTokens' floor with nothing else running: `e2e_ingest`'s ScoreTokens phase of the newest
#    build, no ingest, at QUIET_RPS (default 200/s: one request at a time, as the overhead bench
#    sends them), a prompt of QUIET_TOKENS ids (default 8800, the bench's next turn), against
#    each build's `kvindex serve` in turn and beside the trivial tonic echo (the same request,
#    decoded, a reply of the real one's shape): how much of the turn's ScoreTokens is the gRPC
#    round trip on this machine. The echo and the client are the newest build's in every row.
# 2b. The round trip layer by layer (`indexer/server/benches/wire.rs` of the newest build): plain
#    TCP with the same bytes (the machine's floor), the tonic echo by runtime, frame size, decoder
#    and client, and each build's `kvindex serve` from the old and the new client, paced and
#    closed loop, with context switches and CPU per request (WIRE_ROUNDS, default 3; empty
#    WIRE_ROUNDS skips it; a base DIR without `wire` uses the newest build's).
# 3. `e2e_ingest`'s ScoreTokens phase of the newest build (every client, kvindex and the echo,
#    ingesting 500k block ops/s throughout), which holds its own before/after (the clients).
#
# Env: REPS (default 5), WIRE_ROUNDS (part 2b, default 3), WIRE_ROWS (its rows, default all), CHATS / TURNS (overhead sample, default 24 / 4), QUIET_RPS (default
# 200; empty skips part 2), QUIET_TOKENS (default 8800), E2E_SCORE_RPS (default 1000,5000;
# empty skips part 3), E2E_SECS (default 4), E2E_SCORE_ROUNDS (default 3).
# Needs scripts/setup.sh's fixtures (the DeepSeek tokenizer) and `source scripts/env.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

stage() {
    local dir
    dir=$(realpath -m "$1")
    mkdir -p "$dir"
    cd "${2:-.}"
    cargo build --release -p kvindex-server --bin kvindex -p kvindex-loadtest --bin kvindex-sim
    cp "$CARGO_TARGET_DIR/release/kvindex" "$CARGO_TARGET_DIR/release/kvindex-sim" "$dir/"
    local bench
    for bench in "kvindex-router overhead" "kvindex-server e2e_ingest" "kvindex-server wire"; do
        set -- $bench
        local exe
        exe=$(cargo bench -p "$1" --bench "$2" --no-run --message-format=json 2>/dev/null |
            "${KVINDEX_PYTHON:-python3}" -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$2" | tail -1)
        [ -n "$exe" ] || { echo "no executable for bench $2" >&2; exit 1; }
        cp "$exe" "$dir/$2"
    done
    git rev-parse --short HEAD >"$dir/commit"
    git diff --quiet HEAD || echo "+uncommitted" >>"$dir/commit"
    echo "staged $(tr '\n' ' ' <"$dir/commit")in $dir"
    cd - >/dev/null
}

if [ "${1:-}" = "--stage" ]; then
    stage "${2:?--stage DIR}" "${3:-.}"
    exit 0
fi
if [ $# -eq 0 ]; then
    tmp=$(mktemp -d)
    stage "$tmp/new"
    set -- "$tmp/new"
fi
dirs=("$@")
label() { printf '%s' "$(basename "$1") ($(tr '\n' ' ' <"$1/commit" 2>/dev/null | sed 's/ $//'))"; }
log=$(mktemp)
echo "date $(date -u '+%F %T') UTC; load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
echo
echo "== 1. the router's turn (router/benches/overhead), ${REPS:=5} runs per build, alternating"
for rep in $(seq "$REPS"); do
    for dir in "${dirs[@]}"; do
        KVINDEX_BIN="$dir/kvindex" KVINDEX_SIM_BIN="$dir/kvindex-sim" "$dir/overhead" --bench 2>/dev/null |
            grep -E '^(first-seen|next-turn)' | sed "s|^|$dir $rep |" >>"$log"
    done
    echo "  run $rep done, load $(cut -d' ' -f1 /proc/loadavg)"
done
"${KVINDEX_PYTHON:-python3}" - "$log" "${dirs[@]}" <<'EOF'
import re, statistics, sys
log, dirs = sys.argv[1], sys.argv[2:]
rows = {}
for line in open(log):
    d, rep, case, rest = line.split(" ", 3)
    figures, stage = {}, None
    for word, value in re.findall(r"([a-z0-9]+)\W+([0-9.]+)?", rest):
        if word in ("total", "tokenize", "render", "encode", "score", "pick"):
            stage = word
        elif word in ("p50", "p99") and stage and value:
            figures[f"{stage} {word}"] = float(value)
    rows.setdefault((case, d), []).append(figures)
names = lambda d: d.rstrip("/").split("/")[-1]
for case in ("next-turn", "first-seen"):
    keys = [k for k in rows.get((case, dirs[-1]), [{}])[0]]
    print(f"\n{case}: median over runs (ms)" + ("; last column new / base" if len(dirs) == 2 else ""))
    print("| figure | " + " | ".join(names(d) for d in dirs) + (" | new / base |" if len(dirs) == 2 else " |"))
    print("|---|" + "---:|" * (len(dirs) + (len(dirs) == 2)))
    for k in keys:
        meds = [statistics.median(r[k] for r in rows.get((case, d), []) if k in r) if any(k in r for r in rows.get((case, d), [])) else float("nan") for d in dirs]
        ratio = f" | {meds[1] / meds[0]:.2f}" if len(dirs) == 2 and meds[0] else ""
        print(f"| {k} | " + " | ".join(f"{m:.3f}" for m in meds) + ratio + " |")
EOF
echo "load after part 1: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -f "$log"

new=${dirs[-1]}
if [ -n "${QUIET_RPS-200}" ]; then
    for dir in "${dirs[@]}"; do
        echo
        echo "== 2. ScoreTokens' floor, no ingest, ${QUIET_RPS-200} req/s one at a time: $(label "$dir")'s kvindex beside the echo (client and echo: $(basename "$new"))"
        E2E_KVINDEX="$dir/kvindex" E2E_RATES= E2E_RSS_ENTRIES=0 E2E_SCORE_INGEST=0 E2E_SCORE_RPS="${QUIET_RPS-200}" \
            E2E_SCORE_TOKENS="${QUIET_TOKENS:-8800}" E2E_SECS="${E2E_SECS:-4}" E2E_LOG="${E2E_LOG:-error}" \
            "$new/e2e_ingest" --bench | sed -n '/^ScoreTokens/,$p' | grep -E '^(ScoreTokens|\||errors)'
    done
    echo "load after part 2: $(cut -d' ' -f1-3 /proc/loadavg)"
fi
if [ -n "${WIRE_ROUNDS-3}" ] && [ -x "$new/wire" ]; then
    for dir in "${dirs[@]}"; do
        echo
        echo "== 2b. the round trip layer by layer ($(basename "$new")'s wire bench), $(label "$dir")'s kvindex in the last rows"
        rows=
        [ "$dir" = "$new" ] || rows="tcp,tonic-mt/kvindex,tonic-whole-mt/kvindex"
        WIRE_KVINDEX="$dir/kvindex" WIRE_ROUNDS="${WIRE_ROUNDS-3}" WIRE_ROWS="${WIRE_ROWS:-$rows}" "$new/wire" 2>/dev/null
    done
    echo "load after part 2b: $(cut -d' ' -f1-3 /proc/loadavg)"
fi
if [ -n "${E2E_SCORE_RPS-1000,5000}" ]; then
    echo
    echo "== 3. ScoreTokens over gRPC beside a trivial tonic echo, $(label "$new"), ingesting"
    E2E_KVINDEX="$new/kvindex" E2E_RATES= E2E_RSS_ENTRIES=0 E2E_SCORE_RPS="${E2E_SCORE_RPS-1000,5000}" \
        E2E_SECS="${E2E_SECS:-4}" E2E_LOG="${E2E_LOG:-error}" "$new/e2e_ingest" --bench
    echo "load after part 3: $(cut -d' ' -f1-3 /proc/loadavg)"
fi
for dir in "${dirs[@]}"; do echo "build $(label "$dir")"; done
