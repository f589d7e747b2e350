"""SGLang's own KV-event publisher as an independent peer for kvindex's service tests.

Loads `sglang/srt/disaggregation/kv_events.py` unchanged from the installed PyPI wheel
(`pip install --no-deps sglang==<pinned>`, see scripts/setup.sh) with its two heavy imports
stubbed (`runtime_context.get_parallel`, `utils.network.NetworkAddress`: neither is used by
`ZmqEventPublisher.publish`/replay), and drives its `ZmqEventPublisher` (PUB + replay ROUTER, its
own seq numbering and replay buffer) with its own `BlockStored`/`BlockRemoved` structs. Page ids
follow SGLang 0.5.6+'s page hash (chained SHA-256 over little-endian u32 tokens, the id the
digest's first 8 bytes, big-endian, signed).

Each publisher keeps a reference of the pages its radix cache holds, so `sgl_check` compares
kvindex's score for every chain with what SGLang would serve (whole canonical blocks of held
whole pages) after every batch. Everything else (gRPC client, vLLM publishers for a mixed
fleet) is kvpeer.py's.
"""

import hashlib
import importlib.metadata
import importlib.util
import os
import socket
import sys
import time
import types

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvpeer  # noqa: E402


def load_sglang_kv_events():
    """The wheel's kv_events module, its parents as empty packages and two stubbed imports."""
    dist = importlib.metadata.distribution("sglang")
    path = str(dist.locate_file("sglang/srt/disaggregation/kv_events.py"))
    for name in ["sglang", "sglang.srt", "sglang.srt.disaggregation", "sglang.srt.utils"]:
        module = types.ModuleType(name)
        module.__path__ = []
        sys.modules.setdefault(name, module)
    runtime_context = types.ModuleType("sglang.srt.runtime_context")
    runtime_context.get_parallel = lambda: types.SimpleNamespace(pp_rank=0, attn_tp_rank=0, attn_cp_rank=0)
    sys.modules["sglang.srt.runtime_context"] = runtime_context
    network = types.ModuleType("sglang.srt.utils.network")

    class NetworkAddress:  # only describe_local_source uses it
        pass

    network.NetworkAddress = NetworkAddress
    sys.modules["sglang.srt.utils.network"] = network
    spec = importlib.util.spec_from_file_location("sglang.srt.disaggregation.kv_events", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module, dist.version


kv, SGLANG_VERSION = load_sglang_kv_events()


def page_digest(parent, tokens):
    h = hashlib.sha256()
    if parent is not None:
        h.update(parent)
    for t in tokens:
        h.update(int(t).to_bytes(4, "little"))
    return h.digest()


def salt_seed(salt):
    """The event chain's seed for a salted request (0.5.19+, `mem_cache/utils.py`)."""
    return None if salt is None else hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode("utf-8")).digest()


def page_id(digest):
    return int.from_bytes(digest[:8], "big", signed=True)


def port_free(endpoint):
    """Whether `tcp://host:port` can be bound now (as ZeroMQ binds: SO_REUSEADDR)."""
    host, port = endpoint[len("tcp://") :].rsplit(":", 1)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
            return True
        except OSError:
            return False


class DroppingPub:
    """The publisher's PUB socket with the next `n` sends lost on the wire (the replay buffer
    still holds them, as after a HWM drop)."""

    def __init__(self, sock):
        self.sock, self.drop = sock, 0

    def send_multipart(self, frames, *a, **kw):
        if self.drop > 0:
            self.drop -= 1
            return None
        return self.sock.send_multipart(frames, *a, **kw)

    def __getattr__(self, name):
        return getattr(self.sock, name)


