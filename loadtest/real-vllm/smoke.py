"""Smoke test of a real vLLM engine's prefix cache and KV events, and a capture of real frames.

Why: before kvindex is checked against real engines, every behaviour it relies on
must be seen on a real engine, not assumed: what the events carry and when, replay from the
ROUTER, `cached_tokens` on repeated prompts, evictions, `/reset_prefix_cache`, and
`kv_cache_report_mode: full`. A small Python index fed only by the captured events predicts
every request's cached tokens, and the prediction is compared with the engine's answer: the
same check asked of kvindex, done here with the simplest possible index.

Two engines, one after the other: A (dev mode, roomy cache) and B (20 KV blocks: evictions).
Writes captures/frames-0.32.0-real.jsonl (schema of testdata/vllm-vectors/frames-*.jsonl) and
captures/requests-0.32.0-real.jsonl (each request: prompt ids, cached_tokens, prediction).

Run with the vLLM venv's python (see setup.sh). Exits non-zero when a check fails.
"""

import argparse
import json
import os
import random
import sys
import time

os.environ["PYTHONHASHSEED"] = "0"  # our hash recomputation must seed NONE_HASH as the engine does

from transformers import AutoTokenizer  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402

import kv_capture  # noqa: E402
from engine import BLOCK_SIZE, HERE, Engine, EngineConfig, cached_tokens  # noqa: E402
from manager_replica import ManagerReplica  # noqa: E402

VERSION = "0.32.0"
WORDS = ("cache block token prompt model engine router pod index event stored removed hash prefix "
         "request replay socket stream memory server client score match chat system user assistant "
         "message question answer river mountain forest city garden window music light water green "
         "blue small large quick slow early late happy quiet bright dark warm cold read write build "
         "test measure compare publish subscribe evict store clear serve route send").split()


class Checks:
    def __init__(self):
        self.results = []

    def check(self, name, ok, detail=""):
        self.results.append((name, bool(ok), detail))
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    def failed(self):
        return [r for r in self.results if not r[1]]


def text_prompt(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words)) + "."


def block_hashes(token_ids):
    """vLLM's own hash chain (sha256_cbor, NONE_HASH from PYTHONHASHSEED=0), as event values."""
    parent, out = None, []
    for start in range(0, len(token_ids) - BLOCK_SIZE + 1, BLOCK_SIZE):
        parent = kv_cache_utils.hash_block_tokens(sha256_cbor, parent, token_ids[start:start + BLOCK_SIZE])
        out.append(kv_cache_utils.maybe_convert_block_hash(parent))
    return out


