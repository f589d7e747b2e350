"""Records a real engine's KV-event stream: live PUB messages and ROUTER replay replies.

Why: kvindex's decoder and index must be held to what a real engine sends, not only to vectors
made with vLLM's publisher in isolation. This records every ZeroMQ message (a pyzmq SUB on the
event port, a pyzmq DEALER on the replay port), decodes it with the engine's own msgspec structs
(`vllm.distributed.kv_events`, so run it with the vLLM venv's python) and writes JSON Lines in
the schema of testdata/vllm-vectors/frames-*.jsonl (`frames_hex`, `expect`, ...), which
`kvindex decode` reads.
"""

import threading
import time

import msgspec
import zmq

END_OF_REPLAY_SEQ = b"\xff" * 8


def hash_str(h):
    if isinstance(h, bytes):
        return "bytes:" + h.hex()
    if isinstance(h, int):
        return "0x%016x" % h if h >= 0 else str(h)
    raise TypeError(f"unexpected hash type {type(h).__name__}")


def plain(value):
    """Tuples become lists and bytes `bytes:<hex>`, as the vectors' `expect` writes them."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return "bytes:" + value.hex()
    return value


class EngineStructs:
    """vLLM's own event structs and a decoder for its payloads."""

    def __init__(self):
        from vllm.distributed import kv_events  # noqa: PLC0415 (needs the vLLM venv)

        self.kv_events = kv_events
        self.decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)

    def decode(self, payload):
        return self.decoder.decode(payload)

    def event_json(self, event):
        cls = type(event)
        out = {"type": cls.__struct_config__.tag or cls.__name__}
        for field in msgspec.structs.fields(cls):
            value = getattr(event, field.name)
            if field.name == "block_hashes":
                value = [hash_str(h) for h in value]
            elif field.name == "parent_block_hash":
                value = None if value is None else hash_str(value)
            else:
                value = plain(value)
            out[field.name] = value
        return out

    def expect(self, topic, seq, payload):
        batch = self.decode(payload)
        return {
            "seq": int.from_bytes(seq, "big"),
            "topic": topic.decode() if topic is not None else None,
            "ts": batch.ts,
            "dp_rank": getattr(batch, "data_parallel_rank", None),
            "events": [self.event_json(e) for e in batch.events],
        }


class LiveCapture:
    """A SUB socket in a thread; every message kept in arrival order with its decoded batch."""

    def __init__(self, endpoint, structs, bind=False):
        self.endpoint = endpoint
        self.structs = structs
        self.messages = []  # (frames, expect)
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.LINGER, 0)
        if bind:  # the engine's PUB dials us
            self._sock.bind(endpoint)
        else:  # before the engine binds is fine: ZeroMQ reconnects
            self._sock.connect(endpoint)
        self._thread = threading.Thread(target=self._run, name="kv-sub", daemon=True)
        self._thread.start()

    def _run(self):
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            frames = self._sock.recv_multipart()
            try:
                expect = self.structs.expect(frames[0], frames[1], frames[2])
            except Exception as e:  # keep recording: the frames are the evidence
                expect = {"error": f"{type(e).__name__}: {e}", "events": []}
            with self.cond:
                self.messages.append((frames, expect))
                self.cond.notify_all()

    def count(self):
        with self.cond:
            return len(self.messages)

    def wait_for(self, predicate, timeout_s=30.0, since=0):
        """Waits until predicate(event, expect) holds for some event in messages[since:]."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for _, expect in self.messages[since:]:
                    for event in (expect or {}).get("events", []):
                        if predicate(event, expect):
                            return expect
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching event on {self.endpoint} within {timeout_s} s")
                self.cond.wait(left)

    def events(self, since=0):
        with self.cond:
            return [e for _, x in self.messages[since:] for e in (x or {}).get("events", [])]

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(0)


def replay(endpoint, start_seq, structs, timeout_s=10.0):
    """One replay exchange: [empty, start_seq] to the ROUTER; replies up to the end marker."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    request = [b"", start_seq.to_bytes(8, "big")]
    sock.send_multipart(request)
    replies = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not sock.poll(left_ms):
                raise TimeoutError(f"replay from {start_seq} on {endpoint}: no end marker within {timeout_s} s")
            frames = sock.recv_multipart()
            # >= 0.26: [empty, topic, seq, payload]; end marker [empty, empty, ff*8, empty]
            if len(frames) == 4 and frames[2] == END_OF_REPLAY_SEQ:
                replies.append((frames, {"end_of_replay": True, "topic": frames[1].decode()}))
                return request, replies
            if len(frames) != 4:
                raise ValueError(f"unexpected replay reply layout: {len(frames)} frames")
            expect = structs.expect(frames[1], frames[2], frames[3])
            expect["end_of_replay"] = False
            replies.append((frames, expect))
    finally:
        sock.close(0)


def record(frames, expect, *, base, kind, socket, replay_info=None):
    rec = dict(base)
    rec["kind"] = kind
    rec["socket"] = socket
    if replay_info is not None:
        rec["replay"] = replay_info
    rec["frames_hex"] = [f.hex() for f in frames]
    rec["expect"] = expect
    rec["hash_provenance"] = None
    return rec
