#!/usr/bin/env bash
# The main job, end to end on this machine: build kvindex, then decode a stream captured from
# vLLM 0.33's own publisher and print what each message means.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo build -q -p kvindex --bin kvindex
kvindex="$CARGO_TARGET_DIR/debug/kvindex"
capture="$KVINDEX_VECTORS/frames-0.33.0.jsonl"
echo "== decoding $capture with kvindex decode"
"$kvindex" decode < "$capture" | python3 -c "$(cat <<'PY'
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("end_of_replay"):
        print("  replay end")
        continue
    evs = ", ".join("%s(%d)" % (e["type"], len(e.get("block_hashes") or [])) for e in m["events"])
    print("  seq %2d rank %s topic %r: %s" % (m["seq"], m["dp_rank"], m["topic"], evs))
PY
)" | head -40
