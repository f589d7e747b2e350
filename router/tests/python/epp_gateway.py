"""An independent gateway for kvindex-router's ext_proc endpoint picker.

Plays Envoy's side of `envoy.service.ext_proc.v3.ExternalProcessor/Process` with Envoy's own
published messages (PyPI `envoy-data-plane`, betterproto2) over grpcio, sending the message
sequence Envoy sends in FULL_DUPLEX_STREAMED mode, and forwards requests to the picked pods
(real `kvindex-sim` pods) over HTTP as the gateway would. Each check prints `ok <name>`; any
failure raises (exit status 1).

Usage: epp_gateway.py <check> <json config>
  config: {"ext_proc": "host:port", "router_http": "host:port", "pods": ["ip:port", ...],
           "model": "...", "chat_model": "..."}
"""

import json
import queue
import sys
import tempfile
import threading
import time
import urllib.request

import betterproto2
import grpc
from envoy_data_plane.envoy.config.core.v3 import HeaderMap, HeaderValue, Metadata
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    ExternalProcessorSyncStub,
    HttpBody,
    HttpHeaders,
    HttpTrailers,
    ProcessingRequest,
)
from envoy_data_plane.google.protobuf import ListValue, Struct, Value

DESTINATION = "x-gateway-destination-endpoint"
SUBSET_NS = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
MAX_CHUNK = 62_000
DEADLINE = 30.0


def subset_metadata(pods):
    value = Value(list_value=ListValue(values=[Value(string_value=p) for p in pods]))
    return Metadata(filter_metadata={SUBSET_NS: Struct(fields={SUBSET_KEY: value})})


def served_metadata(pod):
    value = Value(string_value=pod)
    return Metadata(filter_metadata={"envoy.lb": Struct(fields={"x-gateway-destination-endpoint-served": value})})


def header_map(pairs):
    return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])


class Stream:
    """One Process stream: messages go in when sent, answers are read one at a time."""

    def __init__(self, channel):
        self.outbox = queue.Queue()
        self.closed = False

        def requests():
            while True:
                message = self.outbox.get()
                if message is None:
                    return
                yield message

        self.responses = ExternalProcessorSyncStub(channel).process(requests())

    def send(self, message):
        self.outbox.put(message)

    def recv(self):
        return next(self.responses)

    def close(self):
        if not self.closed:
            self.closed = True
            self.outbox.put(None)


def kind(response):
    return betterproto2.which_one_of(response, "response")[0]


def headers_set(common):
    """Header name -> value from a CommonResponse's mutation (checks raw_value-only)."""
    out = {}
    if common is None or common.header_mutation is None:
        return out
    for option in common.header_mutation.set_headers:
        h = option.header
        assert not h.value, f"header {h.key} sets value as well as raw_value"
        out[h.key] = h.raw_value.decode()
    return out


def metadata_value(struct, namespace, key):
    if struct is None or namespace not in struct.fields:
        return None
    inner = struct.fields[namespace].struct_value
    if inner is None or key not in inner.fields:
        return None
    value = inner.fields[key]
    name, inner_value = betterproto2.which_one_of(value, "kind")
    if name == "string_value":
        return inner_value
    if name == "list_value":
        return [v.string_value for v in inner_value.values]
    return inner_value


def request_messages(path, body, metadata=None, chunk=16_384):
    """What Envoy sends for a POST with this body: headers, then body chunks."""
    headers = header_map(
        [(":method", "POST"), (":path", path), (":authority", "gateway"), ("content-type", "application/json"),
         ("content-length", str(len(body)))]
    )
    messages = [ProcessingRequest(request_headers=HttpHeaders(headers=headers, end_of_stream=False),
                                  metadata_context=metadata)]
    for start in range(0, len(body), chunk):
        last = start + chunk >= len(body)
        messages.append(ProcessingRequest(request_body=HttpBody(body=body[start:start + chunk], end_of_stream=last),
                                          metadata_context=metadata))
    return messages


