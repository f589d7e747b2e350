"""The agreement run: kvindex's predictions held to real vLLM engines, request by request.

Why: every other check of kvindex is against vLLM's published encoder, recorded vectors or our
own simulator. Here the last word is the engine's: two real vLLM CPU engines (one with a KV
cache of 40 blocks, so it evicts) publish their real KV events to `kvindex serve`, and every
request goes through `kvindex-router`. For each request the router's prediction for the pod that
served it (`x-kvindex-matched-blocks` x 32) is compared with the engine's own
`usage.prompt_tokens_details.cached_tokens`, under the engine's rule: vLLM always computes at
least the prompt's last token, so it reports at most `floor((prompt_tokens - 1) / 32) * 32`
cached tokens even when it holds every block (a fully cached 64-token prompt reports 32). The
prediction is the matched blocks capped by that rule; nothing else is adjusted.

Also held to the engine: `kvindex-tokenizer`'s ids (gRPC RenderCompletion / RenderChatCompletion)
against the engine's `prompt_token_ids` for every text prompt; the router's own tokenization by
its `x-kvindex-total-blocks` against `prompt_tokens // 32`; and kvindex's sampled cross-check of
vLLM's block hashes (`--hash-check-every 1`: every stored block recomputed with vLLM's recipe
and compared with the hash the engine published).

Sequencing: requests are sent one at a time, and before each one the index is brought level
with every event the engines have published: the response can come back before its KV events
(and a request that only hits may still evict in its step). A *fence* (a fresh 33-token prompt
sent straight to the pod that served the last request, whose one new block is then awaited in
the index through the router's `/route` endpoint) does that: one publisher's messages arrive in
order. A restarted engine gets no fence before it is first routed to: what the index believes
about it then is exactly what a router would see in production.

Workload (seeded, deterministic): multi-turn chats over shared system prompts, documents asked
several questions, completions with token-id prompts, `kv_cache_report_mode: full`, a burst of
distinct long prompts that makes the small engine evict, repeats after the evictions, a
`/reset_prefix_cache` on one engine, and a stop and restart of the small engine mid-run (requests
keep flowing while it is down and while it starts again).

Started by run.sh with the vLLM venv's python; it starts and stops every process itself.
Prints `agreement <agreeing>/<requests>, over-predicted <n>` last; exit 0 only with >= 99%
agreement, no over-prediction, and the tokenizer and hash checks clean.
"""

import argparse
import importlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from engine import BLOCK_SIZE, Engine, EngineConfig, _die_with_parent, cached_tokens

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = os.path.join(HERE, "tiny-model")
MODEL = "tiny"
SMALL_CACHE_BLOCKS = 40  # 1,280 token slots: the eviction burst below overflows it
SMALL_MAX_MODEL_LEN = 1024


def log(msg):
    print(msg, flush=True)


# --- processes -------------------------------------------------------------------------------

class Service:
    """A Rust service started on port 0 that prints one `... key=addr ...` line on stdout."""

    def __init__(self, name, argv, log_path, ready_marker):
        self.name = name
        self.log_file = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log_file, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent, text=True)
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if ready_marker in line:
                break
        if ready_marker not in line:
            self.stop()
            raise RuntimeError(f"{name} did not start (see {log_path}): {line!r}")
        self.addrs = dict(re.findall(r"(\w+)=(\S+)", line))
        # Keep draining stdout so the service never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log_file.close()


