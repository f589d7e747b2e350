"""Generates indexer/tests/fixtures/hybrid_coordinator.json: event streams from vLLM's own KV-cache
manager on hybrid configurations, with vLLM's coordinator answer for each query at each step.

Why: kvindex scores a pod with several KV-cache groups (full attention plus sliding-window or
Mamba layers) as vLLM's HybridKVCacheCoordinator.find_longest_cache_hit would serve it. The oracle
is vLLM itself, not a re-implementation: this script drives vLLM's KVCacheManager the way the
scheduler does (prefill in chunks, requests finish, blocks are evicted by the pool's LRU and by
hand), records the events it publishes (BlockStored/BlockRemoved with group_idx,
kv_cache_spec_kind, kv_cache_spec_sliding_window), and asks the coordinator for the longest hit
of a set of prompts after every step (a query is the first `len` tokens of a prompt, padded
with token 7). The Rust test (tests/it/hybrid_coordinator.rs) replays the
events into KvIndex and checks every answer. CI cannot install vLLM, so the output is committed.

vLLM does not deduplicate cached blocks: two physical blocks can hold one hash, each with its own
BlockStored, and evicting one publishes a BlockRemoved while the other still serves the hash. An
index that must never over-report treats stores as a set (a replayed batch changes nothing), so
it drops the hash at the first removal. Each step records whether vLLM's cache still holds a hash
its events removed (`events_exact`); where it does, the test requires kvindex's answer not to
exceed vLLM's instead of equalling it.

Regenerate (needs the vLLM CPU venv, see /work/notes/real-vllm.md or loadtest/real-vllm/):
    /var/tmp/kvindex-vllm-venv/bin/python indexer/tests/hybrid/gen_coordinator_cases.py \
        > indexer/tests/fixtures/hybrid_coordinator.json
Deterministic: a fixed seed per case and PYTHONHASHSEED=0.
"""

import json
import os
import random
import sys

os.environ.setdefault("PYTHONHASHSEED", "0")

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request  # noqa: E402

HASH_BLOCK = 16  # vLLM's hash block size = kvindex's canonical block size in the test
MASK64 = (1 << 64) - 1


def full(bs):
    return FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)


def swa(bs, window):
    return SlidingWindowSpec(block_size=bs, num_kv_heads=2, head_size=64, dtype=torch.bfloat16,
                             sliding_window=window)


def mamba(bs):
    return MambaSpec(block_size=bs, shapes=((16,),), dtypes=(torch.bfloat16,), mamba_cache_mode="align")


# (name, group specs, scheduler block size, pool blocks, exact): `exact` cases must match vLLM's
# answer; the others (Mamba, whose sparse blocks chain to parents its group never stored) must
# never exceed it.
CONFIGS = [
    ("full+window48", lambda: [full(16), swa(16, 48)], 16, 48, True),
    ("window48+full", lambda: [swa(16, 48), full(16)], 16, 48, True),
    ("full+window33+window80", lambda: [full(16), swa(16, 33), swa(16, 80)], 16, 64, True),
    ("window48 only", lambda: [swa(16, 48)], 16, 32, True),
    ("full16+window64 in blocks of 32", lambda: [full(16), swa(32, 64)], 32, 48, True),
    ("full32+window64 in blocks of 32", lambda: [full(32), swa(32, 64)], 32, 40, True),
    ("full+mamba", lambda: [full(16), mamba(16)], 16, 48, False),
]
SEEDS = 4
STEPS = 14


def event_json(e):
    def h(v):
        if v is None:
            return None
        if isinstance(v, (bytes, bytearray)):
            return int.from_bytes(bytes(v)[-8:], "big")
        return v & MASK64
    name = type(e).__name__
    if name == "BlockStored":
        return {"type": name, "block_hashes": [h(x) for x in e.block_hashes],
                "parent_block_hash": h(e.parent_block_hash), "token_ids": list(e.token_ids),
                "block_size": e.block_size, "medium": e.medium, "group_idx": e.group_idx,
                "kv_cache_spec_kind": e.kv_cache_spec_kind,
                "kv_cache_spec_sliding_window": e.kv_cache_spec_sliding_window}
    if name == "BlockRemoved":
        return {"type": name, "block_hashes": [h(x) for x in e.block_hashes], "medium": e.medium,
                "group_idx": e.group_idx}
    if name == "AllBlocksCleared":
        return {"type": name}
    raise ValueError(f"unexpected event {name}")


