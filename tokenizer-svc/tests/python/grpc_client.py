"""grpcio client driving a running kvindex-tokenizer end to end (llm-d's sidecar contract).

Stubs are generated at run time from proto/tokenization/tokenizer.proto with grpcio-tools, the
way an llm-d Python client would build them. Every answer is checked against transformers on the
same model directory. Exits non-zero with a message on the first mismatch.

Usage: grpc_client.py --tcp HOST:PORT --uds PATH --models-dir DIR --models a,b [--metrics-url URL]
"""
import argparse
import importlib
import json
import os
import sys
import tempfile
import urllib.request

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(__file__))

import grpc  # noqa: E402
from grpc_tools import protoc  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import corpus  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def load_stubs():
    out = tempfile.mkdtemp(prefix="kvtok-stubs-")
    proto_root = os.path.join(REPO, "proto")
    rc = protoc.main(["protoc", f"-I{proto_root}", f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(proto_root, "tokenization", "tokenizer.proto")])
    if rc != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out)
    return importlib.import_module("tokenization.tokenizer_pb2"), importlib.import_module("tokenization.tokenizer_pb2_grpc")


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def to_pb_message(pb2, m):
    content = m.get("content")
    if isinstance(content, list):
        return pb2.ChatMessage(role=m["role"], content_parts=[pb2.ContentPart(type=p["type"], text=p.get("text")) for p in content])
    return pb2.ChatMessage(role=m["role"], content=content)


def to_pb_tool(pb2, tool):
    f = tool["function"]
    return pb2.ChatCompletionTool(type=tool["type"], function=pb2.FunctionDefinition(
        name=f["name"], description=f.get("description"), parameters_json=json.dumps(f["parameters"])))


def exercise(stub, pb2, model, tok, label):
    calls = 0
    init = stub.InitializeTokenizer(pb2.InitializeTokenizerRequest(model_name=model))
    check(init.success, f"{label} InitializeTokenizer {model}: {init.error_message}")
    for text in corpus.TOKENIZE_TEXTS:
        for special in (True, False):
            r = stub.Tokenize(pb2.TokenizeRequest(input=text, model_name=model, add_special_tokens=special))
            enc = tok(text, add_special_tokens=special, return_offsets_mapping=True)
            check(r.success and list(r.input_ids) == enc["input_ids"], f"{label} Tokenize ids {model} {text!r}")
            check(list(r.offset_pairs) == [x for p in enc["offset_mapping"] for x in p], f"{label} Tokenize offsets {model}")
            calls += 1
        r = stub.RenderCompletion(pb2.RenderCompletionRequest(model_name=model, prompt=text))
        check(r.success and list(r.token_ids) == tok(text)["input_ids"] and r.request_id, f"{label} RenderCompletion {model}")
        calls += 1
    # Cases the OpenAI-shaped request can express: string or text-part content, OpenAI tools.
    for c in corpus.cases():
        if c["documents"] or any(set(m) - {"role", "content"} for m in c["messages"]):
            continue
        kwargs = dict(tools=c["tools"], add_generation_prompt=c["add_generation_prompt"],
                      continue_final_message=c["continue_final_message"], **c["template_kwargs"])
        try:
            expected = tok.apply_chat_template(c["messages"], tokenize=True, return_dict=False, **kwargs)
        except Exception:
            expected = None
        req = pb2.RenderChatCompletionRequest(
            model_name=model, messages=[to_pb_message(pb2, m) for m in c["messages"]],
            tools=[to_pb_tool(pb2, t) for t in (c["tools"] or [])],
            add_generation_prompt=c["add_generation_prompt"], continue_final_message=c["continue_final_message"],
            chat_template_kwargs=json.dumps(c["template_kwargs"]))
        r = stub.RenderChatCompletion(req)
        calls += 1
        if expected is None:
            check(not r.success and r.error_message, f"{label} {model}/{c['name']}: transformers rejects, service must say why")
        else:
            check(r.success, f"{label} {model}/{c['name']}: {r.error_message}")
            check(list(r.token_ids) == list(expected), f"{label} {model}/{c['name']}: token ids differ from transformers")
            text = tok.apply_chat_template(c["messages"], tokenize=False, **kwargs)
            old = stub.RenderChatTemplate(pb2.ChatTemplateRequest(
                model_name=model, conversation_turns=[pb2.ConversationTurn(messages=req.messages)],
                add_generation_prompt=c["add_generation_prompt"], continue_final_message=c["continue_final_message"],
                chat_template_kwargs={k: pb2.Value(bool_value=v) for k, v in c["template_kwargs"].items()})) \
                if not c["tools"] else None
            if old is not None:
                check(old.success and old.rendered_prompt == text, f"{label} RenderChatTemplate {model}/{c['name']}")
                calls += 1
    return calls


def raw_unary(channel, method, payload):
    return channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)(payload)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tcp", required=True)
    p.add_argument("--uds", required=True)
    p.add_argument("--models-dir", required=True)
    p.add_argument("--models", required=True)
    p.add_argument("--metrics-url")
    a = p.parse_args()
    pb2, pb2_grpc = load_stubs()
    total = 0
    # Over a Unix socket grpcio sends the socket path as :authority, which the HTTP/2 stack
    # under tonic (h2) rejects as malformed; grpc-go (llm-d) sends "localhost", so do the same.
    targets = (("tcp", a.tcp, []), ("uds", f"unix://{a.uds}", [("grpc.default_authority", "localhost")]))
    for label, target, options in targets:
        with grpc.insecure_channel(target, options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = pb2_grpc.TokenizationServiceStub(channel)
            for model in a.models.split(","):
                tok = AutoTokenizer.from_pretrained(os.path.join(a.models_dir, model))
                total += exercise(stub, pb2, model, tok, label)
            bad = stub.Tokenize(pb2.TokenizeRequest(input="x", model_name="no-such-model"))
            check(not bad.success and "no-such-model" in bad.error_message, f"{label} unknown model must fail clearly")
            # grpc.health.v1.Health/Check with an empty request answers SERVING (status = 1).
            check(raw_unary(channel, "/grpc.health.v1.Health/Check", b"") == b"\x08\x01", f"{label} health")
            # Server reflection lists the service (ServerReflectionRequest.list_services = "").
            replies = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                            request_serializer=lambda b: b, response_deserializer=lambda b: b)(iter([b"\x3a\x00"]))
            check(any(b"tokenization.TokenizationService" in r for r in replies), f"{label} reflection")
    if a.metrics_url:
        body = urllib.request.urlopen(a.metrics_url, timeout=10).read().decode()
        check('kvindex_tokenizer_requests_total{method="RenderChatCompletion",outcome="ok"}' in body, "metrics: ok counter")
        check('kvindex_tokenizer_requests_total{method="Tokenize",outcome="unknown_model"}' in body, "metrics: error counter")
    print(f"grpcio e2e: {total} calls matched transformers over TCP and UDS")


if __name__ == "__main__":
    main()