def http(method, url, body=None, timeout_s=120.0):
    """(status, headers, parsed JSON body)."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            status, headers, text = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, headers, text = e.code, dict(e.headers), e.read()
    try:
        parsed = json.loads(text) if text.strip() else None
    except ValueError:
        parsed = text.decode(errors="replace")
    return status, {k.lower(): v for k, v in headers.items()}, parsed


def metrics_text(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def metric_sum(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- the tokenizer service -------------------------------------------------------------------

class TokenizerCheck:
    """kvindex-tokenizer's ids for what was sent, against the engine's prompt_token_ids."""

    def __init__(self, addr, stubs_dir):
        import grpc
        sys.path.insert(0, stubs_dir)
        self.pb2 = importlib.import_module("tokenization.tokenizer_pb2")
        pb2_grpc = importlib.import_module("tokenization.tokenizer_pb2_grpc")
        self.stub = pb2_grpc.TokenizationServiceStub(grpc.insecure_channel(addr))
        self.checked = self.differ = 0

    def ids(self, kind, payload):
        if kind == "chat":
            msgs = [self.pb2.ChatMessage(role=m["role"], content=m["content"]) for m in payload]
            r = self.stub.RenderChatCompletion(self.pb2.RenderChatCompletionRequest(
                model_name=MODEL, messages=msgs, add_generation_prompt=True), timeout=30)
        else:
            r = self.stub.RenderCompletion(self.pb2.RenderCompletionRequest(model_name=MODEL, prompt=payload),
                                           timeout=30)
        if not r.success:
            return f"error: {r.error_message}"
        return list(r.token_ids)

    def check(self, label, kind, payload, engine_ids):
        if kind != "chat" and not isinstance(payload, str):
            return None  # token ids: nothing to tokenize
        self.checked += 1
        ours = self.ids(kind, payload)
        same = ours == engine_ids
        if not same:
            self.differ += 1
            first = next((i for i, (a, b) in enumerate(zip(ours, engine_ids)) if a != b), None) \
                if isinstance(ours, list) else None
            log(f"DIFF {label}: kvindex-tokenizer {ours if isinstance(ours, str) else len(ours)} ids, engine "
                f"{len(engine_ids)}, first difference at {first}")
        return same


# --- the run ---------------------------------------------------------------------------------

class Fleet:
    def __init__(self):
        self.engines = {}  # pod id -> Engine
        self.services = []
        self.router_url = None
        self.kvindex_http = None
        self.recorder_http = None

    def pod_id(self, http_port):
        return f"127.0.0.1:{http_port}"

    def stop_all(self):
        for engine in list(self.engines.values()):
            try:
                engine.stop()
            except Exception as e:  # keep stopping the others
                log(f"stopping engine: {e}")
        for service in reversed(self.services):
            service.stop()


class Run:
    def __init__(self, args, fleet, tokenizer_check):
        self.args, self.fleet, self.tok = args, fleet, tokenizer_check
        self.rows = []
        self.fence_rng = random.Random(f"fence-{args.seed}")
        self.pending_fence = set()  # pods that served since their last fence
        self.out = open(os.path.join(args.out, "requests.jsonl"), "w")

    # Fences -----------------------------------------------------------------------------

    def route_matched(self, ids):
        status, _, decision = http("POST", self.fleet.router_url + "/route/v1/completions",
                                   {"model": MODEL, "prompt": ids, "max_tokens": 1})
        if status != 200:
            raise RuntimeError(f"/route answered {status}: {decision}")
        return {c["pod"]: c["matched_blocks"] for c in decision["ranked"]}, decision.get("score")

    def fence(self, pod, timeout_s=60.0):
        """A fresh one-block prompt straight to the pod, then wait until the index holds it."""
        engine = self.fleet.engines[pod]
        ids = [self.fence_rng.randrange(3, 1024) for _ in range(BLOCK_SIZE + 1)]
        engine.completion(ids, max_tokens=1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            matched, _ = self.route_matched(ids)
            if matched.get(pod, 0) >= 1:
                return
            time.sleep(0.05)
        raise RuntimeError(f"fence on {pod}: its block never reached the index within {timeout_s:.0f} s")

    def level(self):
        for pod in sorted(self.pending_fence):
            if pod in self.fleet.engines and self.fleet.engines[pod].proc is not None:
                self.fence(pod)
        self.pending_fence.clear()

    # Requests ---------------------------------------------------------------------------

    def last_seq(self, http_url, pod):
        """The last seq a kvindex (serve or record) applied for `pod`, from /debug/sources."""
        status, _, sources = http("GET", http_url + "/debug/sources")
        if status != 200:
            raise RuntimeError(f"/debug/sources answered {status}")
        for src in sources.get("sources", []):
            if src.get("pod") == pod:
                return src.get("last_seq")
        return None

    def send(self, label, kind, payload, max_tokens=1, **extra):
        self.level()
        # What the index holds now is what the router scores this request against. /debug/sources
        # is refreshed on the apply thread's tick, so its seq is only a lower bound of what was
        # applied; the recorder's receive times against `sent_at` give the cut (make_fixture.py).
        applied_at_least = self.last_seq(self.fleet.kvindex_http, self.args.record_pod)
        sent_at = time.time()
        body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0.0, "return_token_ids": True, **extra}
        body["messages" if kind == "chat" else "prompt"] = payload
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        status, headers, response = http("POST", self.fleet.router_url + path, body)
        if status != 200:
            raise RuntimeError(f"{label}: router answered {status}: {response}")
        pod = headers.get("x-kvindex-pod")
        matched = int(headers.get("x-kvindex-matched-blocks", "0"))
        total_blocks = int(headers.get("x-kvindex-total-blocks", "-1"))
        score = headers.get("x-kvindex-score")
        ids = response.get("prompt_token_ids") if kind == "chat" else response["choices"][0].get("prompt_token_ids")
        prompt_tokens = response["usage"]["prompt_tokens"]
        got = cached_tokens(response)
        cap = (prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE  # the engine computes at least one token
        predicted = min(matched * BLOCK_SIZE, cap)
        tokenizer_same = self.tok.check(label, kind, payload, ids)
        row = {
            "label": label, "endpoint": kind, "pod": pod, "score": score, "matched_blocks": matched,
            "total_blocks": total_blocks, "prompt_tokens": prompt_tokens, "cached_tokens": got,
            "predicted_cached_tokens": predicted, "capped": matched * BLOCK_SIZE > cap,
            "agree": predicted == got, "over": predicted > got,
            "router_blocks_ok": total_blocks == prompt_tokens // BLOCK_SIZE,
            "tokenizer_same": tokenizer_same, "vllm_xargs": extra.get("vllm_xargs"),
            "sent_at": sent_at, "applied_at_least": applied_at_least, "prompt_token_ids": ids,
        }
        self.rows.append(row)
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        mark = "ok  " if row["agree"] else ("OVER" if row["over"] else "UNDR")
        log(f"{mark} {label:<28} pod {pod} prompt {prompt_tokens:4d} cached {got:4d} predicted {predicted:4d}"
            f" (matched {matched}{', capped' if row['capped'] else ''}, score {score})")
        if pod in self.fleet.engines:
            self.pending_fence.add(pod)
        return response, ids

    def completion(self, label, prompt, **extra):
        return self.send(label, "completion", prompt, **extra)

    def chat(self, label, messages, **extra):
        response, _ = self.send(label, "chat", messages, max_tokens=6, **extra)
        return response["choices"][0]["message"].get("content") or ""


def words(rng, n):
    vocab = ("cache block prefix engine router index token prompt batch event shard replay sequence model "
             "decode prefill attention layer kernel queue worker pod fleet latency memory vector hash "
             "request response stream socket publish subscribe evict store clear restart gap order").split()
    return " ".join(rng.choice(vocab) + (str(rng.randrange(100)) if rng.random() < 0.3 else "") for _ in range(n))


def workload(run, fleet, small_pod, big_pod, restart_small):
    rng = random.Random(run.args.seed)
    systems = [words(rng, 70) for _ in range(3)]
    convs = [{"messages": [{"role": "system", "content": systems[i % 3]}]} for i in range(6)]
    docs = [words(rng, 160) for _ in range(4)]
    questions = [[f"\nQuestion {q}: {words(rng, 12)}\nAnswer:" for q in range(4)] for _ in docs]
    remembered = []  # (label, token ids) of completions, resent as token-id prompts

    def chat_turn(turn, extra_label=""):
        for c, conv in enumerate(convs):
            conv["messages"].append({"role": "user", "content": words(rng, 18 + 4 * turn)})
            reply = run.chat(f"chat{c}.turn{turn}{extra_label}", conv["messages"])
            conv["messages"].append({"role": "assistant", "content": reply})

    def doc_round(q, tag=""):
        for d, doc in enumerate(docs):
            _, ids = run.completion(f"doc{d}.q{q}{tag}", doc + questions[d][q])
            remembered.append((f"doc{d}.q{q}", ids))

    log("== phase 1: chats over shared system prompts, documents")
    chat_turn(1)
    doc_round(0)
    chat_turn(2)
    doc_round(1)

    log("== phase 2: token-id prompts, report mode full")
    for label, ids in remembered[:4]:
        run.completion(f"ids.{label}", ids)
        run.completion(f"ids.{label}+tail", ids + [rng.randrange(3, 1024) for _ in range(40)])
    for label, ids in remembered[4:6]:
        run.completion(f"full.{label}", ids, vllm_xargs={"kv_cache_report_mode": "full"})
    # A prompt of exactly 10 blocks, twice: the pod holds all 10, the engine reports 9 (it must
    # compute the last token), so the prediction is capped by the engine's rule.
    label, ids = remembered[6]
    for i in range(2):
        run.completion(f"exact10.{label}.{i}", ids[:10 * BLOCK_SIZE])

    log("== phase 3: distinct long prompts (the small engine evicts), then repeats")
    burst = [words(rng, rng.randrange(150, 260)) for _ in range(14)]
    for i, text in enumerate(burst):
        run.completion(f"evict{i}", text)
    for i in (0, 3, 7, 13):
        run.completion(f"evict{i}.again", burst[i])
    doc_round(0, ".again")
    chat_turn(3)

    log(f"== phase 4: /reset_prefix_cache on {big_pod}")
    run.level()
    fleet.engines[big_pod].reset_prefix_cache()
    run.pending_fence.add(big_pod)  # AllBlocksCleared travels with the engine's next step
    doc_round(1, ".after-reset")
    chat_turn(4)

    log(f"== phase 5: {small_pod} stopped, requests go on, then restarted")
    run.level()
    fleet.engines[small_pod].stop()
    doc_round(2)
    restarted = restart_small()  # started here: PR_SET_PDEATHSIG follows the thread that forks
    restarted.start()
    for i in (1, 2, 5):
        run.completion(f"evict{i}.while-down", burst[i])
    restarted.join()
    if run.args.fence_restarted:
        # Not the default: it hides the restart window (see --fence-restarted).
        run.fence(small_pod)
        log(f"   {small_pod} is back; fenced before it is routed to (--fence-restarted)")
    else:
        log(f"   {small_pod} is back (no fence: the index learns of the restart from its own events)")
    # Old prefixes first: what the index still believes about the restarted pod shows here.
    doc_round(0, ".after-restart")
    doc_round(1, ".after-restart")
    chat_turn(5)
    for i in (0, 4, 8):
        run.completion(f"evict{i}.after-restart", burst[i])
    doc_round(3)
    chat_turn(6)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin-dir", required=True, help="directory with kvindex, kvindex-router, kvindex-tokenizer")
    p.add_argument("--stubs", required=True, help="generated Python gRPC stubs of proto/tokenization")
    p.add_argument("--out", required=True)
    p.add_argument("--base-port", type=int, default=18400)
    p.add_argument("--seed", default="kvindex-real-vllm-1")
    p.add_argument("--target", type=float, default=0.99)
    p.add_argument("--fences-only", action="store_true",
                   help="stop after every engine's first fence (the start-up race), before the workload")
    p.add_argument("--fence-restarted", action="store_true",
                   help="fence the restarted engine before the router may pick it: its first event makes the "
                        "index drop what the old process held. kvindex keeps a dead publisher's blocks until "
                        "the new process publishes (it does not clear a pod on disconnect), so without this the "
                        "first request routed to the restarted engine can be over-predicted")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup in `finally`
    os.makedirs(args.out, exist_ok=True)
    started = time.monotonic()
    base = args.base_port
    big_http, big_kv = base, base + 1  # per-pod mode: the engine binds its PUB (tcp://*), kvindex dials it
    small_http, central_zmq, small_replay = base + 10, base + 11, base + 12  # central mode: it dials kvindex
    fleet = Fleet()
    big_pod, small_pod = fleet.pod_id(big_http), fleet.pod_id(small_http)
    args.record_pod = big_pod
    big_cfg = EngineConfig(http_port=big_http, kv_port=big_kv, dev_mode=True,
                           log_path=os.path.join(args.out, "engine-big.log"))
    small_cfg = EngineConfig(http_port=small_http, kv_port=central_zmq, replay_port=small_replay, pub_bind=False,
                             num_gpu_blocks_override=SMALL_CACHE_BLOCKS, max_model_len=SMALL_MAX_MODEL_LEN,
                             dev_mode=True, log_path=os.path.join(args.out, "engine-small.log"))
    b = args.bin_dir
    try:
        kvindex = Service("kvindex serve", [
            f"{b}/kvindex", "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
            "--block-size", str(BLOCK_SIZE),
            "--zmq-bind", f"tcp://127.0.0.1:{central_zmq}", "--replay", f"{small_pod}=tcp://127.0.0.1:{small_replay}",
            "--pod", f"{big_pod},{MODEL},tcp://127.0.0.1:{big_kv},tcp://127.0.0.1:{big_kv + 1}",
            "--hash-seed", "0", "--vllm-version", "0.32.0", "--hash-algo", "sha256_cbor", "--hash-check-every", "1",
        ], os.path.join(args.out, "kvindex.log"), "KVINDEX_LISTENING")
        fleet.services.append(kvindex)
        fleet.kvindex_http = "http://" + kvindex.addrs["http"]
        # Item 6: `kvindex record` of the per-pod engine's stream (its PUB takes any number of
        # SUBs; the central engine dials one address, ours). The dump and the rows that name
        # `until_seq` make a replay fixture (make_fixture.py).
        recorder = Service("kvindex record", [
            f"{b}/kvindex", "record", "--out", os.path.join(args.out, "big-engine.jsonl.gz"),
            "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--block-size", str(BLOCK_SIZE),
            "--pod", f"{big_pod},{MODEL},tcp://127.0.0.1:{big_kv},tcp://127.0.0.1:{big_kv + 1}",
        ], os.path.join(args.out, "record.log"), "KVINDEX_LISTENING")
        fleet.services.append(recorder)
        fleet.recorder_http = "http://" + recorder.addrs["http"]
        tokenizer = Service("kvindex-tokenizer", [
            f"{b}/kvindex-tokenizer", "serve", "--grpc-addr", "127.0.0.1:0", "--model", f"{MODEL}={MODEL_DIR}",
        ], os.path.join(args.out, "tokenizer.log"), "listening")
        fleet.services.append(tokenizer)
        router = Service("kvindex-router", [
            f"{b}/kvindex-router", "serve", "--http-addr", "127.0.0.1:0", "--indexer", kvindex.addrs["grpc"],
            "--pod", f"{big_pod}=http://{big_pod}", "--pod", f"{small_pod}=http://{small_pod}",
            "--tokenizer", f"{MODEL}={MODEL_DIR}", "--block-size", str(BLOCK_SIZE),
            # Debug builds on a loaded 2-core machine: a 5 ms deadline would fail open and
            # under-predict for reasons that are not the index's.
            "--score-deadline-ms", "3000",
        ], os.path.join(args.out, "router.log"), "KVINDEX_ROUTER_LISTENING")
        fleet.services.append(router)
        fleet.router_url = "http://" + router.addrs["http"]
        log(f"kvindex {kvindex.addrs}, tokenizer {tokenizer.addrs}, router {router.addrs}")

        fleet.engines[big_pod] = Engine(big_cfg).start()
        fleet.engines[small_pod] = Engine(small_cfg).start()
        for pod, engine in fleet.engines.items():
            took = engine.wait_healthy(timeout_s=420)
            log(f"engine {pod} healthy {took:.0f} s after start")
        tok = TokenizerCheck(tokenizer.addrs["grpc"], args.stubs)
        run = Run(args, fleet, tok)
        for pod in fleet.engines:
            run.fence(pod, timeout_s=120)  # the events path works end to end before anything is measured
        log(f"all services up after {time.monotonic() - started:.0f} s")
        if args.fences_only:
            # The start-up race alone (kvindex serve up before the engines, each engine's first
            # batch published while our dialer may still be backing off), cheap to repeat.
            text = metrics_text(fleet.kvindex_http + "/metrics").splitlines()
            catch_ups = sum(float(l.rsplit(" ", 1)[1]) for l in text
                            if l.startswith('kvindex_replay_requests_total{reason="catch_up"} '))
            replayed = sum(float(l.rsplit(" ", 1)[1]) for l in text
                           if l.startswith('kvindex_messages_received_total{socket="DEALER"} '))
            log(f"fences only: every engine's first fence passed; catch-up replays asked {catch_ups:.0f}, "
                f"replayed messages {replayed:.0f}")
            return 0

        def restart_small():
            """Starts the small engine again now; the returned thread waits for its health."""
            engine = Engine(small_cfg)
            fleet.engines[small_pod] = engine
            engine.start()

            def wait():
                took = engine.wait_healthy(timeout_s=420)
                log(f"   engine {small_pod} restarted, healthy after {took:.0f} s")
            return threading.Thread(target=wait, daemon=True)

        workload(run, fleet, small_pod, big_pod, restart_small)
        run.level()
        final_seq = run.last_seq(fleet.kvindex_http, big_pod)
        deadline = time.monotonic() + 60
        while (run.last_seq(fleet.recorder_http, big_pod) or -1) < (final_seq or 0):
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvindex record never reached seq {final_seq} of {big_pod}")
            time.sleep(0.05)
        log(f"kvindex record holds {big_pod} up to seq {final_seq}: {args.out}/big-engine.jsonl.gz")

        text = metrics_text(fleet.kvindex_http + "/metrics")
        hash_blocks = metric_sum(text, "kvindex_hash_check_blocks_total")
        hash_mismatches = metric_sum(text, "kvindex_hash_check_mismatches_total")
        status, _, sources = http("GET", fleet.kvindex_http + "/debug/sources")
        with open(os.path.join(args.out, "sources.json"), "w") as f:
            json.dump(sources, f, indent=1)
    finally:
        fleet.stop_all()

    rows = run.rows
    n = len(rows)
    agreeing = sum(r["agree"] for r in rows)
    over = sum(r["over"] for r in rows)
    under = n - agreeing - over
    hits = sum(1 for r in rows if r["cached_tokens"] > 0)
    evicting = sum(1 for r in rows if r["pod"] == small_pod)
    capped = sum(r["capped"] for r in rows)
    router_blocks_bad = sum(not r["router_blocks_ok"] for r in rows)
    not_ok = sum(r["score"] != "ok" for r in rows)
    log(f"requests {n} ({hits} with an engine cache hit, {evicting} on the small engine, {capped} predictions "
        f"capped at prompt_tokens-1); under-predicted {under}; score not ok {not_ok}")
    log(f"kvindex-tokenizer: {tok.checked - tok.differ}/{tok.checked} text prompts tokenized as the engine did; "
        f"router total blocks wrong {router_blocks_bad}")
    log(f"hash cross-check: {hash_blocks:.0f} engine block hashes recomputed, {hash_mismatches:.0f} mismatches")
    for src in sources.get("sources", []) if isinstance(sources, dict) else []:
        log(f"source {src.get('pod')} ({src.get('mode')}): {src.get('state')}, restarts {src.get('restarts')}, "
            f"gaps {src.get('gaps')}, clears {src.get('clears')}, blocks {src.get('blocks')}, hashes checked "
            f"{src.get('hash_check_checked')}, mismatches {src.get('hash_check_mismatches')}")
    log(f"wall {time.monotonic() - started:.0f} s; rows in {args.out}/requests.jsonl")
    ok = (n > 0 and agreeing >= args.target * n and over == 0 and tok.differ == 0 and tok.checked > 0
          and router_blocks_bad == 0 and hash_blocks > 0 and hash_mismatches == 0)
    log(f"agreement {agreeing}/{n}, over-predicted {over}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
