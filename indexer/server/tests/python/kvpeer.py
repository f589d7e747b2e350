"""Independent peers for kvindex's service tests, driven over stdin/stdout (one JSON per line).

Nothing here uses kvindex's own code: publishers are pyzmq sockets that send vLLM's frames
(`[topic, seq_be8, payload]`) with payloads captured from vLLM or encoded with msgspec using
vLLM's own struct shapes (0.33.0 map form); the replay socket is a ROUTER that answers a DEALER
as vLLM's publisher does (both reply layouts); queries go through a grpcio client generated at
start-up from proto/kvindex/v1/indexer.proto. Each publisher also keeps the reference of what
its engine holds, so `check` can assert that the indexer never credits a block the publisher
does not hold.

Publishers use XPUB (wire-identical to PUB for the subscriber) only to learn when the
subscription has arrived, so tests never sleep-and-hope.

A gRPC client may reach the server through a TCP relay whose connections leave from another
loopback address (`grpc` with `source`), so one host can play two callers; `flood` plays many
clients sending large queries at once.
"""

import collections
import hashlib
import importlib
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time

import grpc
import msgspec
import zmq
from grpc_tools import protoc

# ---- vLLM 0.33.0 event structs (vllm/distributed/kv_events.py), map-form events -------------


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


ENCODER = msgspec.msgpack.Encoder()
END_SEQ = (-1).to_bytes(8, "big", signed=True)
CTX = zmq.Context.instance()


def chain_hash(parent, tokens):
    h = hashlib.blake2b(digest_size=8)
    h.update(b"root" if parent is None else parent.to_bytes(8, "big"))
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return int.from_bytes(h.digest(), "big")


def bind_retrying(sock, endpoint):
    """Binds `sock` on `endpoint` (a just-closed port can take a moment to free); returns the
    endpoint bound."""
    for attempt in range(100):
        try:
            sock.bind(endpoint)
            break
        except zmq.ZMQError:
            if attempt == 99:
                raise
            time.sleep(0.05)
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()


