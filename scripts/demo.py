#!/usr/bin/env python3
"""The demo: `kvindex serve` indexing a simulated mixed fleet (`kvindex-sim`: three vLLM pods and
one SGLang pod, each in its engine's exact event bytes) and `kvindex-router` in front of it. Multi-turn chats go to the router's OpenAI endpoint;
the router tokenizes each chat exactly as the engines do (the DeepSeek tokenizer and template),
asks the indexer which pod holds its prefix, adds load, and forwards. For every request the demo
prints where it went and why (from the router's own decision log line and response headers) and
checks the engine's `cached_tokens` against the router's prediction. Then two faults: the indexer
hangs (the router places by load, no client error) and an engine's publisher restarts (the index
drops that pod instead of guessing).

With `--gateway envoy` the same fleet sits behind a real Envoy (1.40, the endpoint-picker
bootstrap deploy/ ships, scripts/demo_envoy.py) with kvindex-router as its ext_proc endpoint
picker: the chats go to Envoy, which asks the router where each goes and sends it there; the demo
prints where Envoy really sent it beside the router's reason. One more fault then: the picker
frozen, and Envoy still routes every request (fail-open), then takes the picker back.

Run through scripts/demo.sh [--gateway envoy], which builds the binaries and sets up the Python
venv and fixtures.
"""

import argparse
import json
import os
import queue
import random
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = 16
MODEL = "demo/deepseek"


