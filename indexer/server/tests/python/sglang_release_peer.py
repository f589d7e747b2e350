"""Any installed SGLang release, and any DP rank, as a live peer (service_sglang_releases.rs).

sglang_peer.py loads `kv_events.py` from whichever `sglang` distribution comes first on
sys.path; the tests start this script with `PYTHONPATH=$KVINDEX_VENV/sglang-<version>` (each
release installed `--no-deps --target` by scripts/setup.sh), so that release's own module is the
one loaded. The stubs sglang_peer.py provides cover every release used here (0.5.5 and 0.5.6
import neither stubbed module, 0.5.19 and 0.5.20 only `NetworkAddress`).

Releases differ in what the engine does around the module, so this peer does it as each
release's engine does:
- the publisher is built as the scheduler builds it: `EventPublisherFactory.create(<the
  --kv-events-config JSON>, rank)`, the rank from `select_kv_publisher_dp_rank` where the
  release has it (0.5.19+), else the attention-DP rank (0.5.6's scheduler_metrics_mixin); the
  publisher itself offsets both its PUB and its replay port by that rank and stamps every batch
  with it;
- before 0.5.15 the radix cache records one BlockStored (and one BlockRemoved) per page and
  publishes no `medium` (0.5.6's `RadixCache._record_store_event`); from 0.5.15 a node's pages
  go in one event;
- 0.5.6's page id is `hash_str_to_int64(get_hash_str(page, prior))`: the same SHA-256 page chain
  sglang_peer.py computes (its hicache_storage module imports torch, so it is not loaded);
  0.5.5's is `hash(tuple(page))`, and its first page of every node has no parent.

`sgl_check_fleet` compares every chain of every named publisher with every named pod: a chain
another rank holds must score 0 here, so a rank read as another rank fails.
"""

import json
import os
import random
import sys
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_peer  # noqa: E402

kv = sglang_peer.kv
RELEASE = tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in sglang_peer.SGLANG_VERSION.split(".")[:3])
# 0.5.15 batched a node's pages into one event (the C++ hash binding came with it).
PAGE_PER_EVENT = RELEASE < (0, 5, 15)
# Before 0.5.6 a page's id is Python's `hash(tuple(page))` (not position-aware), and
# `_record_store_event` publishes the first page of every radix node with no parent (its test
# `node != self.root_node` is always true).
BUILTIN_HASH = RELEASE < (0, 5, 6)


def publisher_rank(attn_dp_size, attn_dp_rank, dp_rank):
    """The rank the scheduler offsets its publisher by (see the module doc)."""
    select = getattr(kv, "select_kv_publisher_dp_rank", None)
    return select(attn_dp_size, attn_dp_rank, dp_rank) if select else attn_dp_rank


def bound(sock):
    """The endpoint a socket bound or connected last, loopback for a wildcard host."""
    ep = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
    return ep.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:")


def binds_pub(endpoint):
    """The publisher's own heuristic (every release here): wildcard, IPC and inproc bind."""
    return any(w in endpoint for w in ("*", "::", "0.0.0.0")) or endpoint.startswith(("ipc://", "inproc://"))


class EnginePub(sglang_peer.SglangPub):
    """One scheduler's publisher, built and fed as that release's engine does."""

    def __init__(self, pod, config, page_size, rank):
        self.pod, self.page_size, self.config, self.rank = pod, page_size, config, rank
        self.salts = {}  # the shared fleet check reads each chain's salt: none here
        self.start()

    def start(self):
        offset = kv.ZmqEventPublisher.offset_endpoint_port
        endpoint = offset(self.config["endpoint"], self.rank)
        replay = offset(self.config.get("replay_endpoint"), self.rank)
        # A restart binds the old process's ports again, and ZeroMQ closes sockets
        # asynchronously: wait until every concrete port it will bind is free (a constructor
        # that bound the PUB and then failed on the replay port would keep the PUB's).
        binds = [e for e in (replay, endpoint if binds_pub(endpoint) else None) if e and e.startswith("tcp://") and not e.endswith(":*")]
        deadline = time.monotonic() + 10
        while not all(sglang_peer.port_free(e.replace("tcp://*:", "tcp://0.0.0.0:")) for e in binds):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.pub = kv.EventPublisherFactory.create(json.dumps(dict(self.config, publisher="zmq")), self.rank)
        self.pub._pub = sglang_peer.DroppingPub(self.pub._pub)
        self.sent = 0
        self.chains = {}

    def endpoints(self):
        replay = self.pub._replay
        return {"endpoint": bound(self.pub._pub), "replay_endpoint": bound(replay) if replay is not None else None}

    def restart(self):
        """A new process with the same --kv-events-config: seq from 0, an empty cache. A
        wildcard port is pinned to the one it got (rank 0 only: ranks above 0 need numbers)."""
        got = self.endpoints()
        self.pub.shutdown()
        for key in ("endpoint", "replay_endpoint"):
            if (self.config.get(key) or "").endswith(":*"):
                assert self.rank == 0, "a wildcard port cannot be offset by a rank"
                # A wildcard host keeps the PUB bound (the releases before 0.5.23 have no
                # `bind` option: a concrete host would connect).
                self.config[key] = "tcp://*:" + got[key].rsplit(":", 1)[1]
        self.start()

    def stored(self, hashes, parent, tokens, block_size):
        medium = {"medium": "GPU"} if "medium" in kv.BlockStored.__struct_fields__ else {}
        return kv.BlockStored(
            block_hashes=hashes, parent_block_hash=parent, token_ids=list(tokens), block_size=block_size, lora_id=None, **medium
        )

    def removed(self, hashes):
        medium = {"medium": "GPU"} if "medium" in kv.BlockRemoved.__struct_fields__ else {}
        return kv.BlockRemoved(block_hashes=hashes, **medium)

    def store(self, chain, tokens, partial=False, salt=None):
        """Extends `chain` to `tokens` as one radix node of the new whole pages (and the
        partial last page when `partial`), recorded as the release records a node. Unsalted
        only (`salt` is the shared command's argument; salted chains are sglang_peer's)."""
        assert salt is None, "the release peers publish unsalted chains only"
        p = self.page_size
        old_tokens, digests = self.chains.get(chain, ([], []))
        held = len(digests)
        assert tokens[: held * p] == old_tokens[: held * p], "a chain only grows from what it holds"
        whole = len(tokens) // p
        for i in range(held, whole):
            digests.append(sglang_peer.page_digest(digests[-1] if digests else None, tokens[i * p : (i + 1) * p]))
        ids = [sglang_peer.page_id(d) for d in digests]
        parent = ids[held - 1] if held else None
        pages = [(ids[i], tokens[i * p : (i + 1) * p]) for i in range(held, whole)]
        tail = tokens[whole * p :]
        if partial and tail:
            pages.append((sglang_peer.page_id(sglang_peer.page_digest(digests[-1] if digests else None, tail)), tail))
        if BUILTIN_HASH:
            pages = [(hash(tuple(page)), page) for _, page in pages]
            parent = None
        events = []
        if PAGE_PER_EVENT:
            for page_id, page in pages:
                events.append(self.stored([page_id], parent, page, len(page)))
                parent = page_id
        else:
            whole_pages = pages[: whole - held]
            if whole_pages:
                events.append(self.stored([i for i, _ in whole_pages], parent, [t for _, pg in whole_pages for t in pg], p))
            if len(pages) > len(whole_pages):
                events.append(self.stored([pages[-1][0]], ids[-1] if ids else None, pages[-1][1], len(pages[-1][1])))
        self.chains[chain] = (list(tokens), digests)
        return self.publish(events)

    def evict(self, chain, pages):
        """Leaf-first eviction of the last `pages` whole pages of `chain`."""
        tokens, digests = self.chains[chain]
        gone = [sglang_peer.page_id(d) for d in digests[len(digests) - pages :]]
        if BUILTIN_HASH:
            p = self.page_size
            gone = [hash(tuple(tokens[i * p : (i + 1) * p])) for i in range(len(digests) - pages, len(digests))]
        del digests[len(digests) - pages :]
        events = [self.removed([g]) for g in gone] if PAGE_PER_EVENT else [self.removed(gone)]
        return self.publish(events)


