"""grpc.health.v1 Check against a server, as the kubelet's gRPC probe asks it, with grpcio (an
independent client) over a raw method: the two messages are encoded here, so no generated
health stubs are needed.

Usage: grpc_health.py HOST:PORT SERVICE...   ("" is the server as a whole)
Exit status 0 when every SERVICE answers SERVING, 1 otherwise (each answer printed).
"""

import sys

import grpc

SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}


def check_request(service):
    """HealthCheckRequest{service}: field 1, length-delimited (names here are under 128 bytes)."""
    name = service.encode()
    assert len(name) < 128
    return b"\x0a" + bytes([len(name)]) + name if name else b""


def main():
    target, services = sys.argv[1], sys.argv[2:]
    ok = True
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b, response_deserializer=lambda b: b)
        for service in services:
            try:
                answer = check(check_request(service), timeout=30, wait_for_ready=True)
            except grpc.RpcError as err:
                print(f"{service or '(server)'}: {err.code().name} {err.details()}")
                ok = False
                continue
            print(f"{service or '(server)'}: " + ("SERVING" if answer == SERVING else f"not serving ({answer!r})"))
            ok = ok and answer == SERVING
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