class Pick:
    def __init__(self, responses):
        self.responses = responses
        first = responses[0]
        self.kind = kind(first)
        if self.kind == "immediate_response":
            self.status = first.immediate_response.status.code
            self.immediate = first.immediate_response
            return
        assert self.kind == "request_headers", f"first answer is {self.kind}"
        common = first.request_headers.response
        self.clear_route_cache = common.clear_route_cache
        self.headers = headers_set(common)
        self.metadata = first.dynamic_metadata
        self.destination = self.headers.get(DESTINATION)
        self.lb = metadata_value(self.metadata, "envoy.lb", DESTINATION)
        self.subset = metadata_value(self.metadata, SUBSET_NS, SUBSET_KEY)
        self.chunks = []
        for r in responses[1:]:
            assert kind(r) == "request_body", f"then {kind(r)}"
            streamed = r.request_body.response.body_mutation.streamed_response
            self.chunks.append((streamed.body, streamed.end_of_stream))

    @property
    def body(self):
        return b"".join(c for c, _ in self.chunks)


def pick(channel, path, body, metadata=None, keep_open=False):
    """Sends one request phase; returns the Pick (and the open stream when asked)."""
    stream = Stream(channel)
    for message in request_messages(path, body, metadata):
        stream.send(message)
    responses = [stream.recv()]
    if kind(responses[0]) != "immediate_response":
        while True:
            r = stream.recv()
            responses.append(r)
            if r.request_body.response.body_mutation.streamed_response.end_of_stream:
                break
    result = Pick(responses)
    if keep_open:
        return result, stream
    stream.close()
    return result, None


def http_post(addr, path, body, stream=False):
    request = urllib.request.Request(f"http://{addr}{path}", data=body, headers={"content-type": "application/json"})
    return urllib.request.urlopen(request, timeout=DEADLINE)


def check_pick(config, channel):
    pods = set(config["pods"])
    body = json.dumps({"model": config["model"], "prompt": list(range(1000, 1100)), "max_tokens": 2}).encode()
    p, _ = pick(channel, "/v1/completions", body)
    assert p.kind == "request_headers"
    assert p.clear_route_cache, "the route cache is cleared"
    listed = p.lb.split(",")
    assert p.destination == listed[0], f"the header {p.destination!r} names the metadata's primary {p.lb!r} alone"
    assert len(listed) == len(set(listed)) and set(listed) <= pods, f"{listed} are known pods, once each"
    assert len(listed) == min(len(pods), 3), f"primary and two fallbacks: {listed}"
    assert p.headers.get("content-length") == str(len(body))
    assert p.body == body
    print("ok pick")


def check_big_body(config, channel):
    prompt = list(range(40_000))  # ~230 kB of JSON: several chunks each way
    body = json.dumps({"model": config["model"], "prompt": prompt, "max_tokens": 1}).encode()
    assert len(body) > 3 * MAX_CHUNK
    p, _ = pick(channel, "/v1/completions", body)
    assert p.body == body, "re-emitted byte for byte"
    assert all(len(c) <= MAX_CHUNK for c, _ in p.chunks), [len(c) for c, _ in p.chunks]
    assert [e for _, e in p.chunks] == [False] * (len(p.chunks) - 1) + [True], "only the last ends the stream"
    assert p.headers["content-length"] == str(len(body))
    print("ok big_body", len(p.chunks))