class SglangPub:
    def __init__(self, pod, endpoint, replay_endpoint, topic, page_size, dp_rank, bind):
        self.args = (endpoint, replay_endpoint, topic, dp_rank, bind)
        self.pod, self.page_size = pod, page_size
        self.start()

    def start(self):
        endpoint, replay_endpoint, topic, dp_rank, bind = self.args
        # A restart binds the old process's ports again; ZeroMQ closes sockets asynchronously,
        # so the port may still be held for a moment (a real restart retries likewise).
        deadline = time.monotonic() + 10
        bound = [e for e in (endpoint, replay_endpoint) if e and e.startswith("tcp://") and not e.endswith(":*")]
        if bind or replay_endpoint:
            # Both ports free first: a constructor that bound the PUB and then failed on the
            # replay port would keep the PUB's port.
            while not all(port_free(e) for e in bound if e == replay_endpoint or bind):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        while True:
            try:
                self.pub = kv.ZmqEventPublisher(
                    attn_dp_rank=dp_rank, endpoint=endpoint, replay_endpoint=replay_endpoint, topic=topic, bind=bind
                )
                break
            except zmq.ZMQError as e:
                if e.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        self.pub._pub = DroppingPub(self.pub._pub)
        self.sent = 0
        # chain name -> (tokens, digests of the whole pages held, in order)
        self.chains = {}
        # chain name -> its requests' cache salt (absent: unsalted)
        self.salts = {}

    def endpoints(self):
        return {"endpoint": self.pub._local_pub_endpoint, "replay_endpoint": self.pub._local_replay_endpoint}

    def publish(self, events):
        self.pub.publish(kv.KVEventBatch(ts=time.time(), events=events))
        self.pub._event_queue.join()  # sent (or dropped) by the publisher's own thread
        self.sent += 1
        return self.sent - 1

    def store(self, chain, tokens, partial=False, salt=None):
        """Extends `chain` to `tokens`: one BlockStored of the new whole pages (a radix node),
        and SGLang's partial last page as its own store when `partial` and the tokens leave one.
        A `salt` (the chain's requests' cache salt) seeds the chain, as SGLang 0.5.19+ does."""
        p = self.page_size
        salt = self.salts.setdefault(chain, salt)
        seed = salt_seed(salt)
        old_tokens, digests = self.chains.get(chain, ([], []))
        held = len(digests)
        assert tokens[: held * p] == old_tokens[: held * p], "a chain only grows from what it holds"
        whole = len(tokens) // p
        for i in range(held, whole):
            digests.append(page_digest(digests[-1] if digests else seed, tokens[i * p : (i + 1) * p]))
        events = []
        if whole > held:
            events.append(
                kv.BlockStored(
                    block_hashes=[page_id(d) for d in digests[held:]],
                    parent_block_hash=page_id(digests[held - 1]) if held else None,
                    token_ids=list(tokens[held * p : whole * p]),
                    block_size=p,
                    lora_id=None,
                    medium="GPU",
                    cache_salt=salt,
                )
            )
        tail = tokens[whole * p :]
        if partial and tail:
            events.append(
                kv.BlockStored(
                    block_hashes=[page_id(page_digest(digests[-1] if digests else seed, tail))],
                    parent_block_hash=page_id(digests[-1]) if digests else None,
                    token_ids=list(tail),
                    block_size=len(tail),
                    lora_id=None,
                    medium="GPU",
                    cache_salt=salt,
                )
            )
        self.chains[chain] = (list(tokens), digests)
        return self.publish(events)

    def evict(self, chain, pages):
        """Leaf-first eviction of the last `pages` whole pages of `chain`."""
        tokens, digests = self.chains[chain]
        gone = digests[len(digests) - pages :]
        del digests[len(digests) - pages :]
        return self.publish([kv.BlockRemoved(block_hashes=[page_id(d) for d in gone], medium="GPU")])

    def held_blocks(self, chain, tokens, block_size):
        """Canonical blocks of `tokens` SGLang would serve: whole held pages of at most the
        prompt's tokens minus one (SGLang computes the last token), whole blocks."""
        held_tokens, digests = self.chains.get(chain, ([], []))
        n = 0
        while n < len(digests) and (n + 1) * self.page_size <= len(tokens) - 1:
            if held_tokens[n * self.page_size : (n + 1) * self.page_size] != tokens[n * self.page_size : (n + 1) * self.page_size]:
                break
            n += 1
        return (n * self.page_size) // block_size


class Peer(kvpeer.Peer):
    def __init__(self, proto):
        super().__init__(proto)
        self.sgl = {}

    def op_sgl_start(self, name, pod, endpoint, replay_endpoint=None, topic="", page_size=1, dp_rank=0, bind=None):
        self.sgl[name] = SglangPub(pod, endpoint, replay_endpoint, topic, page_size, dp_rank, bind)
        return dict(self.sgl[name].endpoints(), version=SGLANG_VERSION)

    def op_sgl_store(self, name, chain, tokens, partial=False, salt=None):
        return {"seq": self.sgl[name].store(chain, tokens, partial, salt)}

    def op_sgl_evict(self, name, chain, pages):
        return {"seq": self.sgl[name].evict(chain, pages)}

    def op_sgl_ping(self, name):
        """An empty batch: a seq the indexer can be seen to reach."""
        return {"seq": self.sgl[name].publish([])}

    def op_sgl_drop_next(self, name, n=1):
        self.sgl[name].pub._pub.drop = n
        return {}

    def op_sgl_restart(self, name):
        """A new SGLang process on the same endpoints: seq from 0, an empty cache."""
        p = self.sgl[name]
        bound = p.endpoints()
        p.pub.shutdown()
        _, _, topic, dp_rank, bind = p.args
        if bind or p.args[0].startswith("ipc://"):
            # The same addresses again (a bound wildcard port is the one it got).
            p.args = (bound["endpoint"], bound["replay_endpoint"] or p.args[1], topic, 0, bind)
        elif bound["replay_endpoint"]:
            p.args = (p.args[0], bound["replay_endpoint"], topic, dp_rank, bind)
        p.start()
        return p.endpoints()

    def op_sgl_info(self, names):
        return {"pubs": {n: {"pod": self.sgl[n].pod, "last_seq": self.sgl[n].sent - 1} for n in names}}

    def op_sgl_check(self, names, model, block_size):
        """kvindex's score of every chain against what each SGLang publisher would serve of a
        prompt continuing it by one token (so every page of the chain can be served: SGLang
        computes a prompt's last token)."""
        violations, mismatches, states, scores = [], [], {}, {}
        for n in names:
            p = self.sgl[n]
            for chain, (tokens, _) in p.chains.items():
                tokens = tokens + [0]
                r = self.op_score(model, tokens, pods=[p.pod], cache_salt=p.salts.get(chain) or "")
                if r.get("ok") is False:
                    return r
                s = r["scores"][0]
                held = p.held_blocks(chain, tokens, block_size)
                states[p.pod] = s["state"]
                scores[f"{n}/{chain}"] = [s["matched_blocks"], held]
                if s["matched_blocks"] > held:
                    violations.append({"pod": p.pod, "chain": chain, "matched": s["matched_blocks"], "held": held})
                if s["matched_blocks"] != held:
                    mismatches.append({"pod": p.pod, "chain": chain, "matched": s["matched_blocks"], "held": held})
        return {"violations": violations, "mismatches": mismatches, "states": states, "scores": scores}


def main():
    kvpeer.Peer = Peer
    kvpeer.main()


if __name__ == "__main__":
    main()
