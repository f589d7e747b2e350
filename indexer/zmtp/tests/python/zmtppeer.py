"""Independent ZeroMQ peers for kvindex-zmtp's tests, driven over stdin/stdout (one JSON per line).

Nothing here uses kvindex code. Two kinds of peer:

* libzmq peers through pyzmq (what vLLM runs): XPUB publishers (wire-identical to PUB for a
  subscriber; XPUB only lets the test see the subscription arrive, so it never sleeps and hopes)
  that bind or connect, over tcp:// or ipc://; and a ROUTER that answers a DEALER exactly as
  vLLM's replay socket does, in both reply layouts (<=0.25: [b"", seq, payload];
  >=0.26: [b"", topic, seq, payload]; end marker seq ff..ff).
* raw-socket peers that speak ZMTP byte by byte: a 3.0-only (or 3.1) PUB or ROUTER with a
  hand-written greeting and READY, and hostile ones (a huge declared frame, an endless
  multi-part message, silence, floods of connections from chosen source addresses).

Every reply is {"ok": true, ...} or {"ok": false, "error": "..."}.
"""

import json
import os
import socket
import struct
import sys
import threading
import time

import zmq

CTX = zmq.Context.instance()
END_SEQ = b"\xff" * 8


def hexs(frames):
    return [f.hex() for f in frames]


# ---- libzmq peers -------------------------------------------------------------------------


class Pub:
    def __init__(self, bind=None, connect=None, heartbeat_ms=0, hwm=1_000_000, heartbeat_timeout_ms=0):
        self.sock = CTX.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        if heartbeat_ms:
            self.sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
            self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_timeout_ms or 3 * heartbeat_ms)
        if bind:
            for attempt in range(100):  # a just-closed port can take a moment to free
                try:
                    self.sock.bind(bind)
                    break
                except zmq.ZMQError:
                    if attempt == 99:
                        raise
                    time.sleep(0.05)
            self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        else:
            self.sock.connect(connect)
            self.endpoint = connect
        self.seq = 0

    def wait_subs(self, n, timeout):
        """The first `n` subscription messages (b"\\x01" + prefix), or fewer at the deadline."""
        subs = []
        deadline = time.time() + timeout
        while len(subs) < n and time.time() < deadline:
            if self.sock.poll(50):
                subs.append(self.sock.recv())
        return subs

    def close(self):
        self.sock.close(0)


class Router:
    """vLLM's replay socket: a ROUTER that answers [identity, b"", start_seq] with every buffered
    (seq, payload) from start_seq, then the end marker."""

    def __init__(self, bind, topic, layout, buffer):
        self.sock = CTX.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(bind)
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.topic = topic
        self.layout = layout
        self.buffer = buffer
        self.requests = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            frames = self.sock.recv_multipart()
            self.requests.append(frames[1:])
            if len(frames) != 3:
                continue  # vLLM logs "Invalid replay request" and ignores it
            ident, _, start = frames
            start = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq < start:
                    continue
                if self.layout == "v026":
                    self.sock.send_multipart([ident, b"", self.topic, seq.to_bytes(8, "big"), payload])
                else:
                    self.sock.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            if self.layout == "v026":
                self.sock.send_multipart([ident, b"", b"", END_SEQ, b""])
            else:
                self.sock.send_multipart([ident, b"", END_SEQ, b""])

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close(0)


# ---- raw ZMTP peers -----------------------------------------------------------------------


def greeting(major, minor, mechanism=b"NULL", as_server=0):
    g = bytearray(64)
    g[0] = 0xFF
    g[9] = 0x7F
    g[10] = major
    g[11] = minor
    g[12 : 12 + len(mechanism)] = mechanism
    g[32] = as_server
    return bytes(g)


