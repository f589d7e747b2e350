"""Serving-path figures for BENCHMARKS.md: RSS of a running kvindex-tokenizer with the DeepSeek
tokenizer loaded, before and after serving ~8k-token chats over gRPC, and client-observed latency.

Usage: bench_grpc.py --binary target/release/kvindex-tokenizer --models-dir <fixtures>/models
Starts the binary itself (`serve --grpc-addr 127.0.0.1:0 --preload deepseek`), reads
/proc/<pid>/status, and stops it. Latency includes Python/grpcio client overhead on the same box.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import grpc  # noqa: E402

import corpus  # noqa: E402
from grpc_client import load_stubs  # noqa: E402


def status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024.0
    return 0.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--models-dir", required=True)
    p.add_argument("--requests", type=int, default=300)
    a = p.parse_args()
    pb2, pb2_grpc = load_stubs()
    proc = subprocess.Popen([a.binary, "serve", "--grpc-addr", "127.0.0.1:0", "--preload", "deepseek",
                             "--model", f"deepseek={os.path.join(a.models_dir, 'deepseek')}"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        target = next(w[5:] for w in line.split() if w.startswith("grpc="))
        rss_loaded = status(proc.pid, "VmRSS:")
        channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
        stub = pb2_grpc.TokenizationServiceStub(channel)
        messages = [pb2.ChatMessage(role="system", content="You are a careful assistant."),
                    pb2.ChatMessage(role="user", content=corpus.long_text(7000)),
                    pb2.ChatMessage(role="assistant", content="Noted."),
                    pb2.ChatMessage(role="user", content="Summarise.")]
        req = pb2.RenderChatCompletionRequest(model_name="deepseek", messages=messages, add_generation_prompt=True)
        n_tokens = len(stub.RenderChatCompletion(req).token_ids)
        lat = []
        for _ in range(a.requests):
            t = time.perf_counter()
            r = stub.RenderChatCompletion(req)
            lat.append(time.perf_counter() - t)
            assert r.success
        lat.sort()
        def burst(_):
            return stub.RenderChatCompletion(req).success
        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            ok = sum(pool.map(burst, range(a.requests)))
        elapsed = time.perf_counter() - t
        print(json.dumps({
            "prompt_tokens": n_tokens,
            "rss_mib_tokenizer_loaded_idle": round(rss_loaded, 1),
            "rss_mib_after_serving": round(status(proc.pid, "VmRSS:"), 1),
            "peak_rss_mib": round(status(proc.pid, "VmHWM:"), 1),
            "grpc_latency_ms_p50": round(lat[len(lat) // 2] * 1e3, 2),
            "grpc_latency_ms_p99": round(lat[int(len(lat) * 0.99) - 1] * 1e3, 2),
            "grpc_throughput_chats_per_s_4_client_threads": round(ok / elapsed, 1),
        }, indent=1))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
