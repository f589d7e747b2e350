"""Runs the real CPU engine on the tiny hybrid model (sliding window + full attention) and shows
what its KV events and cached_tokens look like.

Why: hybrid models must be scored as vLLM's coordinator would, checked on real events
from a tiny hybrid config if the CPU engine runs one. This answers whether it does, which
groups the events carry (`group_idx`, `kv_cache_spec_kind`, `kv_cache_spec_sliding_window`),
and whether the engine's hits follow the coordinator's rule after sliding-window blocks are
evicted: a full-attention group's hit is its leading run of held blocks; a sliding-window
group's is the longest prefix whose last cdiv(window - 1, block) blocks are held; the
engine's hit is the shortest of the groups, rounded to whole blocks and capped at
prompt length - 1. The full-attention group alone is printed beside it to show where scoring
one group would over-report.

Run with the vLLM venv: python hybrid_engine_probe.py [--blocks 40] [--out DIR]. Writes
DIR/frames-0.32.0-real-hybrid.jsonl and DIR/requests-0.32.0-real-hybrid.jsonl (default
captures/). Exits non-zero when the engine's cached_tokens
differs from the all-groups prediction.
"""

import argparse
import json
import os
import random
import sys
import time

os.environ["PYTHONHASHSEED"] = "0"

from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402

import kv_capture  # noqa: E402
from engine import BLOCK_SIZE, HERE, Engine, EngineConfig, cached_tokens  # noqa: E402
from manager_replica import ManagerReplica  # noqa: E402
from smoke import block_hashes, fence  # noqa: E402


