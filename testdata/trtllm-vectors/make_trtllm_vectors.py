"""Builds testdata/trtllm-vectors/frames-trtllm-format.jsonl from TensorRT-LLM's published
KV-event format (tensorrt_llm/_torch/pyexecutor/kv_cache_events.py, TensorRT-LLM 1.3/1.4
pre-releases): msgspec structs declared here with the field names, order, tags and options
that module documents (tagged maps with omit_defaults, positional batch envelope), encoded by
msgspec itself. TensorRT-LLM's own module cannot be imported without CUDA (it imports
tensorrt_llm.runtime and llm_args at module level), so this is the format, not its code.

Run: $KVINDEX_PYTHON make_trtllm_vectors.py > frames-trtllm-format.jsonl
"""

import json
from typing import Any

import msgspec


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class Wire(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class MultimodalKey(msgspec.Struct, omit_defaults=True, gc=False, tag="mm_key"):
    hash: str
    start_offset: int
    uuid: str | None = None


class BlockStored(Wire):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int | str]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    mm_keys: list[list[MultimodalKey]] | None = None


class BlockRemoved(Wire):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None


class AllBlocksCleared(Wire):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


TOPIC = "kv@10.0.0.9:8000@Qwen/Qwen3-0.6B"
T = [151643, 0, 1, 255, 256, 65535, 65536, 16777216, 2147483647, 4294967295, 7, 8, 9, 10, 11, 12]


def hash_text(h):
    return f"0x{h:016x}" if h >= 0 else str(h)


def expect(seq, batch):
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=KVEventBatch)
    events = []
    for e in decoded.events:
        d = msgspec.to_builtins(e)
        d["block_hashes"] = [hash_text(h) for h in d.get("block_hashes", [])] if "block_hashes" in d else None
        if d["block_hashes"] is None:
            del d["block_hashes"]
        if d.get("parent_block_hash") is not None:
            d["parent_block_hash"] = hash_text(d["parent_block_hash"])
        events.append(d)
    return {"seq": seq, "topic": TOPIC, "ts": decoded.ts, "dp_rank": decoded.data_parallel_rank, "events": events}


def main():
    batches = [
        ("plain-store", KVEventBatch(ts=1765100000.125, data_parallel_rank=0, events=[
            BlockStored(block_hashes=[0x1111222233334444, -5], parent_block_hash=None, token_ids=T + T[::-1],
                        block_size=16, lora_id=None, medium="GPU", lora_name=None, group_idx=0,
                        kv_cache_spec_kind="full_attention")])),
        ("child-store-cpu", KVEventBatch(ts=1765100000.25, data_parallel_rank=0, events=[
            BlockStored(block_hashes=[2**63 - 1], parent_block_hash=-5, token_ids=T, block_size=16, lora_id=3,
                        medium="CPU", lora_name="sql-lora", locality="local")])),
        ("multimodal-store", KVEventBatch(ts=1765100000.375, data_parallel_rank=1, events=[
            BlockStored(block_hashes=[-(2**63)], parent_block_hash=None,
                        token_ids=["a3f0c1d2e4b59687"] * 4 + T[4:], block_size=16, lora_id=None, medium="GPU",
                        lora_name=None, mm_keys=[[MultimodalKey(hash="a3f0c1d2e4b59687", start_offset=0, uuid="img-1")]]),
            BlockStored(block_hashes=[42], parent_block_hash=None, token_ids=T, block_size=16, lora_id=None,
                        medium="GPU", lora_name=None,
                        mm_keys=[[MultimodalKey(hash="77aa", start_offset=3)]])])),
        ("remove-and-clear", KVEventBatch(ts=1765100000.5, events=[
            BlockRemoved(block_hashes=[2**63 - 1, -5], medium="CPU", group_idx=0),
            AllBlocksCleared()])),
    ]
    for seq, (scenario, batch) in enumerate(batches):
        payload = msgspec.msgpack.encode(batch)
        frames = [TOPIC.encode(), seq.to_bytes(8, "big"), payload]
        print(json.dumps({
            "engine": "trtllm", "format": "tensorrt_llm/_torch/pyexecutor/kv_cache_events.py (1.3/1.4)",
            "scenario": scenario, "kind": "live", "socket": "SUB",
            "frames_hex": [f.hex() for f in frames], "expect": expect(seq, batch)}))


main()