def wait_for(what, check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    sys.exit(f"demo: timed out waiting for {what}")


def request(url, body=None, token=None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read()), resp.headers


def listening(proc, prefix):
    """Reads stdout until the `prefix key=value …` line; returns its pairs."""
    for line in proc.stdout:
        if line.startswith(prefix):
            return dict(pair.split("=", 1) for pair in line[len(prefix):].split())
    sys.exit(f"demo: process exited before printing {prefix!r}")


def applied(indexer_http, pod):
    """Waits until the indexer applied every batch `pod` published."""
    stats, _ = request(f"http://{pod['http']}/admin/stats")
    next_seq = stats["ranks"][0]["publisher"]["next_seq"]

    def done():
        sources, _ = request(f"http://{indexer_http}/debug/sources")
        return next_seq == 0 or any(s["pod"] == pod["pod_id"] and s.get("last_seq") == next_seq - 1
                                    for s in sources["sources"])
    wait_for("the indexer to apply the pod's events", done)


def why(decision):
    """One line from the router's decision: what the chosen pod holds, against the runner-up."""
    ranked = decision["candidates"].split(";")
    parts = [dict(kv.split("=", 1) for kv in entry.split(",")[1:] if "=" in kv) | {"pod": entry.split(",")[0]}
             for entry in ranked]
    first = parts[0]["pod"]
    chosen = first.rsplit(":", 1)[1]
    if decision["score"] != "ok":
        return f"indexer {decision['score']}: placed by load ({chosen}, load {parts[0].get('load')})"
    if chosen.split("/")[0] == "0":
        return f"nobody holds block 0: equal costs, rendezvous on the first block"
    runner = parts[1]["pod"].rsplit(":", 1)[1] if len(parts) > 1 else "-"
    return f"holds {chosen} blocks, cost {parts[0]['cost']} (next: {runner}, cost {parts[1]['cost'] if len(parts) > 1 else '-'})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", choices=("router", "envoy"), default="router",
                    help="router: clients call kvindex-router's OpenAI API; envoy: a real Envoy in front, the router its endpoint picker")
    gateway = ap.parse_args().gateway
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    fixtures = os.environ.get("KVINDEX_FIXTURES")
    tokenizer = os.path.join(fixtures or "", "models", "deepseek")
    if not os.path.isfile(os.path.join(tokenizer, "tokenizer.json")):
        sys.exit("demo: no tokenizer fixture; run scripts/demo.sh (it runs scripts/setup.sh)")
    binary = lambda name: os.path.join(target, "debug", name)  # noqa: E731
    procs = []
    envoy = None
    # Pod registration is off unless kvindex serve has a bearer token (docs/SECURITY.md).
    token = secrets.token_urlsafe(24)
    token_file = tempfile.NamedTemporaryFile("w", prefix="kvindex-demo-token-", delete=False)
    token_file.write(token)
    token_file.close()
    try:
        indexer = subprocess.Popen(
            [binary("kvindex"), "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
             "--block-size", str(BLOCK), "--zmq-bind", "tcp://127.0.0.1:0", "--admin-token-file", token_file.name],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(indexer)
        addrs = listening(indexer, "KVINDEX_LISTENING ")
        print(f"kvindex serve: gRPC {addrs['grpc']}, admin http://{addrs['http']}, engines dial {addrs['zmq']}")

        fleet = subprocess.Popen(
            [binary("kvindex-sim"), "--pods", "3", "--model", MODEL, "--block-size", str(BLOCK), "--kv-blocks", "400",
             "--http-base-port", "0", "--zmq-connect", addrs["zmq"], "--replay-base-port", "0",
             "--tokenizer", tokenizer, "--decode-ms-per-token", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(fleet)
        pods = [dict(json.loads(fleet.stdout.readline()), engine="vllm") for _ in range(3)]
        # One SGLang pod in the same fleet: SGLang's wire format (map-form events, signed int64
        # ids), registered with its engine and page size so the indexer keys it by SGLang's rules.
        sglang_fleet = subprocess.Popen(
            [binary("kvindex-sim"), "--engine", "sglang", "--pods", "1", "--model", MODEL, "--block-size", str(BLOCK),
             "--kv-blocks", "400", "--http-base-port", "0", "--zmq-connect", addrs["zmq"], "--replay-base-port", "0",
             "--tokenizer", tokenizer, "--decode-ms-per-token", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(sglang_fleet)
        pods.append(dict(json.loads(sglang_fleet.stdout.readline()), engine="sglang"))
        engine_of = {p["pod_id"]: p["engine"] for p in pods}
        for pod in pods:
            request(f"http://{addrs['http']}/pods", {"pod": pod["pod_id"], "model": MODEL, "replay_endpoint": pod["replay"],
                                                     "engine": pod["engine"],
                                                     **({"page_size": BLOCK} if pod["engine"] == "sglang" else {})},
                    token=token)
        print(f"kvindex-sim: 3 simulated vLLM pods and 1 SGLang pod serving {MODEL} (DeepSeek tokenizer and chat "
              f"template): {', '.join(p['pod_id'] + ' (' + p['engine'] + ')' for p in pods)}, 400 KV blocks of "
              f"{BLOCK} tokens each (SGLang: page size {BLOCK})")

        router = subprocess.Popen(
            [binary("kvindex-router"), "serve", "--http-addr", "127.0.0.1:0", "--indexer", addrs["grpc"],
             "--tokenizer", f"{MODEL}={tokenizer}", "--log-format", "json", "--score-deadline-ms", "50",
             "--indexer-retry-after-ms", "300", "--scrape-interval-ms", "50"]
            + (["--ext-proc-addr", "127.0.0.1:0"] if gateway == "envoy" else [])
            + [arg for p in pods for arg in ("--pod", f"{p['pod_id']}=http://{p['http']}")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(router)
        router_addrs = listening(router, "KVINDEX_ROUTER_LISTENING ")
        router_http = router_addrs["http"]
        decisions = queue.Queue()

        def read_log():
            for line in router.stderr:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("message") == "routed":
                    decisions.put(entry)
        threading.Thread(target=read_log, daemon=True).start()
        wait_for("the router to scrape every pod", lambda: all(
            p["load"]["scrape_age_ms"] is not None for p in request(f"http://{router_http}/debug/pods")[0]["pods"]))
        if gateway == "envoy":
            import demo_envoy

            envoy = demo_envoy.Envoy(router_addrs["ext_proc"], [p["pod_id"] for p in pods])
            envoy.wait_picker(True)
            front = envoy.listener
            print(f"kvindex-router: endpoint picker (ext_proc) at {router_addrs['ext_proc']} (tokenizes in process, "
                  f"scores against the indexer)")
            print(f"Envoy 1.40 ({demo_envoy.BOOTSTRAP}): OpenAI API at http://{front}/v1; each request's body goes "
                  f"to the picker (BUFFERED), Envoy sends it to the pod the picker names (override_host)\n")
        else:
            front = router_http
            print(f"kvindex-router: OpenAI API at http://{router_http}/v1 (tokenizes in process, scores against the indexer)\n")

        rng = random.Random(7)
        tenants = [f"You are the support assistant of tenant {t}. " + f"Tenant {t} rules: be brief, cite the manual, never guess, say which page. " * 12
                   for t in "ABC"]
        chats = [[{"role": "system", "content": tenants[i % 3]},
                  {"role": "user", "content": f"User {i}: how do I set up feature {i}?"}] for i in range(6)]
        turns = [0] * 6
        prompt_total = cached_total = mismatches = 0
        pod_of_chat = {}

        def send(i, note=None):
            nonlocal prompt_total, cached_total, mismatches
            applied_all()
            out, headers = request(f"http://{front}/v1/chat/completions",
                                   {"model": MODEL, "messages": chats[i], "max_tokens": 12})
            decision = decisions.get(timeout=10)
            pod, matched = headers["x-kvindex-pod"], int(headers["x-kvindex-matched-blocks"])
            if envoy is not None and headers[demo_envoy.UPSTREAM_HOST] != pod:
                sys.exit(f"demo: Envoy sent chat {i} to {headers[demo_envoy.UPSTREAM_HOST]}, the picker said {pod}")
            usage = out["usage"]
            cached, tokens = usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]
            predicted = min(matched * BLOCK, (tokens - 1) // BLOCK * BLOCK)
            ok = "ok" if cached == predicted else f"predicted {predicted}"
            if note is None:
                mismatches += ok != "ok"
            prompt_total += tokens
            cached_total += cached
            print(f"chat {i} turn {turns[i]:<2} {pod:<16} {engine_of.get(pod, '?'):<6} {why(decision):<74} {cached:>5}/{tokens:<5} {note or ok}")
            chats[i].append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
            chats[i].append({"role": "user", "content": f"And then? ({turns[i]})"})
            turns[i] += 1
            if headers["x-kvindex-score"] == "ok":
                pod_of_chat[i] = pod
            return headers

        def applied_all():
            for pod in pods:
                applied(addrs["http"], pod)

        routed = "Envoy sent to" if envoy is not None else "routed to"
        print(f"{'request':<14} {routed:<16} {'engine':<6} {'why (router decision log)':<74} {'engine cached':>13}")
        for step in range(18):
            send(step if step < 6 else rng.randrange(6))

        # Fault 1: the indexer hangs (stopped, not dead). Requests still succeed, placed by load.
        indexer.send_signal(19)  # SIGSTOP
        wait_for("the indexer to stop", lambda: open(f"/proc/{indexer.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T")
        print("\nindexer stopped (SIGSTOP): requests keep flowing, placed by load within the 50 ms score deadline")
        for i in (0, 1, 2):
            out, headers = request(f"http://{front}/v1/chat/completions",
                                   {"model": MODEL, "messages": chats[i], "max_tokens": 4})
            decision = decisions.get(timeout=10)
            print(f"chat {i} (hung)  {headers['x-kvindex-pod']:<16} {why(decision):<74} status 200")
        indexer.send_signal(18)  # SIGCONT
        wait_for("the router to take the indexer back", lambda: request(
            f"http://{router_http}/route/v1/chat/completions", {"model": MODEL, "messages": chats[0]})[0]["score"]["outcome"] == "scored")
        print("indexer resumed: the router's background probe took it back\n")


        # Fault 2: one engine's publisher restarts (seq back to 0). The index drops that pod
        # rather than guess what it holds; the router sees 0 cached blocks there.
        victim_chat = 0
        victim = next(p for p in pods if p["pod_id"] == pod_of_chat[victim_chat])
        request(f"http://{victim['http']}/admin/faults/restart-publisher", {})

        probes = iter(range(1_000_000))

        def victim_cleared():
            # New batches from the new publisher (its first may be lost while it connects)
            # show the indexer the sequence going back; each probe is a new prompt, so it
            # stores new blocks and publishes.
            request(f"http://{victim['http']}/v1/completions",
                    {"model": MODEL, "prompt": f"probe {next(probes)} " * 12, "max_tokens": 1})
            time.sleep(0.1)
            decision, _ = request(f"http://{router_http}/route/v1/chat/completions", {"model": MODEL, "messages": chats[victim_chat]})
            scored = decision["score"]["outcome"] == "scored"
            return scored and next(c["matched_blocks"] for c in decision["ranked"] if c["pod"] == victim["pod_id"]) == 0
        wait_for("the restart to be detected", victim_cleared)
        print(f"publisher of {victim['pod_id']} restarted (seq back to 0): the indexer cleared that pod rather than "
              f"guess; chat {victim_chat} now looks uncached everywhere (the engine kept its cache: under-reported, never over):")
        send(victim_chat, note="under-reported after the restart")

        if envoy is not None:
            print()
            # Envoy's own fault: the picker frozen. Requests still go, placed by Envoy itself
            # (least-request): the first waits out the filter's 2 s message timeout, then the
            # health checks skip the picker at once; thawed, it is taken back.
            router.send_signal(19)  # SIGSTOP
            wait_for("the router to stop", lambda: open(f"/proc/{router.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T")
            print("picker stopped (SIGSTOP): Envoy fails open (BUFFERED body, message_timeout 2s, health checks)")
            for n in range(4):
                started = time.monotonic()
                out, headers = request(f"http://{front}/v1/chat/completions",
                                       {"model": MODEL, "messages": chats[n % 3], "max_tokens": 4})
                picked = "picked" if "x-kvindex-pod" in headers else "not picked: Envoy's least-request"
                print(f"chat {n % 3} (frozen) {headers[demo_envoy.UPSTREAM_HOST]:<16} {picked:<45} "
                      f"{1000 * (time.monotonic() - started):6.0f} ms, status 200")
                if n == 0:
                    envoy.wait_picker(False)
            router.send_signal(18)  # SIGCONT
            envoy.wait_picker(True)
            while not decisions.empty():
                decisions.get()
            print("picker resumed: Envoy's health checks took it back, and it picks again:")
            send(1, note="picked again")
        print(f"\nhit rate {cached_total / prompt_total:.2f} (cached / prompt tokens, engines' own counts); "
              f"router predictions that differed from the engine: {mismatches}")
        if envoy is not None:
            print("Envoy's ext_proc stats:")
            for name, value in envoy.stats("http.inference.ext_proc.").items():
                if value:
                    print(f"  {name} {value}")
        metrics = urllib.request.urlopen(f"http://{router_http}/metrics", timeout=5).read().decode()
        wanted = ("kvindex_router_fail_open_total", "kvindex_router_predicted_cached_blocks_total", "kvindex_router_prompt_blocks_total",
                  "kvindex_router_extproc_streams_total")
        print("router metrics:")
        for line in metrics.splitlines():
            if line.startswith(wanted):
                print("  " + line)
    finally:
        if envoy is not None:
            envoy.stop()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        os.unlink(token_file.name)


if __name__ == "__main__":
    main()
