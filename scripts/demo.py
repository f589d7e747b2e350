#!/usr/bin/env python3
"""The demo: `kvindex serve` and a simulated vLLM fleet (`kvindex-sim`) on this machine, with a
precise router loop in between. Before every request it asks the indexer's ScoreTokens how many
leading blocks each pod holds, routes to the best pod, prints why, and checks the engine's own
`cached_tokens` against the prediction.

Run through scripts/demo.sh, which builds the binaries and sets up the Python venv.
"""

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = 16
MODEL = "demo/llama-8b"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    sys.exit(f"demo: timed out waiting for {what}")


def http_json(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def grpc_stubs():
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="kvindex-demo-")
    proto_root = os.path.join(ROOT, "proto")
    rc = protoc.main(["protoc", f"-I{proto_root}", f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(proto_root, "kvindex/v1/indexer.proto")])
    if rc != 0:
        sys.exit("demo: could not generate gRPC stubs")
    sys.path.insert(0, out)
    from kvindex.v1 import indexer_pb2, indexer_pb2_grpc  # noqa: E402
    return indexer_pb2, indexer_pb2_grpc


def main():
    import grpc

    pb, pb_grpc = grpc_stubs()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    kvindex = os.path.join(target, "debug", "kvindex")
    sim = os.path.join(target, "debug", "kvindex-sim")
    grpc_port, http_port, zmq_port = free_port(), free_port(), free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(
            [kvindex, "serve", "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}",
             "--block-size", str(BLOCK), "--zmq-bind", f"tcp://127.0.0.1:{zmq_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for("kvindex serve /readyz", lambda: http_ok(f"http://127.0.0.1:{http_port}/readyz"))
        print(f"kvindex serve: gRPC 127.0.0.1:{grpc_port}, admin http://127.0.0.1:{http_port}, "
              f"engines dial tcp://127.0.0.1:{zmq_port}")

        fleet = subprocess.Popen(
            [sim, "--pods", "3", "--model", MODEL, "--block-size", str(BLOCK), "--kv-blocks", "160",
             "--http-base-port", "0", "--zmq-connect", f"tcp://127.0.0.1:{zmq_port}",
             "--prefill-tokens-per-s", "16000", "--decode-ms-per-token", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(fleet)
        pods = []
        for _ in range(3):
            line = fleet.stdout.readline()
            if not line:
                sys.exit("demo: kvindex-sim exited early")
            info = json.loads(line)
            pods.append(info)
        urls = {}
        for info in pods:
            port = info.get("http_port") or int(str(info.get("http", "")).rsplit(":", 1)[-1])
            urls[f"127.0.0.1:{port}"] = f"http://127.0.0.1:{port}"
        for url in urls.values():
            wait_for(f"{url}/health", lambda u=url: http_ok(f"{u}/health"))
        print(f"kvindex-sim: 3 simulated vLLM pods serving {MODEL}: {', '.join(urls)} "
              f"(160 KV blocks of {BLOCK} tokens each)\n")

        stub = pb_grpc.IndexerStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        rng = random.Random(7)
        # Three tenants, each with its own long system prompt; two conversations per tenant.
        systems = [f"[tenant {t}] " + f"House rules of tenant {t}: answer briefly and cite sources. " * 8 for t in "ABC"]
        conversations = [{"text": systems[i % 3] + f"User {i}: tell me about topic {i}.\n", "turn": 0} for i in range(6)]
        prompt_tokens = cached_total = 0
        mismatches = 0
        rr = 0
        print(f"{'request':<12} {'routed to':<16} {'why':<48} {'engine cached':>14}")
        for step in range(18):
            conv = conversations[rng.randrange(len(conversations))] if step >= 6 else conversations[step]
            name = f"conv {conversations.index(conv)} turn {conv['turn']}"
            ids = list(conv["text"].encode())
            reply = stub.ScoreTokens(pb.ScoreTokensRequest(model=MODEL, token_ids=ids))
            scores = {s.pod: s.matched_blocks for s in reply.scores}
            best = max(scores.values(), default=0)
            if best > 0:
                pod = sorted(p for p, m in scores.items() if m == best)[0]
                others = ", ".join(f"{p.split(':')[1]}={m}" for p, m in sorted(scores.items()) if p != pod) or "none"
                why = f"holds {best}/{reply.total_blocks} leading blocks (others: {others})"
            else:
                pod = sorted(urls)[rr % len(urls)]
                rr += 1
                why = f"no pod holds block 0 of {reply.total_blocks}: round-robin"
            out = http_json(f"{urls[pod]}/v1/completions",
                            {"model": MODEL, "prompt": conv["text"], "max_tokens": 24})
            cached = (out.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            predicted = min(best * BLOCK, ((len(ids) - 1) // BLOCK) * BLOCK)
            mark = "ok" if cached == predicted else f"predicted {predicted}"
            mismatches += cached != predicted
            print(f"{name:<12} {pod:<16} {why:<48} {cached:>6}/{len(ids):<5} {mark}")
            prompt_tokens += len(ids)
            cached_total += cached
            conv["text"] += out["choices"][0]["text"] + f"\nUser: and then? ({conv['turn']})\n"
            conv["turn"] += 1
            # The engine has published this request's blocks; wait until the index shows them.
            full = len(ids) // BLOCK
            wait_for("the index to show the new blocks", lambda: any(
                s.pod == pod and s.matched_blocks >= full for s in stub.ScoreTokens(
                    pb.ScoreTokensRequest(model=MODEL, token_ids=ids, pods=[pod])).scores), timeout=10)

        # A fault: one engine's publisher restarts (seq back to 0). The index cannot know what
        # that engine holds any more, so it drops the pod rather than guess.
        victim = pod
        http_json(f"{urls[victim]}/admin/faults/restart-publisher", {})
        probe = list(conversations[0]["text"].encode())
        http_json(f"{urls[victim]}/v1/completions", {"model": MODEL, "prompt": "x" * 40, "max_tokens": 1})
        wait_for("the restart to be detected", lambda: not any(
            s.pod == victim and s.matched_blocks > 3 for s in stub.ScoreTokens(
                pb.ScoreTokensRequest(model=MODEL, token_ids=probe, pods=[victim])).scores), timeout=10)
        print(f"\npublisher of {victim} restarted (seq back to 0): the indexer cleared that pod instead of "
              f"guessing; it is credited again only as new BlockStored events arrive.")

        sources = http_json(f"http://127.0.0.1:{http_port}/debug/sources")
        print(f"\nhit rate {cached_total / prompt_tokens:.2f} (cached / prompt tokens); "
              f"predictions that differed from the engine: {mismatches}")
        print("indexer's view (/debug/sources):")
        for src in sources if isinstance(sources, list) else sources.get("sources", []):
            print("  " + json.dumps({k: src.get(k) for k in ("pod", "topic", "state", "last_seq", "blocks") if k in src}))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
