"""A misbehaving sibling for kvindex's bootstrap tests, independent of kvindex's own client: a
grpcio server that relays a real sibling's kvindex.v1.Replica/ExportIndex stream as raw
protobuf messages (no generated code, nothing decoded) and, on request, breaks it:

  pass N        relays every message
  die_after N   relays N messages, then the process dies (os._exit: the connection is reset
                mid-stream, as a sibling killed mid-bootstrap)
  flip N        flips one byte inside message N (inside its data: the protobuf stays valid)
  stall N       relays N messages, then sends nothing more
  unbounded N   asks the sibling without the caller's byte bound (max_bytes), and relays all
  tcp           not gRPC: forwards TCP connections to the upstream address unchanged (a link
                that the test cuts by killing this process)

Usage: sibling_proxy.py <upstream host:port> <mode> [N]. Prints {"addr": "127.0.0.1:PORT"}.
"""

import json
import os
import socket
import sys
import threading
import time
from concurrent import futures


def relay_tcp(upstream):
    host, port = upstream.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    print(json.dumps({"addr": "127.0.0.1:%d" % listener.getsockname()[1]}), flush=True)

    def pump(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    while True:
        client, _ = listener.accept()
        try:
            target = socket.create_connection((host, int(port)))
        except OSError:
            client.close()
            continue
        for a, b in ((client, target), (target, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


def main():
    upstream, mode = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if mode == "tcp":
        relay_tcp(upstream)
        return
    import grpc

    channel = grpc.insecure_channel(upstream)
    export = channel.unary_stream("/kvindex.v1.Replica/ExportIndex")

    def handler(request, context):
        metadata = [(k, v) for k, v in context.invocation_metadata() if k == "authorization"]
        if mode == "unbounded":
            request = b""
        for i, message in enumerate(export(request, metadata=metadata)):
            if mode == "die_after" and i == n:
                os._exit(1)
            if mode == "stall" and i == n:
                time.sleep(3600)
            if mode == "flip" and i == n:
                damaged = bytearray(message)
                damaged[len(damaged) // 2] ^= 0xFF
                message = bytes(damaged)
            yield message

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handlers = {"ExportIndex": grpc.unary_stream_rpc_method_handler(handler)}
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("kvindex.v1.Replica", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"addr": "127.0.0.1:%d" % port}), flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
