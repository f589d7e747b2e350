"""A replica of an engine's prefix cache: vLLM's own KVCacheManager, fed the same requests.

Why: a second oracle for what an engine holds, independent of its event stream. Driving vLLM's
`KVCacheManager` (and, for hybrid models, its `HybridKVCacheCoordinator`) from Python with the
same block count, groups and requests in the same order, one at a time, should give the same
`cached_tokens` as the real engine; when it does, generated cases (hybrid scoring)
can be checked against the replica with no engine at all.

Only for sequential traffic (one request in flight) that finishes after one prefill step
(`max_tokens=1`, prompts shorter than the batch budget).
"""

import os

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


def spec(kind, block_size=32, window=None):
    common = dict(block_size=block_size, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    if kind == "full_attention":
        return FullAttentionSpec(**common)
    if kind == "sliding_window":
        return SlidingWindowSpec(**common, sliding_window=window)
    raise ValueError(f"no replica for KV-cache kind {kind!r}")


class ManagerReplica:
    def __init__(self, groups, num_blocks, max_model_len=512, block_size=32, retention_interval=0):
        """groups: [(kind, window)] in the engine's group order; retention_interval as the
        engine's --prefix-cache-retention-interval (default 0)."""
        init_none_hash(sha256_cbor)
        self.hasher = get_request_block_hasher(block_size, sha256_cbor)
        config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec([f"layers.{i}"], spec(k, block_size, w)) for i, (k, w) in enumerate(groups)],
            prefix_cache_retention_interval=retention_interval,
        )
        self.manager = KVCacheManager(config, max_model_len=max_model_len, scheduler_block_size=block_size,
                                      hash_block_size=block_size, enable_caching=True, enable_kv_cache_events=True)
        self.count = 0

    def run(self, token_ids):
        """One request through one prefill step; returns the tokens it got from the cache."""
        self.count += 1
        request = Request(f"r{self.count}", list(token_ids), SamplingParams(max_tokens=1), None, block_hasher=self.hasher)
        blocks, computed, _ = self.manager.get_computed_blocks(request)
        if self.manager.allocate_slots(request, request.num_tokens - computed, computed, blocks) is None:
            raise RuntimeError("replica has no room for the request")
        request.num_computed_tokens = request.num_tokens
        self.manager.free(request)
        self.manager.take_events()
        return computed

    def reset(self):
        return self.manager.reset_prefix_cache()