def check_subset(config, channel):
    pods = config["pods"]
    body = json.dumps({"model": config["model"], "prompt": list(range(5000, 5064)), "max_tokens": 2}).encode()
    free, _ = pick(channel, "/v1/completions", body)
    primary = free.destination
    others = [p for p in pods if p != primary]
    hinted, _ = pick(channel, "/v1/completions", body, subset_metadata(others))
    listed = hinted.lb.split(",")
    assert listed[0] != primary, "a different hint moves the pick"
    assert set(listed) <= set(others), f"every entry inside the subset: {listed} vs {others}"
    assert hinted.destination == listed[0]
    one, _ = pick(channel, "/v1/completions", body, subset_metadata([others[0]]))
    assert one.destination == one.lb == others[0], "a one-pod subset leaves no fallbacks outside it"
    for subset in ([], ["10.255.255.1:9"]):
        p, _ = pick(channel, "/v1/completions", body, subset_metadata(subset))
        assert p.kind == "immediate_response" and p.status == 503, f"subset {subset}: {p.kind}"
        assert json.loads(p.immediate.body)["error"]["code"] == "no_eligible_pods"
    print("ok subset")


def check_response_path(config, channel):
    """The gateway forwards to the pick and streams the pod's SSE answer through the picker:
    every chunk must come back before the next is sent (nothing held back)."""
    body = json.dumps({"model": config["model"], "prompt": list(range(7000, 7100)), "max_tokens": 12,
                       "stream": True}).encode()
    p, stream = pick(channel, "/v1/completions", body, keep_open=True)
    primary = p.destination
    reply = http_post(primary, "/v1/completions", p.body)
    assert reply.status == 200
    content_type = reply.headers.get("content-type", "")
    assert content_type.startswith("text/event-stream"), content_type
    stream.send(ProcessingRequest(
        response_headers=HttpHeaders(headers=header_map([(":status", "200"), ("content-type", content_type)])),
        metadata_context=served_metadata(primary)))
    answer = stream.recv()
    assert kind(answer) == "response_headers", kind(answer)
    added = headers_set(answer.response_headers.response)
    assert added.get("x-kvindex-pod") == primary, added
    echoed = 0
    while True:
        line = reply.readline()
        stream.send(ProcessingRequest(response_body=HttpBody(body=line, end_of_stream=not line)))
        back = stream.recv()  # would block forever if the picker held the stream back
        assert kind(back) == "response_body", kind(back)
        streamed = back.response_body.response.body_mutation.streamed_response
        assert streamed.body == line and streamed.end_of_stream == (not line)
        echoed += 1
        if not line:
            break
    assert echoed > 12, f"SSE chunks echoed one by one: {echoed}"
    stream.close()
    # An HTTP/2 upstream: trailers end the response instead.
    p, stream = pick(channel, "/v1/completions", body, keep_open=True)
    stream.send(ProcessingRequest(response_headers=HttpHeaders(headers=header_map([(":status", "200")]))))
    assert kind(stream.recv()) == "response_headers"
    stream.send(ProcessingRequest(response_body=HttpBody(body=b"data: x\n\n", end_of_stream=False)))
    assert kind(stream.recv()) == "response_body"
    stream.send(ProcessingRequest(response_trailers=HttpTrailers(trailers=header_map([("grpc-status", "0")]))))
    assert kind(stream.recv()) == "response_trailers"
    stream.close()
    print("ok response_path", echoed)


