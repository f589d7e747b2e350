"""A JSON Lines dump (the decode/vectors layout) for measuring `kvindex replay`: 64 pods, each
message one vLLM 0.33-shaped batch of 8 chained 2-block stores then 2 single-hash removals
(10 events). Uses the service tests' independent msgspec structs (kvpeer.py), not kvindex code.

    python loadtest/dumps/gen_replay_dump.py indexer/server/tests/python <messages> <out.jsonl>
"""
import json, sys
sys.path.insert(0, sys.argv[1])
from kvpeer import KVEventBatch, BlockStored, BlockRemoved, ENCODER
msgs = int(sys.argv[2]); out = open(sys.argv[3], "w")
seq = [0] * 64
for m in range(msgs):
    pod = m % 64
    base = m * 7919
    evs = []; parent = None; hashes = []
    for s in range(8):
        hs = [(base * 16 + s * 2 + b) & 0x7FFFFFFFFFFFFFFF | 1 for b in range(2)]
        toks = [(base + s * 32 + j) % 150000 for j in range(32)]
        evs.append(BlockStored(block_hashes=hs, parent_block_hash=parent, token_ids=toks, block_size=16, lora_id=None, medium="GPU", lora_name=None))
        parent = hs[-1]; hashes += hs
    evs.append(BlockRemoved(block_hashes=[hashes[-1]], medium="GPU"))
    evs.append(BlockRemoved(block_hashes=[hashes[-2]], medium="GPU"))
    payload = ENCODER.encode(KVEventBatch(ts=1.7e9 + m * 1e-4, events=evs))
    topic = f"kv@10.0.0.{pod}:8000@m".encode()
    out.write(json.dumps({"kind": "live", "t": 1.7e9 + m * 1e-4, "frames_hex": [topic.hex(), seq[pod].to_bytes(8, "big").hex(), payload.hex()]}) + "\n")
    seq[pod] += 1