class Case:
    def __init__(self, specs, sched_bs, pool):
        groups = [KVCacheGroupSpec([f"layers.{i}.attn"], s) for i, s in enumerate(specs)]
        config = KVCacheConfig(num_blocks=pool, kv_cache_tensors=[], kv_cache_groups=groups)
        self.manager = KVCacheManager(config, max_model_len=4096, scheduler_block_size=sched_bs,
                                      hash_block_size=HASH_BLOCK, enable_caching=True,
                                      enable_kv_cache_events=True)
        self.hasher = get_request_block_hasher(HASH_BLOCK, sha256_cbor)
        self.sched_bs = sched_bs
        self.next_id = 0
        self.cached_ids = [set() for _ in specs]
        self.by_events = [set() for _ in specs]  # hashes per group, as the events say

    def note(self, events):
        for e in events:
            group = e.get("group_idx") or 0
            if e["type"] == "BlockStored":
                self.by_events[group].update(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                self.by_events[group].difference_update(e["block_hashes"])
            else:
                for g in self.by_events:
                    g.clear()

    def events_exact(self):
        """Whether every hash vLLM caches is one its events say is cached."""
        cached = [set() for _ in self.by_events]
        for key in self.manager.block_pool.cached_block_hash_to_block._cache:
            cached[get_group_id(key)].add(int.from_bytes(get_block_hash(key), "big") & MASK64)
        return all(c <= e for c, e in zip(cached, self.by_events))

    def request(self, tokens):
        self.next_id += 1
        return Request(f"r{self.next_id}", tokens, SamplingParams(max_tokens=4), None,
                       block_hasher=self.hasher)

    def run(self, tokens, rng):
        """Prefills `tokens` in scheduler-block-aligned chunks, decodes a few tokens, finishes."""
        m = self.manager
        r = self.request(tokens)
        blocks, computed, *_ = m.get_computed_blocks(r)
        done = computed
        first = True
        while done < r.num_tokens:
            chunk = min(r.num_tokens - done, self.sched_bs * rng.randint(1, 4))
            new = m.allocate_slots(r, chunk, done, blocks if first else None)
            if new is None:
                break
            first = False
            done += chunk
            r.num_computed_tokens = done
        for ids, group in zip(m.get_block_ids(r.request_id), self.cached_ids):
            group.update(ids)
        m.free(r)

    def evict(self, rng):
        group = rng.randrange(len(self.cached_ids))
        ids = sorted(self.cached_ids[group])
        if ids:
            victims = set(rng.sample(ids, min(len(ids), rng.randint(1, 3))))
            self.manager.evict_blocks(victims)

    def hit(self, tokens):
        r = self.request(tokens)
        _, hit, *_ = self.manager.coordinator.find_longest_cache_hit(r.block_hashes, r.num_tokens - 1)
        return hit


def query_tokens(prompt, length):
    """The first `length` tokens of `prompt`, padded with token 7 past its end."""
    return (prompt + [7] * length)[:length]


def generate():
    init_none_hash(sha256_cbor)
    cases = []
    for name, specs, sched_bs, pool, exact in CONFIGS:
        for seed in range(SEEDS):
            rng = random.Random(f"{name}/{seed}")
            case = Case(specs(), sched_bs, pool)
            vocab = 200
            prefixes = [[rng.randrange(vocab) for _ in range(HASH_BLOCK * rng.randint(1, 5))] for _ in range(3)]
            prompts = []
            steps = []
            for _ in range(STEPS):
                op = rng.random()
                if op < 0.65 or not prompts:
                    tokens = list(rng.choice(prefixes))
                    tokens += [rng.randrange(vocab) for _ in range(HASH_BLOCK * rng.randint(0, 5))]
                    tokens += [rng.randrange(vocab) for _ in range(rng.randint(1, HASH_BLOCK))]
                    case.run(tokens, rng)
                    prompts.append(tokens)
                elif op < 0.9:
                    case.evict(rng)
                else:
                    case.run(list(rng.choice(prompts)), rng)
                events = [event_json(e) for e in case.manager.take_events()]
                case.note(events)
                queries = []
                for i in range(max(0, len(prompts) - 4), len(prompts)):
                    p = prompts[i]
                    for length in sorted({len(p), HASH_BLOCK * rng.randint(1, 6) + 1}):
                        queries.append({"prompt": i, "len": length, "hit_tokens": case.hit(query_tokens(p, length))})
                steps.append({"events": events, "events_exact": case.events_exact(), "queries": queries})
            groups = [{"kind": type(s).__name__, "block_size": s.block_size,
                       "sliding_window": getattr(s, "sliding_window", None)} for s in specs()]
            cases.append({"name": f"{name} #{seed}", "groups": groups, "exact": exact, "prompts": prompts,
                          "steps": steps})
    return {
        "generator": "indexer/tests/hybrid/gen_coordinator_cases.py",
        "vllm": vllm.__version__,
        "hash_block_size": HASH_BLOCK,
        "cases": cases,
    }


if __name__ == "__main__":
    json.dump(generate(), sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