def explain(config, body):
    request = urllib.request.Request(f"http://{config['router_http']}/route/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=DEADLINE).read())


def check_conversation(config, channel):
    """A growing chat: each turn goes through the picker, then to the picked pod; from the
    second turn on it stays on its pod, and the engine's own cached_tokens equal the index's
    matched blocks the router reported."""
    messages = [{"role": "system", "content": "You are a careful assistant. " + "Cite the manual. " * 40}]
    home = None
    for turn in range(4):
        messages.append({"role": "user", "content": f"Question {turn}: explain feature {turn} and its trade-offs."})
        body = json.dumps({"model": config["chat_model"], "messages": messages, "max_tokens": 6}).encode()
        if home is not None:
            # Wait (with a deadline) until the index has the previous turn's blocks.
            deadline = time.time() + DEADLINE
            while True:
                ranked = explain(config, body)["ranked"]
                entry = next(c for c in ranked if c["pod"] == home)
                if entry["matched_blocks"] > 0 and ranked[0]["pod"] == home:
                    break
                assert time.time() < deadline, "the index never saw the previous turn"
                time.sleep(0.02)
        p, stream = pick(channel, "/v1/chat/completions", body, keep_open=True)
        primary = p.destination
        reply = http_post(primary, "/v1/chat/completions", p.body)
        answer = json.loads(reply.read())
        stream.send(ProcessingRequest(
            response_headers=HttpHeaders(headers=header_map([(":status", "200")])),
            metadata_context=served_metadata(primary)))
        added = headers_set(stream.recv().response_headers.response)
        stream.close()
        if home is None:
            home = primary
        else:
            assert primary == home, f"turn {turn} left its pod: {primary} vs {home}"
            matched = int(added["x-kvindex-matched-blocks"])
            cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert matched > 0 and cached == matched * 16, f"turn {turn}: engine cached {cached}, index {matched}"
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    print("ok conversation", home)


def check_prefilter(config, channel):
    """Pre-filter mode: the pods holding the prefix as a subset hint, no destination, the body
    unchanged; on a miss no hint at all."""
    seen = json.dumps({"model": config["model"], "prompt": list(range(9000, 9160)), "max_tokens": 2}).encode()
    target = config["pods"][0]
    reply = http_post(target, "/v1/completions", seen)
    assert reply.status == 200
    reply.read()
    deadline = time.time() + DEADLINE
    while True:
        p, _ = pick(channel, "/v1/completions", seen)
        if p.subset is not None:
            break
        assert time.time() < deadline, "the pre-filter never hinted the pod holding the prefix"
        time.sleep(0.02)
    assert p.subset == [target], f"the holder alone: {p.subset}"
    assert p.destination is None and p.lb is None, "a pre-filter names no destination"
    assert p.body == seen
    miss = json.dumps({"model": config["model"], "prompt": list(range(20000, 20160)), "max_tokens": 2}).encode()
    p, _ = pick(channel, "/v1/completions", miss)
    assert p.kind == "request_headers" and p.subset is None, f"silence on a miss: {p.metadata}"
    assert p.metadata is None or SUBSET_NS not in p.metadata.fields
    assert p.destination is None and p.body == miss
    print("ok prefilter")


HEALTH_PROTO = """
syntax = "proto3";
package grpc.health.v1;
message HealthCheckRequest { string service = 1; }
message HealthCheckResponse {
  enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }
  ServingStatus status = 1;
}
service Health { rpc Check(HealthCheckRequest) returns (HealthCheckResponse); }
"""


def check_health(config, channel):
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/health.proto", "w") as f:
            f.write(HEALTH_PROTO)
        assert protoc.main(["protoc", f"-I{tmp}", f"--python_out={tmp}", f"{tmp}/health.proto"]) == 0
        sys.path.insert(0, tmp)
        import health_pb2

    addrs = [config["ext_proc"]] + ([config["health"]] if config.get("health") else [])
    for addr in addrs:
        ch = grpc.insecure_channel(addr)
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                               response_deserializer=health_pb2.HealthCheckResponse.FromString)
        for name in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            status = check(health_pb2.HealthCheckRequest(service=name), timeout=DEADLINE).status
            assert status == health_pb2.HealthCheckResponse.SERVING, f"{addr} {name}: {status}"
    print("ok health", len(addrs))


CHECKS = {
    "pick": check_pick,
    "big_body": check_big_body,
    "subset": check_subset,
    "response_path": check_response_path,
    "conversation": check_conversation,
    "prefilter": check_prefilter,
    "health": check_health,
}


def main():
    names = sys.argv[1].split(",")
    config = json.loads(sys.argv[2])
    channel = grpc.insecure_channel(config["ext_proc"])
    grpc.channel_ready_future(channel).result(timeout=DEADLINE)
    for name in names:
        CHECKS[name](config, channel)


if __name__ == "__main__":
    main()