class EventIndex:
    """The simplest exact index: the set of block hashes the engine said it holds."""

    def __init__(self):
        self.held = set()
        self.applied = 0  # events consumed from the capture

    def apply(self, events):
        for e in events:
            if e["type"] == "BlockStored":
                self.held.update(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                self.held.difference_update(e["block_hashes"])
            elif e["type"] == "AllBlocksCleared":
                self.held.clear()
        self.applied += len(events)

    def predict(self, token_ids):
        """Tokens the engine will serve from cache: the held prefix, capped at len - 1 (the last
        token is always recomputed) and rounded down to whole blocks."""
        hashes = ["0x%016x" % h for h in block_hashes(token_ids)]
        n = 0
        while n < len(hashes) and hashes[n] in self.held:
            n += 1
        return min(n * BLOCK_SIZE, (len(token_ids) - 1) // BLOCK_SIZE * BLOCK_SIZE)


def prompt_ids_of(response):
    if response.get("prompt_token_ids") is not None:
        return response["prompt_token_ids"]
    return response["choices"][0].get("prompt_token_ids")


class Session:
    """One engine, its event capture, its index, and the requests sent to it."""

    def __init__(self, engine, capture, checks, name):
        self.engine, self.capture, self.checks, self.name = engine, capture, checks, name
        self.index = EventIndex()
        self.requests = []
        self.fence_rng = random.Random(f"fence-{name}")
        self.sent = []  # every prompt in order, fences too, and resets: what a replica must replay

    def fence(self):
        ok, tokens = fence(self.engine, self.capture, self.fence_rng)
        self.sent.append(("fence", tokens, None))
        return ok

    def reset(self):
        self.sent.append(("reset", None, None))
        return self.engine.reset_prefix_cache()

    def check_replica(self, replica):
        """vLLM's own KVCacheManager fed the same prompts must report the same cached tokens."""
        diffs = []
        for kind, tokens, got in self.sent:
            if kind == "reset":
                replica.reset()
                continue
            cached = replica.run(tokens)
            if kind == "request" and cached != got:
                diffs.append((cached, got))
        n = sum(1 for k, _, _ in self.sent if k == "request")
        self.checks.check(f"{self.name}: vLLM's KVCacheManager replica (no engine) gives the engine's cached_tokens "
                          f"for all {n} requests", not diffs, f"(replica, engine) differences: {diffs[:5]}")

    def send(self, label, kind, payload, expect_cached=None, **extra):
        """Sends one request; compares cached_tokens with the index's prediction (and with
        expect_cached when given); returns the response."""
        self.index.apply(self.capture.events(since=0)[self.index.applied:])
        seq_before = self.capture.count()
        body = dict(extra, return_token_ids=True)
        if kind == "chat":
            response = self.engine.chat(payload, **body)
        else:
            response = self.engine.completion(payload, **body)
        ids = prompt_ids_of(response)
        got = cached_tokens(response)
        self.sent.append(("request", ids, got))
        predicted = self.index.predict(ids)
        self.requests.append({
            "engine": self.name, "label": label, "endpoint": kind,
            # The request as sent (synthetic text): lets a tokenizer be checked against the engine's ids.
            "messages" if kind == "chat" else "prompt": payload, "prompt_token_ids": ids,
            "prompt_tokens": response["usage"]["prompt_tokens"], "cached_tokens": got,
            "predicted_cached_tokens": predicted, "live_messages_before": seq_before,
            "vllm_xargs": extra.get("vllm_xargs"),
        })
        detail = f"{len(ids)} prompt tokens, cached {got}, index predicts {predicted}"
        self.checks.check(f"{self.name}/{label}: index prediction == cached_tokens", got == predicted, detail)
        if expect_cached is not None:
            self.checks.check(f"{self.name}/{label}: cached_tokens == {expect_cached}", got == expect_cached, detail)
        self.checks.check(f"{self.name}/{label}: fence request's store arrived (all earlier events are in)", self.fence())
        return response, ids


def fence(engine, capture, rng, timeout_s=30.0):
    """Makes sure every event of the requests before it has arrived, so the next prediction sees
    them all: the response can come back before the SUB has the step's batch, and a request that
    only hits may still evict (BlockRemoved in its step). A fresh 33-token prompt stores one new
    block; one publisher's messages arrive in order, so once its BlockStored is here, everything
    published before it is too. (Its own evictions travel in the same batch.)"""
    tokens = [rng.randrange(3, 1024) for _ in range(BLOCK_SIZE + 1)]
    want = block_hashes(tokens)[0]
    since = capture.count()
    engine.completion(tokens, max_tokens=1)
    try:
        capture.wait_for(lambda e, _: e["type"] == "BlockStored" and want in
                         [int(h, 16) for h in e["block_hashes"] if h.startswith("0x")], timeout_s, since=since)
        return True, tokens
    except TimeoutError:
        return False, tokens


def stored_hashes(events):
    return [h for e in events if e["type"] == "BlockStored" for h in e["block_hashes"]]


def run_engine_a(args, structs, checks, records, requests):
    cfg = EngineConfig(http_port=args.http_port, kv_port=args.kv_port, dev_mode=True)
    capture = kv_capture.LiveCapture(f"tcp://127.0.0.1:{cfg.kv_port}", structs)
    engine = Engine(cfg)
    try:
        engine.start()
        ready = engine.wait_healthy(args.start_timeout)
        rss = engine.rss()
        print(f"engine A ready in {ready:.1f} s, RSS {rss / 2**30:.2f} GiB (sum over processes {engine.process_names()})",
              flush=True)
        s = Session(engine, capture, checks, "A")
        tok = AutoTokenizer.from_pretrained(cfg.model_dir)
        rng = random.Random(1)

        # 1. text completion, then the same again: a hit of all full blocks but the last token's.
        p1 = text_prompt(rng, 90)
        _, ids1 = s.send("text completion", "completion", p1, expect_cached=0)
        checks.check("A: engine's prompt ids == transformers' ids for the tiny model dir",
                     ids1 == tok(p1).input_ids, f"{len(ids1)} tokens")
        first = capture.events()[:-1]  # the last one is the fence's store
        tokens_in_events = [t for e in first if e["type"] == "BlockStored" for t in e["token_ids"]]
        checks.check("A: BlockStored token_ids == the prompt's full blocks",
                     tokens_in_events == ids1[: len(ids1) // BLOCK_SIZE * BLOCK_SIZE],
                     f"{len(tokens_in_events)} tokens in {len(first)} event(s)")
        checks.check("A: event hashes == vLLM hash_block_tokens(sha256_cbor) chain, low 64 bits",
                     stored_hashes(first) == ["0x%016x" % h for h in block_hashes(ids1)])
        e0 = first[0]
        checks.check("A: BlockStored carries block_size 32, group_idx 0, medium GPU",
                     (e0["block_size"], e0.get("group_idx"), e0.get("medium")) == (32, 0, "GPU"),
                     json.dumps({k: v for k, v in e0.items() if k not in ("token_ids", "block_hashes")}))

        before = capture.count()
        s.send("text completion again", "completion", p1, expect_cached=(len(ids1) - 1) // BLOCK_SIZE * BLOCK_SIZE)
        # A cache-only hit emits nothing: the only event after it is the fence's one-block store.
        after = capture.events(since=before)
        checks.check("A: a cache-only hit emits no event (only the fence's store follows)",
                     len(after) == 1 and after[0]["type"] == "BlockStored" and len(after[0]["block_hashes"]) == 1,
                     f"events after the hit: {[(e['type'], len(e.get('block_hashes') or [])) for e in after]}")

        # 2. token ids in, twice.
        t1 = [rng.randrange(3, 1024) for _ in range(100)]
        s.send("token-id completion", "completion", t1, expect_cached=0)
        s.send("token-id completion again", "completion", t1, expect_cached=96)

        # 3. chats sharing a system prompt.
        system = {"role": "system", "content": text_prompt(rng, 70)}
        chat1 = [system, {"role": "user", "content": text_prompt(rng, 12)}]
        _, c1 = s.send("chat 1", "chat", chat1)
        _, c2 = s.send("chat 2, same system prompt", "chat", [system, {"role": "user", "content": text_prompt(rng, 12)}])
        common = next((i for i, (a, b) in enumerate(zip(c1, c2)) if a != b), min(len(c1), len(c2)))
        checks.check("A: chat 2 hit == the common prefix's full blocks",
                     s.requests[-1]["cached_tokens"] == min(common, len(c2) - 1) // BLOCK_SIZE * BLOCK_SIZE,
                     f"common prefix {common} tokens")
        rendered = tok.apply_chat_template(chat1, add_generation_prompt=True, tokenize=True)
        rendered = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
        checks.check("A: engine's chat prompt ids == transformers' apply_chat_template ids", c1 == list(rendered),
                     f"{len(c1)} tokens")

        # 4. kv_cache_report_mode "full": a hit re-announces the hit blocks as BlockStored.
        before = capture.count()
        s.send("text completion, report mode full", "completion", p1,
               vllm_xargs={"kv_cache_report_mode": "full"})
        want = ["0x%016x" % h for h in block_hashes(ids1)][: (len(ids1) - 1) // BLOCK_SIZE]
        dup = capture.events(since=before)[:-1]  # the last one is the fence's store
        checks.check("A: report mode full re-announces the hit blocks as one duplicate BlockStored",
                     len(dup) == 1 and stored_hashes(dup) == want, f"{len(dup)} event(s), {len(stored_hashes(dup))} hashes")

        # 5. replay: everything from seq 0, from the middle, and past the end.
        live = {x["seq"]: f for f, x in capture.messages}
        for start in (0, max(live) // 2, max(live) + 1):
            req, replies = kv_capture.replay(f"tcp://127.0.0.1:{cfg.replay()}", start, structs)
            body = [(f, x) for f, x in replies if not x["end_of_replay"]]
            same = all(f[1:] == live[x["seq"]] for f, x in body)  # [topic, seq, payload] as live
            checks.check(f"A: replay from {start} returns the live messages {start}..{max(live)} unchanged, then the end marker",
                         [x["seq"] for _, x in body] == list(range(start, max(live) + 1)) and same
                         and replies[-1][1]["end_of_replay"], f"{len(body)} replies")
            for i, (f, x) in enumerate(replies):
                records.append(kv_capture.record(f, x, base=args.base("main", cfg), kind="replay", socket="DEALER",
                                                 replay_info={"exchange": [0, max(live) // 2, max(live) + 1].index(start),
                                                              "request_frames_hex": [r.hex() for r in req],
                                                              "start_seq": start, "reply_index": i}))

        # 6. reset_prefix_cache (dev mode): AllBlocksCleared arrives with the next step's batch.
        before = capture.count()
        s.reset()
        s.send("a new prompt after reset", "completion", text_prompt(rng, 60), expect_cached=0)
        batches = [x["events"] for _, x in capture.messages[before:]]
        checks.check("A: reset's AllBlocksCleared arrives first, in the same batch as the next step's stores",
                     bool(batches) and batches[0][0]["type"] == "AllBlocksCleared"
                     and any(e["type"] == "BlockStored" for e in batches[0]),
                     f"batches after reset: {[[e['type'] for e in b] for b in batches]}")
        s.send("text completion after reset", "completion", p1, expect_cached=0)
        # 1 GiB of KV cache is 1,048,576 token slots (engine log): 32768 blocks, never full here.
        s.check_replica(ManagerReplica([("full_attention", None)], num_blocks=32768, max_model_len=2048))

        for f, x in capture.messages:
            records.append(kv_capture.record(f, x, base=args.base("main", cfg), kind="live", socket="SUB"))
        requests.extend(s.requests)
    finally:
        engine.stop()
        capture.close()
    checks.check("A: no engine process left after stop", not engine.pids())


def run_engine_b(args, structs, checks, records, requests):
    # This engine dials our SUB (kvindex's bind mode); engine A is dialled (its PUB binds).
    cfg = EngineConfig(http_port=args.http_port + 1, kv_port=args.kv_port + 2, num_gpu_blocks_override=20,
                       max_model_len=512, pub_bind=False)
    capture = kv_capture.LiveCapture(f"tcp://127.0.0.1:{cfg.kv_port}", structs, bind=True)
    engine = Engine(cfg)
    try:
        engine.start()
        ready = engine.wait_healthy(args.start_timeout)
        print(f"engine B ready in {ready:.1f} s, RSS {engine.rss() / 2**30:.2f} GiB", flush=True)
        s = Session(engine, capture, checks, "B")
        rng = random.Random(2)
        # Chains of 3 to 5 full blocks (plus one token). With the fences between requests, this
        # order and these sizes leave prompt 2 cut short when it is repeated (found by running
        # the same sequence through ManagerReplica, which predicts this engine exactly).
        sizes = [4, 3, 5, 3, 3, 3]
        prompts = [[rng.randrange(3, 1024) for _ in range(n * BLOCK_SIZE + 1)] for n in sizes]
        for i, p in enumerate(prompts):
            s.send(f"distinct prompt {i} ({sizes[i]} blocks)", "completion", p)
        s.send("prompt 5 again (still held)", "completion", prompts[5], expect_cached=sizes[5] * BLOCK_SIZE)
        # Newest first: each repeat allocates a little and evicts from the oldest chain's tail, so
        # older chains are found cut short (in oldest-first order each repeat would evict the next).
        order = [4, 3, 2, 1, 0]
        for i in order:
            s.send(f"prompt {i} again", "completion", prompts[i])
        repeats = [(r["cached_tokens"], sizes[i] * BLOCK_SIZE) for i, r in zip(order, s.requests[-5:])]
        checks.check("B: some repeat was a partial hit (a chain cut short by tail-first eviction)",
                     any(0 < got < full for got, full in repeats), f"(cached, full) of the repeats: {repeats}")
        removed = [e for e in capture.events() if e["type"] == "BlockRemoved"]
        checks.check("B: evictions happened, one block per BlockRemoved",
                     bool(removed) and all(len(e["block_hashes"]) == 1 for e in removed), f"{len(removed)} BlockRemoved")
        # Tail first: no block is evicted while the next block of its chain is still held, so what
        # an engine holds of a chain is always a prefix of it.
        chains = [["0x%016x" % h for h in block_hashes(p)] for p in prompts]
        position = {h: (c, k) for c, chain in enumerate(chains) for k, h in enumerate(chain)}
        held, violations = set(), []
        for e in capture.events():
            if e["type"] == "BlockStored":
                held.update(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                for h in e["block_hashes"]:
                    c, k = position.get(h, (None, None))  # None: a fence block
                    if c is not None and k + 1 < len(chains[c]) and chains[c][k + 1] in held:
                        violations.append((c, k))
                    held.discard(h)
        checks.check("B: each chain is evicted tail first (what is held of a chain is a prefix of it)",
                     not violations, f"violations (chain, block): {violations[:5]}")
        s.check_replica(ManagerReplica([("full_attention", None)], num_blocks=20))
        for f, x in capture.messages:
            records.append(kv_capture.record(f, x, base=args.base("evict", cfg), kind="live", socket="SUB"))
        requests.extend(s.requests)
    finally:
        engine.stop()
        capture.close()
    checks.check("B: no engine process left after stop", not engine.pids())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, default=18100)
    p.add_argument("--kv-port", type=int, default=18557)
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--out", default=os.path.join(HERE, "captures"))
    p.add_argument("--only", choices=["A", "B"])
    args = p.parse_args()

    def base(scenario, cfg):
        kv = cfg.kv_events_config()
        return {"version": VERSION, "run": "real-engine", "pythonhashseed": cfg.hash_seed, "hash_algo": "sha256_cbor",
                "event_encoding": "array" if structs.kv_events.BlockStored.__struct_config__.array_like else "map",
                "scenario": scenario,
                "publisher": {"topic": cfg.topic_name(), "topic_configured": True, "data_parallel_rank": 0,
                              "endpoint": kv["endpoint"], "replay_endpoint": kv["replay_endpoint"],
                              "bound_endpoint": kv["endpoint"], "bound_replay_endpoint": kv["replay_endpoint"],
                              "int_block_hashes": True}}

    args.base = base
    kv_cache_utils.init_none_hash(sha256_cbor)
    structs = kv_capture.EngineStructs()
    checks, records, requests = Checks(), [], []
    t0 = time.monotonic()
    if args.only in (None, "A"):
        run_engine_a(args, structs, checks, records, requests)
    if args.only in (None, "B"):
        run_engine_b(args, structs, checks, records, requests)
    os.makedirs(args.out, exist_ok=True)
    suffix = "" if args.only is None else f"-{args.only}"
    with open(os.path.join(args.out, f"frames-{VERSION}-real{suffix}.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(args.out, f"requests-{VERSION}-real{suffix}.jsonl"), "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    failed = checks.failed()
    agree = sum(1 for r in requests if r["cached_tokens"] == r["predicted_cached_tokens"])
    over = sum(1 for r in requests if r["predicted_cached_tokens"] > r["cached_tokens"])
    print(f"smoke: {len(checks.results) - len(failed)} passed, {len(failed)} failed in {time.monotonic() - t0:.0f} s; "
          f"{len(records)} frames and {len(requests)} requests written to {args.out}")
    print(f"agreement {agree}/{len(requests)}, over-predicted {over}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