class GroupedIndex:
    """Held block hashes per KV-cache group, and each group's kind and window from BlockStored."""

    def __init__(self):
        self.held = {}  # group_idx -> set of hashes
        self.spec = {}  # group_idx -> (kind, window)
        self.applied = 0

    def apply(self, events):
        for e in events:
            g = e.get("group_idx") or 0
            if e["type"] == "BlockStored":
                self.held.setdefault(g, set()).update(e["block_hashes"])
                self.spec[g] = (e.get("kv_cache_spec_kind"), e.get("kv_cache_spec_sliding_window"))
            elif e["type"] == "BlockRemoved":
                self.held.setdefault(g, set()).difference_update(e["block_hashes"])
            elif e["type"] == "AllBlocksCleared":
                self.held.clear()
        self.applied += len(events)

    def group_hit(self, g, hashes, max_blocks):
        held = self.held.get(g, set())
        kind, window = self.spec.get(g, ("full_attention", None))
        if kind == "sliding_window":
            need = -(-(window - 1) // BLOCK_SIZE)
            for end in range(max_blocks, 0, -1):  # longest prefix whose last `need` blocks are held
                if all(hashes[i] in held for i in range(max(0, end - need), end)):
                    return end
            return 0
        if kind not in (None, "full_attention"):
            return 0  # a kind we do not model: claim nothing rather than guess
        n = 0
        while n < max_blocks and hashes[n] in held:
            n += 1
        return n

    def predict(self, token_ids):
        hashes = ["0x%016x" % h for h in block_hashes(token_ids)]
        max_blocks = min(len(hashes), (len(token_ids) - 1) // BLOCK_SIZE)
        per_group = {g: self.group_hit(g, hashes, max_blocks) for g in sorted(self.spec)}
        return (min(per_group.values()) if per_group else 0) * BLOCK_SIZE, per_group


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, default=18300)
    p.add_argument("--kv-port", type=int, default=18757)
    p.add_argument("--blocks", type=int, default=40, help="--num-gpu-blocks-override (small: evictions)")
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--out", default=os.path.join(HERE, "captures"))
    args = p.parse_args()
    kv_cache_utils.init_none_hash(sha256_cbor)
    structs = kv_capture.EngineStructs()
    cfg = EngineConfig(http_port=args.http_port, kv_port=args.kv_port, model_dir=os.path.join(HERE, "tiny-model-hybrid"),
                       num_gpu_blocks_override=args.blocks, max_model_len=512)
    capture = kv_capture.LiveCapture(f"tcp://127.0.0.1:{cfg.kv_port}", structs)
    engine = Engine(cfg)
    index = GroupedIndex()
    rows, failures = [], 0
    try:
        engine.start()
        ready = engine.wait_healthy(args.start_timeout)
        print(f"hybrid engine ready in {ready:.1f} s, RSS {engine.rss() / 2**30:.2f} GiB", flush=True)
        rng = random.Random(3)
        fence_rng = random.Random("fence-hybrid")
        sent = []
        base = [rng.randrange(3, 1024) for _ in range(6 * BLOCK_SIZE + 1)]
        # Three 5-block prompts evict base's sliding-window blocks but not its full-attention ones
        # (with the fences in between; found by running the sequence through ManagerReplica).
        others = [[rng.randrange(3, 1024) for _ in range(5 * BLOCK_SIZE + 1)] for _ in range(3)]
        workload = [("base", base), ("base again", base)]
        workload += [(f"other {i}", o) for i, o in enumerate(others)]
        workload += [("base after others", base), ("base + 1 block", base[:-1] + others[0][:BLOCK_SIZE] + [5]),
                     ("base's first 4 blocks + a new tail", base[: 4 * BLOCK_SIZE] + others[1][: 2 * BLOCK_SIZE + 1]),
                     ("base + 1 block again", base[:-1] + others[0][:BLOCK_SIZE] + [5])]
        for label, prompt in workload:
            index.apply(capture.events()[index.applied:])
            predicted, per_group = index.predict(prompt)
            before = capture.count()
            response = engine.completion(prompt, max_tokens=1)
            got = cached_tokens(response)
            sent.append(("request", prompt, got))
            fenced, fence_tokens = fence(engine, capture, fence_rng)
            sent.append(("fence", fence_tokens, None))
            if not fenced:  # after the fence, every event of this request is in
                failures += 1
                print(f"BAD {label}: the fence request's store did not arrive within 30 s")
            index.apply(capture.events()[index.applied:])
            shapes = [{k: e.get(k) for k in ("type", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")}
                      | {"n": len(e.get("block_hashes") or [])} for e in capture.events(since=before)]
            full_alone = max([n for g, n in per_group.items() if index.spec[g][0] == "full_attention"] or [0]) * BLOCK_SIZE
            ok = got == predicted
            failures += not ok
            print(f"{'ok ' if ok else 'BAD'} {label}: {len(prompt)} tokens, cached {got}, all-groups prediction {predicted} "
                  f"(blocks per group {per_group}), full-attention group alone {full_alone}"
                  f"{' (would over-report)' if full_alone > got else ''}", flush=True)
            print(f"    events: {json.dumps(shapes)}", flush=True)
            rows.append({"label": label, "prompt_token_ids": prompt, "cached_tokens": got, "predicted": predicted,
                         "per_group_blocks": per_group, "full_attention_alone": full_alone})
        kinds = sorted({(e.get("group_idx"), e.get("kv_cache_spec_kind"), e.get("kv_cache_spec_sliding_window"))
                        for e in capture.events() if e["type"] == "BlockStored"}, key=str)
        print(f"groups seen in BlockStored: {kinds}")
        # vLLM's own manager and hybrid coordinator, fed the same prompts, with the groups the
        # events announced (and the engine's default sparse retention).
        replica = ManagerReplica([(kind, window) for _, kind, window in kinds], num_blocks=args.blocks)
        diffs = []
        labels = iter(label for label, _ in workload)
        for kind, tokens, got in sent:
            cached = replica.run(tokens)
            if kind == "request":
                label = next(labels)
                if cached != got:
                    diffs.append((label, cached, got))
        failures += len(diffs)
        print(f"{'ok ' if not diffs else 'BAD'} vLLM's KVCacheManager/HybridKVCacheCoordinator replica (no engine) "
              f"gives the engine's cached_tokens for all {len(workload)} requests; differences: {diffs}")
    finally:
        engine.stop()
        capture.close()
    out = args.out
    os.makedirs(out, exist_ok=True)
    kv = cfg.kv_events_config()
    base_rec = {"version": "0.32.0", "run": "real-engine", "pythonhashseed": "0", "hash_algo": "sha256_cbor",
                "event_encoding": "map", "scenario": "hybrid",
                "publisher": {"topic": cfg.topic_name(), "topic_configured": True, "data_parallel_rank": 0,
                              "endpoint": kv["endpoint"], "replay_endpoint": kv["replay_endpoint"],
                              "bound_endpoint": kv["endpoint"], "bound_replay_endpoint": kv["replay_endpoint"],
                              "int_block_hashes": True}}
    with open(os.path.join(out, "frames-0.32.0-real-hybrid.jsonl"), "w") as f:
        for frames, x in capture.messages:
            f.write(json.dumps(kv_capture.record(frames, x, base=base_rec, kind="live", socket="SUB")) + "\n")
    with open(os.path.join(out, "requests-0.32.0-real-hybrid.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"hybrid probe: {len(rows) - failures}/{len(rows)} requests match the all-groups prediction")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
