"""Drives vLLM's own v1 KV-cache manager and hybrid coordinator from Python, with no engine.

Why: on a hybrid model (full attention plus sliding-window layers) vLLM serves a prefix only
where every KV-cache group can serve it. kvindex must score the same way, and the
oracle for that is vLLM's own `HybridKVCacheCoordinator.find_longest_cache_hit`, not a
re-implementation. This shows the oracle can be run directly: build a two-group config
(FullAttentionSpec + SlidingWindowSpec), run requests through `KVCacheManager` as the scheduler
does (so blocks are cached and BlockStored events emitted as in the engine), evict chosen
blocks of one group, and ask the coordinator for the longest hit. Each case prints the
combined hit, the per-group hits, and what "group 0 alone" would claim.

Run with the vLLM venv: /var/tmp/kvindex-vllm-venv/bin/python hybrid_coordinator_probe.py
Exits non-zero if a result differs from the expectation written beside it.
"""

import os
import sys

os.environ.setdefault("PYTHONHASHSEED", "0")

import torch  # noqa: E402

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request  # noqa: E402

BLOCK = 32
WINDOW = 64  # tokens: a hit needs cdiv(WINDOW - 1, BLOCK) = 2 contiguous SWA blocks before the cut
N_BLOCKS = 8  # prompt length 8 * 32 + 1 tokens: the longest possible hit is 8 blocks


def make_manager(retention_interval=None):
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    swa = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16,
                            sliding_window=WINDOW)
    config = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layers.0.attn"], full), KVCacheGroupSpec(["layers.1.attn"], swa)],
        # None: every sliding-window block is cached (dense). The engine's default is 0
        # (--prefix-cache-retention-interval): only the window before each replay boundary.
        prefix_cache_retention_interval=retention_interval,
    )
    return KVCacheManager(config, max_model_len=2048, scheduler_block_size=BLOCK, hash_block_size=BLOCK,
                          enable_caching=True, enable_kv_cache_events=True)


HASHER = None


def make_request(rid, tokens):
    return Request(rid, tokens, SamplingParams(max_tokens=1), None, block_hasher=HASHER)


def prefill(manager, request):
    """One scheduler step that prefills the whole prompt, then the request finishes."""
    blocks, computed, _ = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - computed, computed, blocks)
    assert new is not None, "no room"
    request.num_computed_tokens = request.num_tokens
    block_ids = manager.get_block_ids(request.request_id)
    manager.free(request)
    return computed, block_ids


def hit(manager, tokens):
    request = make_request("query", tokens)
    coordinator = manager.coordinator
    _, combined, _ = coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
    _, per_group = coordinator.find_longest_cache_hit_per_group(request.block_hashes, request.num_tokens - 1)
    return combined, per_group


def describe(event):
    name = type(event).__name__
    fields = {"n": len(getattr(event, "block_hashes", []) or [])}
    for f in ("group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"):
        if hasattr(event, f):
            fields[f] = getattr(event, f)
    return f"{name}{fields}"


def main():
    global HASHER
    init_none_hash(sha256_cbor)
    HASHER = get_request_block_hasher(BLOCK, sha256_cbor)
    tokens = [(7 * i + 3) % 1000 + 3 for i in range(N_BLOCKS * BLOCK + 1)]

    cases = [
        # (name, evict {group: [block index]}, expected combined hit in blocks)
        ("nothing evicted", {}, 8),
        ("SWA evicted blocks 6,7 (the window before the cut)", {1: [6, 7]}, 6),
        ("SWA evicted block 5 only (outside the last window)", {1: [5]}, 8),
        ("SWA evicted blocks 1,3,6", {1: [1, 3, 6]}, 6),
        ("SWA evicted block 7 only", {1: [7]}, 7),
        ("full evicted block 2", {0: [2]}, 2),
        ("full evicted block 5, SWA evicted block 4", {0: [5], 1: [4]}, 4),
    ]
    failures = 0
    print(f"block {BLOCK}, sliding window {WINDOW}, prompt {len(tokens)} tokens ({N_BLOCKS} full blocks)")
    for name, evict, want_blocks in cases:
        manager = make_manager()
        computed, block_ids = prefill(manager, make_request("warm", tokens))
        stored = manager.take_events()
        if not evict and failures == 0:
            print("events of the first prefill:", "; ".join(describe(e) for e in stored))
        victims = {block_ids[g][i] for g, idx in evict.items() for i in idx}
        manager.evict_blocks(victims)
        removed = manager.take_events()
        combined, per_group = hit(manager, tokens)
        group0 = per_group[0] // BLOCK
        ok = combined == want_blocks * BLOCK
        failures += not ok
        print(f"{'ok ' if ok else 'BAD'} {name}: hit {combined // BLOCK} blocks (want {want_blocks}); "
              f"per group {[h // BLOCK for h in per_group]}; group 0 alone would claim {group0}"
              f"{' (over-reports)' if group0 > combined // BLOCK else ''}; "
              f"removed events: {[describe(e) for e in removed]}")

    # A second request over the same prefix reuses what is cached: as in the engine, this is
    # where cached_tokens comes from (get_computed_blocks caps the hit at num_tokens - 1).
    manager = make_manager()
    prefill(manager, make_request("a", tokens))
    manager.take_events()
    computed, _ = prefill(manager, make_request("b", tokens))
    events = manager.take_events()
    print(f"repeat of the same prompt: {computed} tokens from cache, events after it: "
          f"{[describe(e) for e in events]}")
    failures += computed != N_BLOCKS * BLOCK

    # The engine's default retention (0): the sliding-window group keeps only the window before
    # the prompt's replay boundary, so a request sharing only an early part of the prompt gets
    # no hit at all, though full attention holds that part.
    manager = make_manager(retention_interval=0)
    prefill(manager, make_request("sparse", tokens))
    stored = manager.take_events()
    print("retention 0 (engine default), events of the first prefill:", "; ".join(describe(e) for e in stored))
    for name, query, want_blocks in [
        ("same prompt", tokens, 8),
        ("first 4 blocks + a new tail", tokens[: 4 * BLOCK] + [5] * (2 * BLOCK + 1), 0),
    ]:
        combined, per_group = hit(manager, query)
        ok = combined == want_blocks * BLOCK
        failures += not ok
        print(f"{'ok ' if ok else 'BAD'} retention 0, {name}: hit {combined // BLOCK} blocks (want {want_blocks}); "
              f"per group {[h // BLOCK for h in per_group]}")
    print("probe:", "all cases as expected" if failures == 0 else f"{failures} unexpected result(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
