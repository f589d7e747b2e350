#!/usr/bin/env python3
"""peer-compare: kvindex-router beside the peer routers, vllm-router and sglang-router (their
Rust gateways, from PyPI, each in its own venv), in front of the same simulated fleet.

Why a bench of its own: the routing-quality figures in `loadtest/` ask routers for a decision
on a simulated clock; this one sends real streamed OpenAI chats through real router processes,
so it also measures what a client sees (TTFT, the router's added latency with keep-alive and
fresh connections, errors when a pod dies) and what the router costs (RSS, CPU seconds).

Every run starts a cold fleet: 4 `kvindex-sim` processes (one pod each, so one can be killed),
the DeepSeek tokenizer and chat template (the router and the engines tokenize alike), and the
router(s) under test. The workload is seeded: 32 conversations x 5 turns over 4 shared tenant
system prompts, streamed with `stream_options.include_usage`, think time between turns. The
hit rate is the engines' own: `usage.prompt_tokens_details.cached_tokens` of each follow-up
turn over its prompt tokens, summed (cross-checked against the pods' prefix-cache counters).
A follow-up is "kept" when its pod held the whole previous prompt (it stayed on its pod).

Runs: `direct` (each conversation pinned to a pod, no router: the reference), and for each
router 1 and 4 replicas x {keep-alive, fresh connection per request, a pod SIGKILLed after
40% of the requests}. With 4 replicas each request goes to a replica drawn at random (seeded),
as behind an L4 balancer; kvindex-router replicas share one `kvindex serve`, the peers'
replicas are independent, as each product runs active-active. `kvindex-own` is kvindex-router
with `--reservation-ttl-ms 0`: each replica counts only its own requests (the shared in-flight
load off), the control for `kvindex` at several replicas. For kvindex-router only,
`two-indexers` runs two `kvindex serve` replicas that each dial every pod's PUB (central mode
cannot feed two), every router given both (`--indexer a --indexer b`), and `kill-indexer` the
same with one replica SIGKILLed after `--kill-at` of the requests: client errors, and the
follow-up hit against the undisturbed `two-indexers` run of the same invocation. After the 1-replica keep-alive
workload, a probe measures the router's overhead: the same short chat sent sequentially to a
pod directly and through the router, keep-alive and fresh, interleaved.

Run through `run.sh` (builds, creates the venvs); `bench.py --help` for the knobs. Writes
`results.json`, `results.md` and (with plot.py) `peer-compare.png` under `--out`.
"""

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = "bench/deepseek"
# The router names that run kvindex-router (with its indexer).
KVINDEX = ("kvindex", "kvindex-own")
# The variants that give kvindex-router two `kvindex serve` replicas (the undisturbed control
# and the one where a replica is SIGKILLed mid-run).
TWO_INDEXERS = ("two-indexers", "kill-indexer")
BLOCK = 16
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

WORDS = ("alpha bravo cable delta engine fabric gateway harbor index jitter kernel ledger memory "
         "network offset packet queue replica shard token update vector window yield zone batch "
         "cache decode encode fleet graph health input lease metric node order prefix quota route "
         "scale tenant usage value worker region cluster budget policy report sample trace").split()


# ---------------------------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------------------------