def consecutive_free_ports(n):
    """A port p with p..p+n-1 all free on loopback now (SGLang offsets ranks by +1 each).

    Drawn from 20000..32000, below Linux's ephemeral range (32768..60999), as the Rust tests'
    `free_port` does: a port the kernel hands out for bind(0) is also what it hands to the next
    outgoing connection of any test running beside this one, which then holds it before the
    publisher binds it."""
    for _ in range(2000):
        base = random.randrange(20000, 32000 - n)
        if all(sglang_peer.port_free(f"tcp://127.0.0.1:{base + i}") for i in range(n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports in 20000..32000")


class Peer(sglang_peer.Peer):
    def op_sgl_release(self):
        return {"version": sglang_peer.SGLANG_VERSION, "select_kv_publisher_dp_rank": hasattr(kv, "select_kv_publisher_dp_rank")}

    def op_free_ports(self, count, n):
        """`count` bases of `n` consecutive free ports each, disjoint."""
        bases = []
        while len(bases) < count:
            b = consecutive_free_ports(n)
            if all(abs(b - o) >= n for o in bases):
                bases.append(b)
        return {"bases": bases}

    def op_sgl_engine_start(
        self, name, pod, endpoint, replay_endpoint=None, topic="", page_size=1, attn_dp_size=1, attn_dp_rank=0, dp_rank=None
    ):
        """A scheduler with this --kv-events-config: attention-DP rank `attn_dp_rank` of
        `attn_dp_size`, or (`attn_dp_size` 1) data-parallel replica `dp_rank`."""
        config = {"endpoint": endpoint, "replay_endpoint": replay_endpoint, "topic": topic}
        rank = publisher_rank(attn_dp_size, attn_dp_rank, dp_rank)
        self.sgl[name] = EnginePub(pod, config, page_size, rank)
        return dict(self.sgl[name].endpoints(), rank=rank, version=sglang_peer.SGLANG_VERSION)

    def op_sgl_restart(self, name):
        self.sgl[name].restart()
        return self.sgl[name].endpoints()

    def op_sgl_check_fleet(self, names, model, block_size):
        """Every chain any named publisher holds, continued by one token (SGLang computes a
        prompt's last token), scored on every named pod: what that pod's publisher serves of it
        (0 for another rank's chain)."""
        violations, mismatches, scores = [], [], {}
        chains = {c: tokens + [0] for n in names for c, (tokens, _) in self.sgl[n].chains.items()}
        for n in names:
            p = self.sgl[n]
            for chain, tokens in chains.items():
                r = self.op_score(model, tokens, pods=[p.pod])
                if r.get("ok") is False:
                    return r
                matched = r["scores"][0]["matched_blocks"]
                held = p.held_blocks(chain, tokens, block_size)
                scores[f"{n}/{chain}"] = [matched, held]
                row = {"pod": p.pod, "chain": chain, "matched": matched, "held": held}
                if matched > held:
                    violations.append(row)
                if matched != held:
                    mismatches.append(row)
        return {"violations": violations, "mismatches": mismatches, "scores": scores}


def main():
    sglang_peer.kvpeer.Peer = Peer
    sglang_peer.kvpeer.main()


if __name__ == "__main__":
    main()
