"""Holds kvindex-tokenizer to the prompt token ids a real vLLM engine reported.

Why: the router's prediction is only as good as its token ids. The requests captured by
smoke.py carry what was sent (completion text or chat messages) and the engine's own
`prompt_token_ids`; this starts `kvindex-tokenizer serve` on the same tiny model directory and
asks it (gRPC RenderCompletion / RenderChatCompletion, llm-d's contract) for the same ids.
Token-id prompts are skipped (nothing to tokenize).

Run with the project's test venv (grpcio + grpcio-tools):
  /var/tmp/kvindex-venv/bin/python check_tokenizer_svc.py captures/requests-0.32.0-real.jsonl
Exits non-zero on any difference.
"""

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile

import grpc
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
DEFAULT_BIN = os.environ.get("KVINDEX_TOKENIZER_BIN", "/var/tmp/kvindex-target/debug/kvindex-tokenizer")


def load_stubs():
    out = tempfile.mkdtemp(prefix="kvtok-stubs-")
    proto_root = os.path.join(REPO, "proto")
    if protoc.main(["protoc", f"-I{proto_root}", f"--python_out={out}", f"--grpc_python_out={out}",
                    os.path.join(proto_root, "tokenization", "tokenizer.proto")]) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out)
    return importlib.import_module("tokenization.tokenizer_pb2"), importlib.import_module("tokenization.tokenizer_pb2_grpc")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=DEFAULT_BIN)
    p.add_argument("--model-dir", default=os.path.join(HERE, "tiny-model"))
    p.add_argument("requests", nargs="+")
    args = p.parse_args()
    pb2, pb2_grpc = load_stubs()
    server = subprocess.Popen([args.bin, "serve", "--grpc-addr", "127.0.0.1:0", "--model", f"tiny={args.model_dir}"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()  # "kvindex-tokenizer listening grpc=<addr> ..."
        if "grpc=" not in line:
            sys.exit(f"kvindex-tokenizer did not start: {line!r}")
        addr = line.split("grpc=")[1].split()[0]
        stub = pb2_grpc.TokenizationServiceStub(grpc.insecure_channel(addr))
        checked = bad = 0
        for path in args.requests:
            for row in map(json.loads, open(path)):
                if "messages" in row:
                    msgs = [pb2.ChatMessage(role=m["role"], content=m["content"]) for m in row["messages"]]
                    r = stub.RenderChatCompletion(pb2.RenderChatCompletionRequest(
                        model_name="tiny", messages=msgs, add_generation_prompt=True), timeout=10)
                elif isinstance(row.get("prompt"), str):
                    r = stub.RenderCompletion(pb2.RenderCompletionRequest(model_name="tiny", prompt=row["prompt"]), timeout=10)
                else:
                    continue
                checked += 1
                if not r.success or list(r.token_ids) != row["prompt_token_ids"]:
                    bad += 1
                    print(f"DIFF {row['engine']}/{row['label']}: {r.error_message or 'ids differ'}")
        print(f"check_tokenizer_svc: {checked - bad}/{checked} prompts tokenized exactly as the engine did")
        return 1 if bad or not checked else 0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