class Publisher:
    """One engine: a PUB-compatible socket, an optional replay ROUTER, and the reference of
    which blocks its engine holds."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.pod = cfg["pod"]
        self.topic = cfg.get("topic", "").encode()
        self.block_size = cfg.get("block_size", 16)
        self.dp_rank = cfg.get("dp_rank", 0)
        self.buffer_steps = cfg.get("buffer_steps", 10000)
        self.replay_topic_frame = cfg.get("replay_topic_frame", True)
        # The engine's clock, as seconds from ours (a skewed host); `frozen_ts`, when set, is
        # the `ts` every batch carries (made all at once, reaching us only now: a backlog).
        self.ts_offset = cfg.get("ts_offset", 0.0)
        self.frozen_ts = None
        self.lock = threading.Lock()
        self.chains = {}  # name -> tokens (what `check` queries)
        self.pub_ep = None
        self.replay_ep = None
        self.open()

    def open(self, connect=True):
        """A new process. `connect` false (or `bind_later` in the config): its live socket is
        neither connected nor bound until `plug`; what it publishes until then reaches no one."""
        self.seq = 0
        self.held = {}  # hash -> (parent, tokens)
        self.buffer = collections.deque(maxlen=self.buffer_steps)
        self.sock = None
        if connect and not self.cfg.get("bind_later"):
            self.plug()
        elif "connect" in self.cfg:
            self.pub_ep = self.cfg["connect"]
        else:
            self.pub_ep = self.pub_ep or self.cfg["bind"]
        self.router = None
        self.stop = threading.Event()
        if self.cfg.get("replay"):
            self.router = CTX.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.replay_ep = bind_retrying(self.router, self.replay_ep or self.cfg["replay"])
            self.thread = threading.Thread(target=self.serve_replay, daemon=True)
            self.thread.start()
        self.subscribed = False

    def plug(self):
        """A live socket of this process: connected to `connect`, or bound on `bind` (the same
        endpoint again after `unplug`)."""
        self.sock = CTX.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 1_000_000)
        self.subscribed = False
        if "connect" in self.cfg:
            self.pub_ep = self.cfg["connect"]
            self.sock.connect(self.cfg["connect"])
            return
        self.pub_ep = bind_retrying(self.sock, self.pub_ep or self.cfg["bind"])

    def unplug(self):
        """The live socket closes (its connections go); the process (its seq, blocks and replay
        socket) goes on, publishing to no one until `plug`."""
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None

    def reconnect(self):
        """A network blip: the live connection is replaced by a new one; the process (its seq,
        blocks and replay buffer) goes on."""
        self.unplug()
        self.plug()

    def close(self):
        self.stop.set()
        if self.router is not None:
            self.thread.join()
            self.router.close(0)
        self.unplug()

    def serve_replay(self):
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stop.is_set():
            if not poller.poll(20):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM: "Invalid replay request"
            ident, _, start = frames
            start = int.from_bytes(start, "big")
            if self.cfg.get("replay_delay_ms"):
                time.sleep(self.cfg["replay_delay_ms"] / 1000)  # a slow engine: it answers late
            with self.lock:
                items = [(s, p) for s, p in self.buffer if s >= start]
            for s, p in items:
                if self.replay_topic_frame:
                    self.router.send_multipart([ident, b"", self.topic, s.to_bytes(8, "big"), p])
                else:
                    self.router.send_multipart([ident, b"", s.to_bytes(8, "big"), p])
            if self.replay_topic_frame:
                self.router.send_multipart([ident, b"", b"", END_SEQ, b""])
            else:
                self.router.send_multipart([ident, b"", END_SEQ, b""])

    def wait_sub(self, timeout, fresh=False):
        """Waits for a subscription. `fresh`: a new one, from a restarted server (the first
        server's was consumed by the first wait), so nothing published from here on is lost to
        ZeroMQ's slow joiner."""
        deadline = time.time() + timeout
        if fresh:
            self.subscribed = False
        while self.sock is not None and not self.subscribed and time.time() < deadline:
            if self.sock.poll(50):
                msg = self.sock.recv()
                if msg[:1] == b"\x01":
                    self.subscribed = True
        return self.subscribed

    def send(self, payload, drop=False, seq=None, topic=None):
        with self.lock:
            s = self.seq if seq is None else seq
            self.seq = s + 1
            self.buffer.append((s, payload))
        if not drop and self.sock is not None:
            self.sock.send_multipart([self.topic if topic is None else topic, s.to_bytes(8, "big"), payload])
        return s

    def batch(self, events):
        ts = self.frozen_ts if self.frozen_ts is not None else time.time() + self.ts_offset
        return ENCODER.encode(KVEventBatch(ts=ts, events=events, data_parallel_rank=self.dp_rank))

    def store(self, chain, tokens, start, n, drop=False, medium="GPU"):
        bs = self.block_size
        self.chains[chain] = tokens
        parent = None
        hashes = []
        for i in range(start + n):
            h = chain_hash(parent, tokens[i * bs:(i + 1) * bs])
            if i >= start:
                hashes.append(h)
                self.held[h] = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
            else:
                first_parent = h
            parent = h
        ev = BlockStored(
            block_hashes=hashes,
            parent_block_hash=first_parent if start > 0 else None,
            token_ids=tokens[start * bs:(start + n) * bs],
            block_size=bs,
            lora_id=None,
            medium=medium,
            lora_name=None,
            extra_keys=[None] * n,
            group_idx=0,
        )
        return self.send(self.batch([ev]), drop=drop)

    def remove(self, tokens, blocks, drop=False):
        bs = self.block_size
        parent = None
        hashes = []
        for i in range(max(blocks) + 1):
            h = chain_hash(parent, tokens[i * bs:(i + 1) * bs])
            if i in blocks:
                hashes.append(h)
                self.held.pop(h, None)
            parent = h
        evs = [BlockRemoved(block_hashes=[h], medium="GPU", group_idx=0) for h in hashes]
        return self.send(self.batch(evs), drop=drop)

    def clear(self, drop=False):
        self.held.clear()
        return self.send(self.batch([AllBlocksCleared()]), drop=drop)

    def held_prefix(self, tokens):
        bs = self.block_size
        parent = None
        n = 0
        for i in range(len(tokens) // bs):
            h = chain_hash(parent, tokens[i * bs:(i + 1) * bs])
            if h not in self.held:
                break
            n += 1
            parent = h
        return n


class Relay:
    """Forwards every connection made to it to `target`, from the local address `source`
    (e.g. 127.0.0.2: Linux gives the whole 127/8 to loopback), so the server sees a peer address
    other than 127.0.0.1. Bytes pass unchanged both ways."""

    def __init__(self, target, source):
        host, port = target.rsplit(":", 1)
        self.target, self.source = (host, int(port)), source
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(self.target, source_address=(self.source, 0))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    @staticmethod
    def pump(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            try:
                b.shutdown(socket.SHUT_WR)
            except OSError:
                pass


class Peer:
    def __init__(self, proto):
        out = tempfile.mkdtemp(prefix="kvindex-stubs-")
        root = os.path.dirname(os.path.dirname(os.path.dirname(proto)))
        rel = os.path.relpath(proto, root)
        rc = protoc.main(["grpc_tools.protoc", f"-I{root}", f"--python_out={out}", f"--grpc_python_out={out}", rel])
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on {proto}")
        sys.path.insert(0, out)
        self.pb = importlib.import_module("kvindex.v1.indexer_pb2")
        self.pb_grpc = importlib.import_module("kvindex.v1.indexer_pb2_grpc")
        sys.path.remove(out)
        shutil.rmtree(out, ignore_errors=True)  # both modules are loaded; nothing stays behind
        self.pubs = {}
        self.stub = None

    # --- gRPC -----------------------------------------------------------------------------
    def op_grpc(self, addr, source=None):
        """A plain channel to `addr`; with `source`, through a [`Relay`] from that address."""
        self.addr = addr
        if source:
            self.relay = Relay(addr, source)
            addr = self.relay.addr
        self.channel = grpc.insecure_channel(addr)
        self.stub = self.pb_grpc.IndexerStub(self.channel)
        grpc.channel_ready_future(self.channel).result(timeout=10)
        return {}

    def op_grpc_tls(self, addr, ca, cert=None, key=None, timeout=10):
        """A TLS channel (mTLS with `cert` and `key`), trusting the PEM CA `ca`; the server's
        certificate names `localhost`. Returns whether the channel became ready."""
        read = lambda path: open(path, "rb").read() if path else None
        creds = grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key), certificate_chain=read(cert))
        self.channel = grpc.secure_channel(addr, creds, options=[("grpc.ssl_target_name_override", "localhost")])
        self.stub = self.pb_grpc.IndexerStub(self.channel)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
            return {"ready": True}
        except grpc.FutureTimeoutError:
            return {"ready": False}

    def op_score(self, model, tokens, pods=(), lora_name="", cache_salt=""):
        req = self.pb.ScoreTokensRequest(model=model, token_ids=tokens, pods=list(pods), lora_name=lora_name, cache_salt=cache_salt)
        try:
            r = self.stub.ScoreTokens(req, timeout=10)
        except grpc.RpcError as e:
            return {"ok": False, "code": e.code().name, "details": e.details()}
        return {
            "total_blocks": r.total_blocks,
            "block_size": r.block_size,
            # Routers' reserved load per pod (RecordRoute reservations); None while they are off.
            "in_flight": {p.pod: [p.requests, p.prefill_blocks] for p in r.in_flight.pods} if r.HasField("in_flight") else None,
            "scores": [
                {
                    "pod": s.pod,
                    "matched_blocks": s.matched_blocks,
                    "weighted_score": s.weighted_score,
                    "matched_by_tier": dict(s.matched_by_tier),
                    "state": self.pb.SourceState.Name(s.state),
                    "speculative_blocks": s.speculative_blocks,
                }
                for s in r.scores
            ],
        }

    def op_health(self):
        """grpc.health.v1 Check with an empty service name, over a raw method (no extra package)."""
        call = self.channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b, response_deserializer=lambda b: b)
        resp = call(b"", timeout=10)
        return {"serving": resp == b"\x08\x01"}

    def op_reflect(self):
        """grpc.reflection.v1 list_services, over a raw streaming method."""
        call = self.channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        replies = list(call(iter([b"\x3a\x00"]), timeout=10))
        return {"raw": b"".join(replies).decode("latin-1")}

    def op_record_route(self, pod="", model="", tokens=(), ttl_ms=0, lora_name="", cache_salt="", token=None, reservations=()):
        """RecordRoute with the test's bearer token unless `token` says otherwise ("" = none);
        `reservations`: [{"pod", "request_id", "prefill_blocks", "ttl_ms"}]."""
        req = self.pb.RecordRouteRequest(pod=pod, model=model, token_ids=tokens, ttl_ms=ttl_ms, lora_name=lora_name, cache_salt=cache_salt,
                                         reservations=[self.pb.Reservation(**r) for r in reservations])
        try:
            r = self.stub.RecordRoute(req, timeout=10, metadata=self.auth(token))
        except grpc.RpcError as e:
            return {"ok": False, "code": e.code().name, "details": e.details()}
        return {"credited_blocks": r.credited_blocks, "ttl_ms": r.ttl_ms, "reserved": r.reserved, "reservation_ttl_ms": r.reservation_ttl_ms}

    def op_release_route(self, releases, token=None):
        """ReleaseRoute of `releases` ([request_id, "prefill" | "request" | <raw part number>])."""
        parts = {"prefill": self.pb.RELEASE_PREFILL, "request": self.pb.RELEASE_REQUEST}
        req = self.pb.ReleaseRouteRequest(releases=[self.pb.Release(request_id=i, part=parts.get(p, p)) for i, p in releases])
        try:
            r = self.stub.ReleaseRoute(req, timeout=10, metadata=self.auth(token))
        except grpc.RpcError as e:
            return {"ok": False, "code": e.code().name, "details": e.details()}
        return {"released": r.released}

    def op_score_units(self, model, tokens, pods=()):
        """The unit (tokens) each scored pod is credited in (`PodScore.credit_unit_tokens`)."""
        req = self.pb.ScoreTokensRequest(model=model, token_ids=tokens, pods=list(pods))
        r = self.stub.ScoreTokens(req, timeout=10)
        return {"units": [s.credit_unit_tokens for s in r.scores]}

    def op_score_pod_many(self, model, pod, prompts):
        """Matched blocks and state of `pod` for each prompt (one round trip for many queries)."""
        out = []
        for tokens in prompts:
            r = self.op_score(model, tokens, pods=[pod])
            if r.get("ok") is False:
                return r
            s = r["scores"][0] if r["scores"] else {"matched_blocks": 0, "state": "UNKNOWN"}
            out.append([s["matched_blocks"], s["state"]])
        return {"scores": out}

    def op_topics_flood(self, name, prefix, n, model, seq=0, first=0, empty=False):
        """Publishes one store on each of `n` made-up topics `kv@<prefix><i>@<model>` (`i` from
        `first`; a peer trying to fill the source table), all at `seq`; with `empty`, a batch of
        no events instead (a stream that talks and holds nothing)."""
        p = self.pubs[name]
        tokens = list(range(1, p.block_size + 1))
        ev = BlockStored(block_hashes=[chain_hash(None, tokens)], parent_block_hash=None, token_ids=tokens,
                         block_size=p.block_size, lora_id=None, medium="GPU", lora_name=None, extra_keys=[None], group_idx=0)
        payload = p.batch([] if empty else [ev])
        for i in range(first, first + n):
            p.sock.send_multipart([f"kv@{prefix}{i}@{model}".encode(), seq.to_bytes(8, "big"), payload])
        return {}

    def op_hold_half_open(self, target, count, source="127.0.0.2"):
        """An attacker: keeps `count` TCP connections from `source` to `target` (host:port)
        open without ever sending a byte (no ZMTP greeting), reopening any the server closes,
        until `release_half_open` (which ends every holder started so far)."""
        import selectors
        import socket

        host, port = target.rsplit(":", 1)
        stop = threading.Event()
        opened = [0]

        def dial():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((source, 0))
            s.setblocking(False)
            s.connect_ex((host, int(port)))
            opened[0] += 1
            return s

        def run():
            sel = selectors.DefaultSelector()
            for _ in range(count):
                sel.register(dial(), selectors.EVENT_READ)
            while not stop.is_set():
                for key, _ in sel.select(timeout=0.01):
                    try:
                        data = key.fileobj.recv(4096)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if data:
                        continue  # the server's greeting: never answered
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    sel.register(dial(), selectors.EVENT_READ)
            for key in list(sel.get_map().values()):
                key.fileobj.close()

        holder = (stop, threading.Thread(target=run, daemon=True), opened)
        holder[1].start()
        self.half_opens = getattr(self, "half_opens", []) + [holder]
        return {}

    def op_release_half_open(self):
        total = 0
        for stop, thread, opened in getattr(self, "half_opens", []):
            stop.set()
            thread.join()
            total += opened[0]
        self.half_opens = []
        return {"opened": total}

    def op_score_raw(self, model, n_tokens, pods=()):
        return self.op_score(model, list(range(n_tokens)), pods)

    def op_flood(self, model, large, small, concurrency, clients=8, secs=60):
        """Overload: `concurrency` ScoreTokens of the `large` tokens in flight at once, spread
        over `clients` channels (connections), round after round; while a round is in flight this
        channel sends the `small` prompt, one query after another. Stops once some large queries
        were answered and some shed (RESOURCE_EXHAUSTED), or after `secs`. Returns the status
        codes seen for each kind, and the first message of each non-OK code."""
        raw = self.pb.ScoreTokensRequest(model=model, token_ids=large).SerializeToString()
        channels = [grpc.insecure_channel(self.addr) for _ in range(clients)]
        calls = [
            ch.unary_unary("/kvindex.v1.Indexer/ScoreTokens", request_serializer=lambda b: b, response_deserializer=lambda b: b)
            for ch in channels
        ]
        small_req = self.pb.ScoreTokensRequest(model=model, token_ids=small)
        codes = {"large": collections.Counter(), "small": collections.Counter()}
        messages = {}
        rounds, deadline = 0, time.monotonic() + secs

        def seen(kind, error):
            code = "OK" if error is None else error.code().name
            codes[kind][code] += 1
            if error is not None:
                messages.setdefault(f"{kind} {code}", error.details())

        while True:
            rounds += 1
            futures = [calls[i % clients].future(raw, timeout=120) for i in range(concurrency)]
            while not all(f.done() for f in futures):
                try:
                    self.stub.ScoreTokens(small_req, timeout=30)
                    seen("small", None)
                except grpc.RpcError as e:
                    seen("small", e)
            for f in futures:
                seen("large", f.exception())
            large = codes["large"]
            if (large["OK"] and large["RESOURCE_EXHAUSTED"] and codes["small"]) or time.monotonic() > deadline:
                break
        for ch in channels:
            ch.close()
        return {"rounds": rounds, "large": dict(codes["large"]), "small": dict(codes["small"]), "messages": messages}

    @staticmethod
    def auth(token):
        """Call metadata for the control plane: the test's bearer token (KVPEER_ADMIN_TOKEN)
        unless `token` says otherwise ("" = none)."""
        token = os.environ.get("KVPEER_ADMIN_TOKEN", "") if token is None else token
        return [("authorization", f"Bearer {token}")] if token else []

    def op_register(self, token=None, **kw):
        try:
            self.stub.RegisterPod(self.pb.RegisterPodRequest(**kw), timeout=10, metadata=self.auth(token))
        except grpc.RpcError as e:
            return {"ok": False, "code": e.code().name, "details": e.details()}
        return {}

    def op_unregister(self, pod, token=None):
        try:
            r = self.stub.UnregisterPod(self.pb.UnregisterPodRequest(pod=pod), timeout=10, metadata=self.auth(token))
        except grpc.RpcError as e:
            return {"ok": False, "code": e.code().name, "details": e.details()}
        return {"existed": r.existed}

    # --- publishers ------------------------------------------------------------------------
    def op_pub_start(self, name, **cfg):
        p = Publisher(cfg)
        self.pubs[name] = p
        return {"endpoint": p.pub_ep, "replay_endpoint": p.replay_ep}

    def op_wait_sub(self, names, timeout=20, fresh=False):
        return {"subscribed": all(self.pubs[n].wait_sub(timeout, fresh) for n in names)}

    def op_store(self, name, chain, tokens, start=0, n=None, drop=False, medium="GPU", block_size=None):
        """`block_size`: this store's engine blocks are of that size (the publisher's from now on)."""
        p = self.pubs[name]
        if block_size is not None:
            p.block_size = block_size
        n = len(tokens) // p.block_size - start if n is None else n
        return {"seq": p.store(chain, tokens, start, n, drop, medium)}

    def op_remove(self, name, tokens, blocks, drop=False):
        return {"seq": self.pubs[name].remove(tokens, set(blocks), drop)}

    def op_clear(self, name, drop=False):
        return {"seq": self.pubs[name].clear(drop)}

    def op_malformed(self, name):
        return {"seq": self.pubs[name].send(b"\xc1not msgpack at all")}

    def op_bad_frames(self, name):
        p = self.pubs[name]
        p.sock.send_multipart([p.topic, b"\x00\x01"])  # 2 frames
        p.sock.send_multipart([p.topic, b"\x00\x01", b"\x90"])  # seq frame of 2 bytes
        return {}

    def op_raw(self, name, frames_hex, drop=False):
        p = self.pubs[name]
        topic, seq, payload = (bytes.fromhex(f) for f in frames_hex)
        return {"seq": p.send(payload, drop=drop, seq=int.from_bytes(seq, "big"), topic=topic)}

    def op_restart(self, name, connect_later=False, block_size=None):
        """A new process: seq from 0, nothing held, empty replay buffer. With `connect_later`,
        it publishes unconnected (messages lost on the wire) until `connect` (a bound one: until
        `plug`). With `block_size`, the new process stores engine blocks of that size."""
        p = self.pubs[name]
        if block_size is not None:
            p.block_size = block_size
        p.close()
        p.open(connect=not connect_later)
        return {"endpoint": p.pub_ep, "replay_endpoint": p.replay_ep}

    def op_reconnect(self, name):
        self.pubs[name].reconnect()
        return {}

    def op_unplug(self, name):
        self.pubs[name].unplug()
        return {}

    def op_plug(self, name):
        p = self.pubs[name]
        p.plug()
        return {"endpoint": p.pub_ep}

    def op_connect(self, name):
        p = self.pubs[name]
        if p.sock is None:
            p.plug()
        else:
            p.sock.connect(p.cfg["connect"])
        return {}

    def op_stop(self, name):
        self.pubs.pop(name).close()
        return {}

    def op_info(self, names):
        return {"pubs": {n: {"pod": self.pubs[n].pod, "last_seq": self.pubs[n].seq - 1} for n in names}}

    def op_held(self, name, tokens):
        return {"held": self.pubs[name].held_prefix(tokens)}

    def op_pace(self, name, n, interval_ms, frozen_ts=None):
        """`n` stores of one new block each, `interval_ms` apart (an engine under steady load;
        the pause is its pace, not a wait for the server). `frozen_ts`: every one carries this
        `ts` (see `Publisher.frozen_ts`)."""
        p = self.pubs[name]
        p.frozen_ts = frozen_ts
        for _ in range(n):
            k = p.seq
            tokens = [(k * 7919 + j) % 150000 + 1 for j in range(p.block_size)]
            p.store(f"pace-{k}", tokens, 0, 1)
            time.sleep(interval_ms / 1000)
        return {"last_seq": p.seq - 1}

    def op_burst(self, names, chains, blocks, model, prepared=False):
        """Every named publisher sends `chains` stores of `blocks` blocks from its own thread.
        `prepared`: every batch is built (and kept for replay) first, then all are sent back to
        back, so they reach the indexer faster than it can apply them."""
        def run(p, k0):
            bs = p.block_size
            for k in range(chains):
                tokens = [(k0 * 7919 + k * 104729 + j) % 150000 for j in range(blocks * bs)]
                p.store(f"burst-{k}", tokens, 0, blocks, drop=prepared)
        threads = [threading.Thread(target=run, args=(self.pubs[n], i)) for i, n in enumerate(names)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if prepared:
            for n in names:
                p = self.pubs[n]
                with p.lock:
                    built = list(p.buffer)[-chains:]
                for s, payload in built:
                    p.sock.send_multipart([p.topic, s.to_bytes(8, "big"), payload])
        return {"sent": chains * len(names)}

    def op_check(self, names, model):
        """The property: no pod is credited with a block its publisher does not hold; and an
        EXACT pod is credited with exactly what its engine would serve of it: the engine blocks
        it holds, at most the prompt's tokens minus one (vLLM computes the last token), compared
        in tokens (the engine's blocks may be larger than the index's)."""
        violations, mismatches, states = [], [], {}
        for n in names:
            p = self.pubs[n]
            for chain, tokens in p.chains.items():
                r = self.op_score(model, tokens, pods=[p.pod])
                if r.get("ok") is False:
                    return r
                s = r["scores"][0]
                held = min(p.held_prefix(tokens), (len(tokens) - 1) // p.block_size) * p.block_size
                matched = s["matched_blocks"] * r["block_size"]
                states[p.pod] = s["state"]
                if matched > held:
                    violations.append({"pod": p.pod, "chain": chain, "matched": matched, "held": held})
                if s["state"] == "EXACT" and matched != held:
                    mismatches.append({"pod": p.pod, "chain": chain, "matched": matched, "held": held})
        return {"violations": violations, "mismatches": mismatches, "states": states}


def main():
    peer = Peer(sys.argv[1])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            out = getattr(peer, "op_" + op)(**cmd)
            out.setdefault("ok", True)
        except Exception as e:  # reported to the test, which fails with the message
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