def frame(body, flags=0):
    if len(body) > 255:
        return bytes([flags | 0x02]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def command(name, data=b""):
    return frame(bytes([len(name)]) + name + data, 0x04)


def ready(socket_type):
    prop = bytes([11]) + b"Socket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    return command(b"READY", prop)


class Raw:
    def __init__(self, sock):
        self.sock = sock
        self.sock.settimeout(10)

    def read_exact(self, n):
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError(f"closed after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    def read_frame(self):
        flags = self.read_exact(1)[0]
        size = struct.unpack(">Q", self.read_exact(8))[0] if flags & 0x02 else self.read_exact(1)[0]
        return flags, self.read_exact(size)

    def handshake(self, major, minor, socket_type, mechanism):
        self.sock.sendall(greeting(major, minor, mechanism) + ready(socket_type))
        theirs = self.read_exact(64)
        flags, body = self.read_frame()
        if not flags & 0x04 or body[1 : 1 + body[0]] != b"READY":
            raise ValueError(f"expected READY, got flags {flags} body {body!r}")
        props = body[1 + body[0] :]
        socket = None
        while props:
            n = props[0]
            name = props[1 : 1 + n]
            vlen = struct.unpack(">I", props[1 + n : 5 + n])[0]
            if name.lower() == b"socket-type":
                socket = props[5 + n : 5 + n + vlen].decode()
            props = props[5 + n + vlen :]
        return {"version": [theirs[10], theirs[11]], "mechanism": theirs[12:32].rstrip(b"\0").decode(), "socket_type": socket}


def raw_connect(endpoint, source=None):
    if endpoint.startswith("ipc://"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(endpoint[len("ipc://") :])
        return s
    host, port = endpoint[len("tcp://") :].rsplit(":", 1)
    if host == "0.0.0.0":
        host = "127.0.0.1"
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source:
        s.bind((source, 0))
    s.connect((host, int(port)))
    return s


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Peers:
    def __init__(self):
        self.pubs = {}
        self.routers = {}
        self.raws = {}
        self.listeners = {}
        self.floods = {}

    # libzmq
    def op_pub(self, name, bind=None, connect=None, heartbeat_ms=0, heartbeat_timeout_ms=0):
        self.pubs[name] = Pub(bind, connect, heartbeat_ms, heartbeat_timeout_ms=heartbeat_timeout_ms)
        return {"endpoint": self.pubs[name].endpoint}

    def op_wait_subs(self, name, n=1, timeout=20):
        return {"subs": hexs(self.pubs[name].wait_subs(n, timeout))}

    def op_send(self, name, frames):
        self.pubs[name].sock.send_multipart([bytes.fromhex(f) for f in frames])
        return {}

    def op_publish(self, name, topic, n, payload_len=100):
        """n messages [topic, seq_be8, payload] with this publisher's next seqs."""
        p = self.pubs[name]
        for _ in range(n):
            p.sock.send_multipart([topic.encode(), p.seq.to_bytes(8, "big"), bytes([p.seq % 251]) * payload_len])
            p.seq += 1
        return {"last_seq": p.seq - 1}

    def op_close_pub(self, name):
        self.pubs.pop(name).close()
        return {}

    def op_router(self, name, bind, layout, topic="", items=()):
        buffer = [(seq, bytes.fromhex(p)) for seq, p in items]
        self.routers[name] = Router(bind, topic.encode(), layout, buffer)
        return {"endpoint": self.routers[name].endpoint}

    def op_router_requests(self, name, n=1, timeout=20):
        r = self.routers[name]
        deadline = time.time() + timeout
        while len(r.requests) < n and time.time() < deadline:
            time.sleep(0.01)
        return {"requests": [hexs(f) for f in r.requests]}

    def op_close_router(self, name):
        self.routers.pop(name).close()
        return {}

    # raw
    def op_raw_connect(self, name, endpoint, source=None):
        self.raws[name] = Raw(raw_connect(endpoint, source))
        return {}

    def op_raw_listen(self, name, endpoint):
        if endpoint.startswith("ipc://"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            path = endpoint[len("ipc://") :]
            if os.path.exists(path):
                os.unlink(path)
            s.bind(path)
            bound = endpoint
        else:
            host, port = endpoint[len("tcp://") :].rsplit(":", 1)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, int(port)))
            bound = "tcp://%s:%d" % s.getsockname()
        s.listen(16)
        s.settimeout(20)
        self.listeners[name] = s
        return {"endpoint": bound}

    def op_raw_accept(self, name, listener):
        conn, _ = self.listeners[listener].accept()
        self.raws[name] = Raw(conn)
        return {}

    def op_raw_handshake(self, name, version=(3, 1), socket_type="PUB", mechanism="NULL"):
        return self.raws[name].handshake(version[0], version[1], socket_type.encode(), mechanism.encode())

    def op_raw_send(self, name, hex):
        self.raws[name].sock.sendall(bytes.fromhex(hex))
        return {}

    def op_raw_message(self, name, frames):
        fs = [bytes.fromhex(f) for f in frames]
        out = b"".join(frame(f, 0x01 if i + 1 < len(fs) else 0) for i, f in enumerate(fs))
        self.raws[name].sock.sendall(out)
        return {}

    def op_raw_command(self, name, command_name, data=""):
        self.raws[name].sock.sendall(command(command_name.encode(), bytes.fromhex(data)))
        return {}

    def op_raw_read_frame(self, name, timeout=10):
        raw = self.raws[name]
        raw.sock.settimeout(timeout)
        flags, body = raw.read_frame()
        return {"flags": flags, "body": body.hex()}

    def op_raw_read_message(self, name, timeout=10):
        """The next message (commands skipped), as a list of frames."""
        raw = self.raws[name]
        raw.sock.settimeout(timeout)
        frames = []
        while True:
            flags, body = raw.read_frame()
            if flags & 0x04:
                continue
            frames.append(body)
            if not flags & 0x01:
                return {"frames": hexs(frames)}

    def op_raw_endless(self, name, frame_len, timeout=20):
        """Sends MORE frames of `frame_len` bytes until the other side closes; returns how many
        bytes it got out before that."""
        raw = self.raws[name]
        chunk = frame(b"\x00" * frame_len, 0x01)
        sent = 0
        deadline = time.time() + timeout
        raw.sock.settimeout(1)
        try:
            while time.time() < deadline:
                raw.sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError, socket.timeout, OSError):
            return {"closed": True, "sent": sent}
        return {"closed": False, "sent": sent}

    def op_raw_wait_closed(self, name, timeout=20):
        """Waits until the other side closes (EOF or reset), discarding what it sends."""
        raw = self.raws[name]
        deadline = time.time() + timeout
        start = time.time()
        got = []
        while time.time() < deadline:
            raw.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                chunk = raw.sock.recv(65536)
            except socket.timeout:
                break
            except (ConnectionResetError, OSError):
                return {"closed": True, "after_ms": int((time.time() - start) * 1000), "received": b"".join(got).hex()}
            if not chunk:
                return {"closed": True, "after_ms": int((time.time() - start) * 1000), "received": b"".join(got).hex()}
            got.append(chunk)
        return {"closed": False, "received": b"".join(got).hex()}

    def op_raw_close(self, name):
        self.raws.pop(name).sock.close()
        return {}

    def op_flood(self, name, endpoint, n, source=None):
        """Opens n connections (from `source`) that never speak; returns how many connected."""
        socks = self.floods.setdefault(name, [])
        for _ in range(n):
            socks.append(raw_connect(endpoint, source))
        return {"open": len(socks)}

    def op_flood_close(self, name):
        for s in self.floods.pop(name, []):
            s.close()
        return {}

    def op_rss_kib(self, pid):
        return {"rss_kib": rss_kib(pid)}


def main():
    peers = Peers()
    print(json.dumps({"ready": True, "zmq": zmq.zmq_version()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            reply = getattr(peers, f"op_{op}")(**cmd)
            reply["ok"] = True
        except Exception as e:  # reported to the test, which decides
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
