"""A stand-in for the endpoint picker that kvindex's pre-filter runs ahead of (llm-d's, GIE's),
written independently of kvindex-router: Envoy's published messages (PyPI `envoy-data-plane`,
betterproto2) over grpcio, GIE's protocol in FULL_DUPLEX_STREAMED mode as llm-d speaks it.

It honours the subset hint (`envoy.lb.subset_hint` in `metadata_context`), else picks round
robin, names one pod in `x-gateway-destination-endpoint` (header and `envoy.lb` metadata),
re-emits the body and echoes the response. For every stream it prints one JSON line,
`{"subset": [pods] | null, "picked": pod}`, which is how a test sees what reached it.

Usage: stand_in_epp.py <pod,pod,...>   (prints `LISTENING port=<port>` once serving)
"""

import itertools
import json
import sys
import threading
from concurrent import futures

import betterproto2
import grpc
from envoy_data_plane.envoy.config.core.v3 import HeaderValue, HeaderValueOption
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    ProcessingRequest,
    ProcessingResponse,
    StreamedBodyResponse,
    TrailersResponse,
)
from envoy_data_plane.google.protobuf import Struct, Value

DESTINATION = "x-gateway-destination-endpoint"
CHUNK = 62_000
PRINT = threading.Lock()


def subset_of(request):
    metadata = request.metadata_context
    if metadata is None or "envoy.lb.subset_hint" not in metadata.filter_metadata:
        return None
    value = metadata.filter_metadata["envoy.lb.subset_hint"].fields.get("x-gateway-destination-endpoint-subset")
    if value is None:
        return None
    name, inner = betterproto2.which_one_of(value, "kind")
    if name == "list_value":
        return [v.string_value for v in inner.values]
    return [p.strip() for p in inner.split(",") if p.strip()]


def streamed(body, end):
    return CommonResponse(body_mutation=BodyMutation(streamed_response=StreamedBodyResponse(body=body, end_of_stream=end)))


class Picker:
    def __init__(self, pods):
        self.pods = pods
        self.turn = itertools.count()

    def pick(self, subset):
        candidates = [p for p in self.pods if subset is None or p in subset]
        if not candidates:
            return None
        return candidates[next(self.turn) % len(candidates)]

    def answer(self, subset):
        """The request-headers answer naming the pick (one pod, as llm-d names it)."""
        pod = self.pick(subset)
        with PRINT:
            print(json.dumps({"subset": subset, "picked": pod}), flush=True)
        header = HeaderValueOption(header=HeaderValue(key=DESTINATION, raw_value=pod.encode()))
        metadata = Struct(fields={"envoy.lb": Value(struct_value=Struct(fields={DESTINATION: Value(string_value=pod)}))})
        common = CommonResponse(header_mutation=HeaderMutation(set_headers=[header]), clear_route_cache=True)
        return ProcessingResponse(request_headers=HeadersResponse(response=common), dynamic_metadata=metadata)

    def process(self, requests, context):
        subset = None
        body = b""
        for request in requests:
            found = subset_of(request)
            if found is not None:
                subset = found
            name, message = betterproto2.which_one_of(request, "request")
            if name == "request_headers":
                if message.end_of_stream:
                    yield self.answer(subset)
            elif name == "request_body":
                body += message.body
                if message.end_of_stream:
                    yield self.answer(subset)
                    for start in range(0, max(len(body), 1), CHUNK):
                        last = start + CHUNK >= len(body)
                        yield ProcessingResponse(request_body=BodyResponse(response=streamed(body[start:start + CHUNK], last)))
            elif name == "request_trailers":
                yield self.answer(subset)
                yield ProcessingResponse(request_body=BodyResponse(response=streamed(body, False)))
                yield ProcessingResponse(request_trailers=TrailersResponse())
            elif name == "response_headers":
                yield ProcessingResponse(response_headers=HeadersResponse())
            elif name == "response_body":
                yield ProcessingResponse(response_body=BodyResponse(response=streamed(message.body, message.end_of_stream)))
            elif name == "response_trailers":
                yield ProcessingResponse(response_trailers=TrailersResponse())


def main():
    picker = Picker(sys.argv[1].split(","))
    handler = grpc.method_handlers_generic_handler("envoy.service.ext_proc.v3.ExternalProcessor", {
        "Process": grpc.stream_stream_rpc_method_handler(
            picker.process,
            request_deserializer=ProcessingRequest.FromString,
            response_serializer=ProcessingResponse.SerializeToString,
        ),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"LISTENING port={port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