def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Workload:
    """Seeded conversations: tenant c // (conversations / tenants), arrival order shuffled."""

    def __init__(self, args):
        rng = random.Random(args.seed)
        self.tenants = [f"You are the support assistant of tenant {t}. Follow these rules. " + words(rng, args.system_words)
                        for t in range(args.tenants)]
        self.conversations = []
        per_tenant = max(1, args.conversations // args.tenants)
        for c in range(args.conversations):
            tenant = min(c // per_tenant, args.tenants - 1)
            doc = f"Conversation {c}. Here is my document: " + words(rng, args.doc_words)
            follow_ups = [f"Question {t} of conversation {c}: " + words(rng, args.user_words) for t in range(1, args.turns)]
            think = [rng.uniform(args.think_min, args.think_max) for _ in range(args.turns)]
            self.conversations.append({"tenant": tenant, "doc": doc, "follow_ups": follow_ups, "think": think})
        self.order = list(range(args.conversations))
        rng.shuffle(self.order)
        self.replica_seed = args.seed + 1


# ---------------------------------------------------------------------------------------------
# A small HTTP/1.1 client on asyncio streams: exact control of keep-alive and of when a
# streamed chunk arrives (asyncio sets TCP_NODELAY on its sockets, as HTTP client libraries do).
# ---------------------------------------------------------------------------------------------

class HttpError(Exception):
    pass


class Connection:
    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.reader = self.writer = None
        self.used = 0

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.used = 0

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def post_sse(self, path, body, started):
        """POST `body` (JSON) and read the SSE answer. Returns a dict: status, headers, ttft
        (first chunk with content), text, usage, done, error. `started` is the request's t0."""
        if self.writer is None:
            await self.open()
        reused = self.used > 0
        self.used += 1
        data = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
                f"accept: text/event-stream\r\ncontent-length: {len(data)}\r\n\r\n").encode()
        self.writer.write(head + data)
        await self.writer.drain()
        line = await self.reader.readline()
        if not line:
            self.close()
            raise ConnectionResetError("closed before the status line" + (" (reused)" if reused else ""))
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise HttpError(f"bad status line {line[:60]!r}")
        status = int(parts[1])
        headers = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        out = {"status": status, "headers": headers, "ttft": None, "text": "", "usage": None, "done": False, "error": None}
        sse = bytearray()

        def feed(chunk):
            sse.extend(chunk)
            while True:
                end = sse.find(b"\n\n")
                if end < 0:
                    return
                event = bytes(sse[:end])
                del sse[:end + 2]
                for field in event.split(b"\n"):
                    if not field.startswith(b"data:"):
                        continue
                    payload = field[5:].strip()
                    if payload == b"[DONE]":
                        out["done"] = True
                        continue
                    try:
                        obj = json.loads(payload)
                    except ValueError:
                        out["error"] = "bad SSE json"
                        continue
                    if obj.get("usage"):
                        out["usage"] = obj["usage"]
                    for choice in obj.get("choices") or []:
                        delta = choice.get("delta") or {}
                        text = delta.get("content") or choice.get("text") or ""
                        if text:
                            if out["ttft"] is None:
                                out["ttft"] = time.perf_counter() - started
                            out["text"] += text
                    if "error" in obj and status == 200:
                        out["error"] = f"error event: {str(obj['error'])[:80]}"

        keep = headers.get("connection", "").lower() != "close"
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await self.reader.readline()
                if not size_line:
                    raise ConnectionResetError("closed inside a chunked body")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                feed(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
        elif "content-length" in headers:
            feed(await self.reader.readexactly(int(headers["content-length"])))
            if status != 200:
                out["error"] = f"HTTP {status}: {bytes(sse)[:120].decode(errors='replace')}"
        else:
            feed(await self.reader.read())
            keep = False
        if sse and status == 200 and not out["done"]:
            feed(b"\n\n")
        if not keep:
            self.close()
        return out


async def chat(conn, path, body, fresh):
    """One streamed chat on `conn` (a new connection when `fresh`). A keep-alive connection the
    server closed while idle is reopened once, as HTTP clients do, before anything was sent back."""
    started = time.perf_counter()
    try:
        if fresh:
            conn.close()
        reused = conn.writer is not None and conn.used > 0
        try:
            result = await conn.post_sse(path, body, started)
        except (ConnectionResetError, BrokenPipeError) as error:
            if not reused or "status line" not in str(error):
                raise
            conn.close()
            started = time.perf_counter()
            result = await conn.post_sse(path, body, started)
    except (OSError, HttpError, asyncio.IncompleteReadError, ValueError) as error:
        conn.close()
        return {"status": 0, "headers": {}, "ttft": None, "text": "", "usage": None, "done": False,
                "error": f"{type(error).__name__}: {error}"[:160], "total": time.perf_counter() - started}
    result["total"] = time.perf_counter() - started
    if fresh:
        conn.close()
    if result["status"] != 200 and not result["error"]:
        result["error"] = f"HTTP {result['status']}"
    elif result["status"] == 200 and not result["done"] and not result["error"]:
        result["error"] = "stream ended without [DONE]"
    return result


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------

class Processes:
    """Everything a run starts, each in its own process group, stopped by id at the end."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = []

    def start(self, name, argv, env=None):
        log = open(os.path.join(self.logdir, f"{name}.log"), "w")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                                env=env, start_new_session=True)
        proc.bench_name = name
        self.procs.append(proc)
        return proc

    def stop(self, proc, sig=signal.SIGTERM):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop_all(self):
        for proc in reversed(self.procs):
            self.stop(proc)
        self.procs.clear()


def read_line(proc, prefix, timeout=60.0):
    """The first stdout line starting with `prefix` (the process's readiness line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{proc.bench_name} exited (status {proc.poll()}) before printing {prefix!r}")
        if line.startswith(prefix):
            return line
    raise RuntimeError(f"{proc.bench_name}: no {prefix!r} line within {timeout} s")


def http_json(url, body=None, token=None, timeout=5.0):
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as resp:
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw.strip() else None)


def wait_for(what, check, timeout=60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as error:  # noqa: BLE001 - still starting: connection refused, 503, ...
            last = error
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what} (last: {last})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(pid):
    """`pid` and its descendants (the peers' Python launchers host the Rust router in process;
    any child they start counts too)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def usage_of(pids):
    """CPU seconds (user + system) and peak RSS (VmHWM, MiB) summed over `pids`."""
    cpu = peak = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / CLK_TCK
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak += int(line.split()[1]) / 1024
        except (OSError, IndexError, ValueError):
            continue
    return cpu, peak


# ---------------------------------------------------------------------------------------------
# Fleet, indexer, routers
# ---------------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.args = args
        self.bin = args.bin_dir
        self.tokenizer = args.tokenizer

    def start_fleet(self, procs, zmq_connect=None):
        pods = []
        for i in range(self.args.pods):
            argv = [os.path.join(self.bin, "kvindex-sim"), "--pods", "1", "--model", MODEL, "--block-size", str(BLOCK),
                    "--kv-blocks", str(self.args.kv_blocks), "--http-base-port", "0", "--replay-base-port", "0",
                    "--tokenizer", self.tokenizer, "--decode-ms-per-token", str(self.args.decode_ms),
                    "--prefill-tokens-per-s", str(self.args.prefill_rate), "--output-seed", str(i)]
            argv += ["--zmq-connect", zmq_connect] if zmq_connect else ["--zmq-bind-base-port", "0"]
            proc = procs.start(f"pod{i}", argv)
            pod = json.loads(read_line(proc, "{"))
            pod["proc"] = proc
            pods.append(pod)
        return pods

    def start_indexer(self, procs, workdir, name="kvindex-serve", central=True, token=None):
        """One `kvindex serve`. `central`: it binds the ZeroMQ endpoint every pod dials (one
        indexer only: an engine dials one endpoint); else it dials each pod's PUB, so several
        replicas can each hold the whole fleet. Replicas share `token` (the admin token)."""
        if token is None:
            token = secrets.token_urlsafe(24)
            token_file = os.path.join(workdir, "admin-token")
            with open(token_file, "w") as f:
                f.write(token)
            self.token_file = token_file
        argv = [os.path.join(self.bin, "kvindex"), "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
                "--block-size", str(BLOCK), "--admin-token-file", self.token_file]
        if central:
            argv += ["--zmq-bind", "tcp://127.0.0.1:0"]
        proc = procs.start(name, argv)
        line = read_line(proc, "KVINDEX_LISTENING ")
        addrs = dict(pair.split("=", 1) for pair in line.split()[1:])
        return proc, addrs, token

    def register(self, addrs, token, pods, dial=False):
        for pod in pods:
            body = {"pod": pod["pod_id"], "model": MODEL, "replay_endpoint": pod["replay"]}
            if dial:
                body["endpoint"] = pod["pub"]
            http_json(f"http://{addrs['http']}/pods", body, token=token)
        if dial:
            def ready():
                with urllib.request.urlopen(f"http://{addrs['http']}/readyz", timeout=5) as resp:
                    return resp.status == 200
            wait_for(f"the indexer at {addrs['http']} to be ready", ready)

    def start_routers(self, procs, name, replicas, pods, indexer_grpc=()):
        """`replicas` router processes, each given every indexer in `indexer_grpc`; returns
        [(proc, "host:port")]."""
        urls = [f"http://{p['http']}" for p in pods]
        out = []
        for r in range(replicas):
            if name in KVINDEX:
                argv = [os.path.join(self.bin, "kvindex-router"), "serve", "--http-addr", "127.0.0.1:0",
                        *(a for grpc in indexer_grpc for a in ("--indexer", grpc)), "--tokenizer", f"{MODEL}={self.tokenizer}",
                        # Records each placement in the index before the engine's events arrive
                        # (docs/RECORD_ROUTE.md), as an operator following the docs runs it.
                        "--indexer-admin-token-file", self.token_file]
                argv += [a for p in pods for a in ("--pod", f"{p['pod_id']}=http://{p['http']}")]
                argv += self.args.kvindex_router_args.split()
                if name == "kvindex-own":
                    argv += ["--reservation-ttl-ms", "0"]  # own counts only: the shared load's control
                proc = procs.start(f"router{r}", argv)
                addr = dict(pair.split("=", 1) for pair in read_line(proc, "KVINDEX_ROUTER_LISTENING ").split()[1:])["http"]
            else:
                port, metrics = free_port(), free_port()
                if name == "sglang":
                    argv = [os.path.join(self.args.peer_venvs, "sglang-router", "bin", "python"), "-m", "sglang_router.launch_router",
                            "--log-level", "warn"]
                else:
                    argv = [os.path.join(self.args.peer_venvs, "vllm-router", "bin", "vllm-router"), "--log-level", "warning"]
                argv += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(metrics),
                         "--prometheus-host", "127.0.0.1", "--policy", "cache_aware", "--worker-urls", *urls]
                argv += (self.args.sglang_args if name == "sglang" else self.args.vllm_args).split()
                proc = procs.start(f"router{r}", argv)
                addr = f"127.0.0.1:{port}"
            out.append((proc, addr))
        for proc, addr in out:
            if name in KVINDEX:
                wait_for("the router to scrape every pod", lambda: all(
                    p["load"]["scrape_age_ms"] is not None for p in http_json(f"http://{addr}/debug/pods")[1]["pods"]))
            else:
                def ready(proc=proc, addr=addr):
                    if proc.poll() is not None:
                        raise SystemExit(f"{name} router exited with {proc.returncode}; see its log")
                    return http_json(f"http://{addr}/v1/models")[0] == 200
                wait_for(f"{name} router at {addr}", ready, timeout=120)
        return out


def indexer_counters(indexers):
    """Per indexer replica (None once killed): ScoreTokens answered and reservations taken,
    from its /metrics: which replica served the run, before and after a kill."""
    out = []
    for proc, addrs in indexers:
        if proc.poll() is not None:
            out.append(None)
            continue
        scores = reserved = 0.0
        with urllib.request.urlopen(f"http://{addrs['http']}/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith('kvindex_score_requests_total{outcome="ok"}'):
                    scores += float(line.split()[-1])
                elif line.startswith("kvindex_reservations_total{") and 'result="reserved"' in line:
                    reserved += float(line.split()[-1])
        out.append({"score_requests": scores, "reservations": reserved})
    return out


def pod_counters(pods):
    """Sum of the pods' own prefix-cache counters (queries, hits) over the live pods."""
    queries = hits = 0.0
    for pod in pods:
        if pod["proc"].poll() is not None:
            continue
        with urllib.request.urlopen(f"http://{pod['http']}/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("vllm:prefix_cache_queries_total"):
                    queries += float(line.split()[-1])
                elif line.startswith("vllm:prefix_cache_hits_total"):
                    hits += float(line.split()[-1])
    return queries, hits


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------

async def play(args, workload, targets, fresh, kill_after=None, on_kill=None, pinned=False):
    """Plays every conversation; returns the per-request records."""
    records = []
    done = [0]
    killed = asyncio.Event()
    total = args.conversations * args.turns

    async def conversation(position, c):
        conv = workload.conversations[c]
        rng = random.Random(workload.replica_seed * 1000 + c)
        conns = {}
        messages = [{"role": "system", "content": workload.tenants[conv["tenant"]]}, {"role": "user", "content": conv["doc"]}]
        await asyncio.sleep(position * args.stagger)
        prev_prompt = None
        for turn in range(args.turns):
            target = c % len(targets) if pinned else (rng.randrange(len(targets)) if len(targets) > 1 else 0)
            conn = conns.setdefault(target, Connection(targets[target]))
            body = {"model": MODEL, "messages": messages, "max_tokens": args.max_tokens, "stream": True,
                    "stream_options": {"include_usage": True}}
            sent = time.monotonic()
            try:
                result = await asyncio.wait_for(chat(conn, "/v1/chat/completions", body, fresh), timeout=args.request_timeout)
            except asyncio.TimeoutError:
                conn.close()
                result = {"status": 0, "headers": {}, "ttft": None, "text": "", "usage": None, "done": False,
                          "error": f"timeout after {args.request_timeout} s", "total": args.request_timeout}
            usage = result["usage"] or {}
            record = {"conversation": c, "turn": turn, "target": target, "status": result["status"],
                      "error": result["error"], "ttft": result["ttft"], "total": result["total"],
                      "prompt_tokens": usage.get("prompt_tokens"),
                      "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                      "sent": sent, "after_kill": killed.is_set(), "prev_prompt_tokens": prev_prompt,
                      "kvindex_score": result["headers"].get("x-kvindex-score")}
            records.append(record)
            done[0] += 1
            if kill_after is not None and done[0] == kill_after and not killed.is_set():
                killed.set()
                on_kill()
            if result["error"] is None:
                messages = messages + [{"role": "assistant", "content": result["text"]}]
                prev_prompt = usage.get("prompt_tokens")
            else:
                prev_prompt = None
            if turn + 1 < args.turns:
                messages = messages + [{"role": "user", "content": conv["follow_ups"][turn]}]
                await asyncio.sleep(conv["think"][turn])
        for conn in conns.values():
            conn.close()

    await asyncio.gather(*(conversation(i, c) for i, c in enumerate(workload.order)))
    assert len(records) == total
    return records


async def probe(args, direct, router):
    """The router's added latency: one short chat, sequentially, direct and through the router,
    keep-alive and fresh, interleaved so drift hits all four alike."""
    body = {"model": MODEL, "messages": [{"role": "system", "content": "probe " + "x " * 120},
                                         {"role": "user", "content": "ping"}],
            "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    modes = {("direct", False): Connection(direct), ("direct", True): Connection(direct),
             ("router", False): Connection(router), ("router", True): Connection(router)}
    samples = {key: [] for key in modes}
    errors = 0
    for i in range(args.probe_warmup + args.probes):
        for (where, fresh), conn in modes.items():
            result = await chat(conn, "/v1/chat/completions", body, fresh)
            if result["error"] or result["ttft"] is None:
                errors += 1
            elif i >= args.probe_warmup:
                samples[(where, fresh)].append(result["ttft"])
    for conn in modes.values():
        conn.close()
    out = {"errors": errors}
    for fresh in (False, True):
        mode = "fresh" if fresh else "keepalive"
        d, r = samples[("direct", fresh)], samples[("router", fresh)]
        out[mode] = {"direct_p50": pct(d, 50), "router_p50": pct(r, 50), "direct_p90": pct(d, 90), "router_p90": pct(r, 90),
                     "overhead_p50": pct(r, 50) - pct(d, 50) if d and r else None,
                     "overhead_p90": pct(r, 90) - pct(d, 90) if d and r else None, "n": len(r)}
    return out


def pct(values, p):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = (len(values) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(records, args, kill_time=None):
    ok = [r for r in records if r["error"] is None]
    follow = [r for r in ok if r["turn"] > 0 and r["prompt_tokens"]]
    prompt = sum(r["prompt_tokens"] for r in follow)
    cached = sum(r["cached_tokens"] or 0 for r in follow)
    kept = sum(1 for r in follow if r["prev_prompt_tokens"] is not None
               and (r["cached_tokens"] or 0) >= r["prev_prompt_tokens"] // BLOCK * BLOCK)
    with_prev = sum(1 for r in follow if r["prev_prompt_tokens"] is not None)
    ttfts = [r["ttft"] for r in ok]
    # First turns are cold but for their tenant's prompt, follow-ups mostly cached: a router
    # that queues the first on the pod holding the tenant's prompt shows it here, not in the hit rate.
    first = [r["ttft"] for r in ok if r["turn"] == 0]
    later = [r["ttft"] for r in ok if r["turn"] > 0]
    errors = {}
    for r in records:
        if r["error"] is not None:
            key = re.sub(r"\d+", "N", r["error"])[:70]
            errors[key] = errors.get(key, 0) + 1
    scores = {}
    for r in records:
        if r["kvindex_score"]:
            scores[r["kvindex_score"]] = scores.get(r["kvindex_score"], 0) + 1
    after = [r for r in follow if r["after_kill"]]
    # A pod's death breaks the streams it was serving (no router can resume one); a request sent
    # after it died must still succeed: failing those is the router's doing.
    failed_after = sum(1 for r in records if r["error"] is not None and kill_time is not None and r["sent"] > kill_time)
    return {
        "requests": len(records), "errors": len(records) - len(ok), "error_kinds": errors,
        "errors_sent_after_kill": failed_after if kill_time is not None else None,
        "follow_up_hit_rate": cached / prompt if prompt else None,
        "follow_ups": len(follow), "kept": kept, "kept_of": with_prev,
        "hit_rate_after_kill": (sum(r["cached_tokens"] or 0 for r in after) / sum(r["prompt_tokens"] for r in after)) if after else None,
        "ttft_p50": pct(ttfts, 50), "ttft_p90": pct(ttfts, 90), "ttft_p99": pct(ttfts, 99),
        "first_ttft_p90": pct(first, 90), "first_ttft_p99": pct(first, 99),
        "follow_ttft_p90": pct(later, 90), "follow_ttft_p99": pct(later, 99),
        "mean_prompt_tokens": (sum(r["prompt_tokens"] for r in ok if r["prompt_tokens"]) / len(ok)) if ok else None,
        "kvindex_score": scores or None,
    }


def run_one(bench, args, workload, router, replicas, variant, logroot):
    """A cold fleet, the router(s), the workload; returns the run's summary."""
    name = f"{router}-x{replicas}-{variant}"
    logdir = os.path.join(logroot, name)
    os.makedirs(logdir, exist_ok=True)
    procs = Processes(logdir)
    try:
        indexers = []  # (proc, addrs)
        if router in KVINDEX and variant in TWO_INDEXERS:
            # Two replicas, each dialling every pod's PUB (an engine dials one central endpoint,
            # so central mode cannot feed two); every router is given both.
            pods = bench.start_fleet(procs)
            token = None
            for i in range(2):
                proc, addrs, token = bench.start_indexer(procs, logdir, name=f"kvindex-serve{i}", central=False, token=token)
                bench.register(addrs, token, pods, dial=True)
                indexers.append((proc, addrs))
        elif router in KVINDEX:
            proc, addrs, token = bench.start_indexer(procs, logdir)
            pods = bench.start_fleet(procs, zmq_connect=addrs["zmq"])
            bench.register(addrs, token, pods)
            indexers.append((proc, addrs))
        else:
            pods = bench.start_fleet(procs)
        if router == "direct":
            routers = []
            targets = [p["http"] for p in pods]
        else:
            routers = bench.start_routers(procs, router, replicas, pods, indexer_grpc=[a["grpc"] for _, a in indexers])
            targets = [addr for _, addr in routers]
        measured = [tree(p.pid) for p, _ in routers]
        before = [usage_of(pids) for pids in measured]
        index_before = [usage_of([p.pid]) for p, _ in indexers]
        index_last = list(index_before)  # a killed replica's figures are read just before the kill
        victim = pods[args.kill_pod % len(pods)]
        kill_at = None
        killed_at = []
        if variant in ("kill", "kill-indexer", "two-indexers"):
            kill_at = int(args.conversations * args.turns * args.kill_at)

        def kill():
            if variant == "kill-indexer":
                target = indexers[args.kill_indexer % len(indexers)][0]
                index_last[args.kill_indexer % len(indexers)] = usage_of([target.pid])
                killed_at.append(time.monotonic())
                os.killpg(target.pid, signal.SIGKILL)
            elif variant == "kill":
                killed_at.append(time.monotonic())
                os.killpg(victim["proc"].pid, signal.SIGKILL)
            else:  # two-indexers: the undisturbed control, only the moment is marked
                killed_at.append(time.monotonic())

        started = time.monotonic()
        records = asyncio.run(play(args, workload, targets, fresh=(variant == "fresh"), kill_after=kill_at, on_kill=kill,
                                   pinned=(router == "direct")))
        wall = time.monotonic() - started
        after = [usage_of(pids) for pids in measured]
        index_after = [usage_of([p.pid]) if p.poll() is None else last for (p, _), last in zip(indexers, index_last)]
        summary = summarize(records, args, kill_time=killed_at[0] if killed_at else None)
        summary.update({"router": router, "replicas": replicas, "variant": variant, "wall_s": wall,
                        "indexers": len(indexers),
                        "router_cpu_s": sum(a[0] - b[0] for a, b in zip(after, before)) if routers else None,
                        "router_rss_mib": sum(a[1] for a in after) if routers else None,
                        "indexer_cpu_s": sum(a[0] - b[0] for a, b in zip(index_after, index_before)) if indexers else None,
                        "indexer_rss_mib": sum(a[1] for a in index_after) if indexers else None})
        if indexers:
            summary["indexer_counters"] = indexer_counters(indexers)
        if variant != "kill":
            queries, hits = pod_counters(pods)
            reported = sum(r["cached_tokens"] or 0 for r in records if r["error"] is None)
            summary["pod_hits_total"] = hits
            summary["pod_queries_total"] = queries
            summary["usage_matches_pods"] = abs(hits - reported) < 0.5
        if variant == "keepalive" and replicas == 1 and router != "direct" and not args.no_probe:
            summary["probe"] = asyncio.run(probe(args, pods[0]["http"], targets[0]))
        summary["records"] = records
        return summary
    finally:
        procs.stop_all()


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

LABEL = {"direct": "direct (pinned)", "kvindex": "kvindex-router", "kvindex-own": "kvindex-router, own counts only",
         "vllm": "vllm-router 0.1.17", "sglang": "sglang-router 0.3.2"}


def ms(value):
    return "–" if value is None else f"{value * 1000:.0f}"


def median(values):
    values = sorted(v for v in values if v is not None)
    return pct(values, 50) if values else None


def aggregate(runs):
    """One summary per (router, replicas, variant): the median of each figure over the repeats;
    the hit rates of every repeat kept in `hit_rates`."""
    groups = {}
    for s in runs:
        groups.setdefault((s["router"], s["replicas"], s["variant"]), []).append(s)
    out = []
    for group in groups.values():
        merged = dict(group[0])
        for key, value in group[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("replicas", "repeat"):
                merged[key] = median([g.get(key) for g in group])
        merged["hit_rates"] = [g["follow_up_hit_rate"] for g in group]
        merged["runs"] = len(group)
        kinds = {}
        for g in group:
            for k, v in g["error_kinds"].items():
                kinds[k] = kinds.get(k, 0) + v
        merged["error_kinds"] = kinds
        outcomes = {}
        for g in group:
            for k, v in (g.get("kvindex_score") or {}).items():
                outcomes[k] = outcomes.get(k, 0) + v
        merged["kvindex_score"] = outcomes or None
        if group[0].get("probe"):
            probe = {"errors": sum(g["probe"]["errors"] for g in group)}
            for mode in ("keepalive", "fresh"):
                probe[mode] = {k: median([g["probe"][mode][k] for g in group]) for k in group[0]["probe"][mode]}
            merged["probe"] = probe
        merged.pop("records", None)
        out.append(merged)
    return out


def table(runs, meta):
    lines = []
    lines.append("| router | replicas | connections | follow-up hit rate | kept | TTFT p50 | p90 | p99 (ms) | first turns p90 / p99 | follow-ups p90 / p99 | errors | RSS MiB | CPU s |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in runs:
        if s["variant"] == "kill":
            continue
        rss = "–" if s["router_rss_mib"] is None else f"{s['router_rss_mib']:.0f}"
        cpu = "–" if s["router_cpu_s"] is None else f"{s['router_cpu_s']:.2f}"
        if s["indexer_rss_mib"] is not None:
            rss += f" + {s['indexer_rss_mib']:.0f}"
            cpu += f" + {s['indexer_cpu_s']:.2f}"
        hit = "–" if s["follow_up_hit_rate"] is None else f"{s['follow_up_hit_rate']:.3f}"
        lines.append(f"| {LABEL[s['router']]} | {s['replicas'] if s['router'] != 'direct' else '–'} | {s['variant']} | {hit} | "
                     f"{s['kept']:.0f}/{s['kept_of']:.0f} | {ms(s['ttft_p50'])} | {ms(s['ttft_p90'])} | {ms(s['ttft_p99'])} | "
                     f"{ms(s.get('first_ttft_p90'))} / {ms(s.get('first_ttft_p99'))} | "
                     f"{ms(s.get('follow_ttft_p90'))} / {ms(s.get('follow_ttft_p99'))} | "
                     f"{s['errors']:.0f} | {rss} | {cpu} |")
    if any(s["runs"] > 1 for s in runs):
        lines.append("")
        lines.append("Medians over the repeats; follow-up hit rate of each repeat: " + "; ".join(
            f"{LABEL[s['router']]} ×{s['replicas']} {s['variant']}: " + " / ".join(f"{h:.3f}" for h in s["hit_rates"] if h is not None)
            for s in runs))
    scored = [s for s in runs if s.get("kvindex_score")]
    if scored:
        lines.append("")
        lines.append("kvindex-router's scoring outcome per request (`x-kvindex-score`, all repeats): " + "; ".join(
            ("" if s["router"] == "kvindex" else "own counts ") + f"×{s['replicas']} {s['variant']}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(s["kvindex_score"].items()))
            for s in scored))
    kills = [s for s in runs if s["variant"] == "kill"]
    if kills:
        lines.append("")
        lines.append(f"A pod SIGKILLed after {meta['kill_after']} of {meta['requests']} requests (keep-alive):")
        lines.append("")
        lines.append("| router | replicas | errors | of them sent after the kill | follow-up hit rate | after the kill | TTFT p99 (ms) | error kinds (all repeats) |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for s in kills:
            kinds = "; ".join(f"{k} ×{v}" for k, v in s["error_kinds"].items()) or "–"
            hit = "–" if s["follow_up_hit_rate"] is None else f"{s['follow_up_hit_rate']:.3f}"
            after = "–" if s["hit_rate_after_kill"] is None else f"{s['hit_rate_after_kill']:.3f}"
            lines.append(f"| {LABEL[s['router']]} | {s['replicas']} | {s['errors']:.0f} | {s['errors_sent_after_kill']:.0f} | {hit} | {after} | {ms(s['ttft_p99'])} | {kinds} |")
    ikills = [s for s in runs if s["variant"] == "kill-indexer"]
    if ikills:
        calm = {(s["router"], s["replicas"]): s for s in runs if s["variant"] == "two-indexers"}
        lines.append("")
        lines.append(f"Two `kvindex serve` replicas, each router given both; in `kill-indexer` replica "
                     f"{meta['args'].get('kill_indexer', 0)} is SIGKILLed after {meta['kill_after']} of {meta['requests']} "
                     f"requests, against the undisturbed `two-indexers` run of the same invocation (keep-alive; "
                     f"\"after\" = the follow-ups sent after that many requests):")
        lines.append("")
        lines.append("| router | replicas | errors | of them sent after the kill | follow-up hit, killed / undisturbed | ratio | "
                     "after the kill / same window undisturbed | ratio | TTFT p99 killed / undisturbed (ms) | scoring outcomes, killed run |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")

        def ratio(a, b):
            return "–" if a is None or not b else f"{a / b:.3f}"

        def rate(v):
            return "–" if v is None else f"{v:.3f}"
        for s in ikills:
            c = calm.get((s["router"], s["replicas"]), {})
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted((s.get("kvindex_score") or {}).items())) or "–"
            survivors = [c for c in s.get("indexer_counters") or [] if c]
            if survivors:
                outcomes += f"; the survivor answered {survivors[0]['score_requests']:.0f} ScoreTokens (last repeat)"
            lines.append(f"| {LABEL[s['router']]} | {s['replicas']} | {s['errors']:.0f} | {s['errors_sent_after_kill']:.0f} | "
                         f"{rate(s['follow_up_hit_rate'])} / {rate(c.get('follow_up_hit_rate'))} | "
                         f"**{ratio(s['follow_up_hit_rate'], c.get('follow_up_hit_rate'))}** | "
                         f"{rate(s['hit_rate_after_kill'])} / {rate(c.get('hit_rate_after_kill'))} | "
                         f"{ratio(s['hit_rate_after_kill'], c.get('hit_rate_after_kill'))} | "
                         f"{ms(s['ttft_p99'])} / {ms(c.get('ttft_p99'))} | {outcomes} |")
    probes = [s for s in runs if s.get("probe")]
    if probes:
        lines.append("")
        lines.append(f"Router overhead: TTFT through the router minus direct to a pod, one short chat sent sequentially "
                     f"({meta['probes']} samples per cell, interleaved), p50 / p90 in ms:")
        lines.append("")
        lines.append("| router | direct keep-alive | via router keep-alive | overhead keep-alive | direct fresh | via router fresh | overhead fresh |")
        lines.append("|---|---|---|---|---|---|---|")
        for s in probes:
            k, f = s["probe"]["keepalive"], s["probe"]["fresh"]
            lines.append(f"| {LABEL[s['router']]} | {ms(k['direct_p50'])} / {ms(k['direct_p90'])} | {ms(k['router_p50'])} / {ms(k['router_p90'])} | "
                         f"**{ms(k['overhead_p50'])}** / {ms(k['overhead_p90'])} | {ms(f['direct_p50'])} / {ms(f['direct_p90'])} | "
                         f"{ms(f['router_p50'])} / {ms(f['router_p90'])} | **{ms(f['overhead_p50'])}** / {ms(f['overhead_p90'])} |")
    return "\n".join(lines)


def main():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    fixtures = os.environ.get("KVINDEX_FIXTURES", "/var/tmp/kvindex-fixtures")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin-dir", default=os.environ.get("KVINDEX_BIN_DIR", os.path.join(target, "release")),
                   help="where kvindex, kvindex-router and kvindex-sim are ($KVINDEX_BIN_DIR, else $CARGO_TARGET_DIR/release)")
    p.add_argument("--peer-venvs", default=os.environ.get("PEER_VENVS", "/var/tmp/peer-venvs"))
    p.add_argument("--tokenizer", default=os.path.join(fixtures, "models", "deepseek"))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "peer-compare"))
    p.add_argument("--routers", default="direct,kvindex,vllm,sglang",
                   help="any of direct, kvindex, kvindex-own (shared in-flight load off), vllm, sglang")
    p.add_argument("--replicas", default="1,4")
    p.add_argument("--variants", default="keepalive,fresh,kill",
                   help="any of keepalive, fresh, kill (a pod SIGKILLed), and for kvindex only two-indexers (two "
                        "`kvindex serve` replicas dialling every pod, each router given both) and kill-indexer (the "
                        "same, one replica SIGKILLed at --kill-at)")
    p.add_argument("--kvindex-router-args", default=os.environ.get("KVINDEX_ROUTER_ARGS", ""),
                   help="extra kvindex-router flags (e.g. weights), as one string")
    p.add_argument("--vllm-args", default="")
    p.add_argument("--sglang-args", default="")
    p.add_argument("--pods", type=int, default=4)
    p.add_argument("--kv-blocks", type=int, default=1280)
    p.add_argument("--decode-ms", type=float, default=20)
    p.add_argument("--prefill-rate", type=float, default=16000)
    p.add_argument("--conversations", type=int, default=32)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--system-words", type=int, default=700)
    p.add_argument("--doc-words", type=int, default=900)
    p.add_argument("--user-words", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--think-min", type=float, default=0.3)
    p.add_argument("--think-max", type=float, default=1.2)
    p.add_argument("--stagger", type=float, default=0.04, help="seconds between conversation starts")
    p.add_argument("--kill-pod", type=int, default=1)
    p.add_argument("--kill-at", type=float, default=0.4, help="kill after this share of the requests")
    p.add_argument("--kill-indexer", type=int, default=0,
                   help="kill-indexer: which of the two indexers to SIGKILL (0: the first --indexer, the one routers ask first)")
    p.add_argument("--probes", type=int, default=40)
    p.add_argument("--probe-warmup", type=int, default=5)
    p.add_argument("--no-probe", action="store_true")
    p.add_argument("--request-timeout", type=float, default=60)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--repeat", type=int, default=1, help="play the whole plan this many times; tables show medians")
    p.add_argument("--smoke", action="store_true",
                   help="tiny and fast (kvindex-router and direct only, 4 conversations x 2 turns, 1 replica, keep-alive); "
                        "exits 1 on any error")
    p.add_argument("--label", default=os.environ.get("PEER_COMPARE_LABEL"),
                   help="what build this is, for the plot's title and results.json (default: this checkout's commit)")
    p.add_argument("--report", metavar="RESULTS_JSON", help="only print the tables of an earlier run's results.json")
    args = p.parse_args()
    if args.report:
        with open(args.report) as f:
            data = json.load(f)
        print(table(aggregate(data["runs"]), data["meta"]))
        return
    if args.smoke:
        args.routers, args.replicas, args.variants = "direct,kvindex", "1", "keepalive"
        args.conversations, args.turns, args.probes, args.probe_warmup = 4, 2, 3, 1
        args.system_words, args.doc_words = 100, 100
    for binary in ("kvindex", "kvindex-router", "kvindex-sim"):
        if not os.access(os.path.join(args.bin_dir, binary), os.X_OK):
            sys.exit(f"peer-compare: no {binary} in {args.bin_dir} (set KVINDEX_BIN_DIR or build it)")
    if not os.path.isfile(os.path.join(args.tokenizer, "tokenizer.json")):
        sys.exit(f"peer-compare: no tokenizer at {args.tokenizer} (scripts/setup.sh fetches the fixtures)")
    os.makedirs(args.out, exist_ok=True)
    bench = Bench(args)
    workload = Workload(args)
    routers = args.routers.split(",")
    replica_counts = [int(x) for x in args.replicas.split(",")]
    variants = args.variants.split(",")
    plan = []
    for router in routers:
        for replicas in ([1] if router == "direct" else replica_counts):
            for variant in variants:
                if router == "direct" and variant == "kill":
                    continue
                if router not in KVINDEX and variant in TWO_INDEXERS:
                    continue
                plan.append((router, replicas, variant))
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": args.label or commit,
            "bin_dir": args.bin_dir, "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
            "requests": args.conversations * args.turns, "kill_after": int(args.conversations * args.turns * args.kill_at),
            "probes": args.probes, "args": {k: v for k, v in vars(args).items()}}
    runs = []
    for repeat in range(args.repeat):
        for router, replicas, variant in plan:
            t0 = time.monotonic()
            logs = os.path.join(args.out, "logs" if args.repeat == 1 else f"logs-{repeat + 1}")
            summary = run_one(bench, args, workload, router, replicas, variant, logs)
            summary["repeat"] = repeat + 1
            runs.append(summary)
            report_line(summary, time.monotonic() - t0)
    meta["load_after"] = os.getloadavg()[0]
    summary = aggregate(runs)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary, "runs": runs}, f, indent=1)
    md = table(summary, meta)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md + "\n")
    print()
    print(md)
    print(f"\nresults: {args.out}/results.json, {args.out}/results.md")
    if args.smoke:
        bad = [s for s in runs if s["errors"] or s["follow_up_hit_rate"] is None or not s.get("usage_matches_pods", True)]
        if bad or any(s.get("probe", {}).get("errors") for s in runs):
            sys.exit("peer-compare smoke: errors (see above)")
        print("peer-compare smoke: ok")


def report_line(summary, seconds):
    hit = summary["follow_up_hit_rate"]
    router, replicas, variant = summary["router"], summary["replicas"], summary["variant"]
    print(f"[{summary['repeat']}] {router:8} x{replicas} {variant:9} hit {hit if hit is None else round(hit, 3)} kept {summary['kept']}/{summary['kept_of']} "
              f"ttft p50 {ms(summary['ttft_p50'])} p99 {ms(summary['ttft_p99'])} (first turns p99 {ms(summary['first_ttft_p99'])}) ms errors {summary['errors']} "
              f"{summary['error_kinds'] or ''} ({seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
