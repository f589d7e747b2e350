"""An SGLang engine with data-parallel ranks behind one HTTP port, for kvindex-router's tests.

What comes from SGLang itself (the pinned wheel, installed `--no-deps` by scripts/setup.sh):
- each rank's KV-event publisher: `sglang/srt/disaggregation/kv_events.py`, built as the
  scheduler builds it (rank r offsets its PUB and replay ports by r and stamps its batches with
  r), through indexer/server/tests/python/sglang_release_peer.py;
- the DP controller's dispatch: `DataParallelController.maybe_external_dp_rank_routing` and
  `round_robin_scheduler` (`sglang/srt/managers/data_parallel_controller.py`, round robin being
  the default `load_balance_method` outside P/D) and the OpenAI routes' rank header,
  `OpenAIServingBase.extract_routed_dp_rank_from_header` (`entrypoints/openai/serving_base.py`):
  their source is read from the wheel and run unchanged against stand-ins for the scheduler
  sockets and the HTTP request (the modules themselves import torch and fastapi).

What is a stand-in: the radix cache of each rank (a set of page digests, SGLang 0.5.6+'s
chained SHA-256 page ids), matched as SGLang matches (whole pages, at most the prompt's length
minus one token: `Req._compute_max_prefix_len`), and a request's whole prompt pages inserted
and published once it is served, before the answer. `POST /v1/completions` takes token-id
prompts and answers with `usage.prompt_tokens_details.cached_tokens` and the rank that served
(`x-sgl-dp-rank`); `GET /metrics` has SGLang's scheduler gauges per `dp_rank`.
"""

import __future__
import ast
import http.server
import importlib.metadata
import json
import logging
import os
import sys
import threading
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../indexer/server/tests/python"))
import sglang_release_peer  # noqa: E402

sglang_peer = sglang_release_peer.sglang_peer


def wheel_functions(relative, cls_name, names, globals_):
    """Functions `names` of class `cls_name` in the installed wheel's `relative` file, compiled
    from its source as they stand, with `globals_` as their module namespace."""
    path = str(importlib.metadata.distribution("sglang").locate_file(relative))
    tree = ast.parse(open(path).read(), path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    funcs = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {f.name for f in funcs} == set(names), f"{cls_name} in {path} lacks {names}"
    namespace = dict(globals_)
    # Annotations stay unevaluated: they name the module's own imports, which are not loaded.
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module(body=funcs, type_ignores=[]), path, "exec", flags=flags, dont_inherit=True), namespace)
    return {n: namespace[n] for n in names}


class HTTPException(Exception):
    def __init__(self, status_code, detail):
        super().__init__(detail)
        self.status_code, self.detail = status_code, detail


LOG = logging.getLogger("sglang-dp-engine")
DISPATCH = wheel_functions(
    "sglang/srt/managers/data_parallel_controller.py",
    "DataParallelController",
    ["maybe_external_dp_rank_routing", "round_robin_scheduler"],
    {"sock_send": lambda worker, req: worker.append(req), "logger": LOG},
)
HEADER = wheel_functions(
    "sglang/srt/entrypoints/openai/serving_base.py",
    "OpenAIServingBase",
    ["extract_routed_dp_rank_from_header"],
    {"HTTPException": HTTPException, "logger": LOG},
)


class Controller:
    """The DP controller's dispatch methods (the wheel's) over the attributes they read; each
    worker a list its requests land in."""

    maybe_external_dp_rank_routing = DISPATCH["maybe_external_dp_rank_routing"]
    round_robin_scheduler = DISPATCH["round_robin_scheduler"]

    def __init__(self, ranks):
        self.workers = [[] for _ in range(ranks)]
        self._active_workers = list(range(ranks))
        self.status = [True] * ranks
        self.round_robin_counter = 0

    def dispatch(self, routed_dp_rank):
        """The rank SGLang's round-robin controller sends a request to."""
        req = types.SimpleNamespace(routed_dp_rank=routed_dp_rank, bootstrap_room=None)
        self.round_robin_scheduler(req)
        return next(r for r, w in enumerate(self.workers) if w and w.pop() is req)


class Rank:
    """One scheduler: SGLang's publisher and the pages its radix cache holds."""

    def __init__(self, rank, ranks, config, page_size):
        # Pure data parallelism (attention-DP size 1): the replica index offsets the publisher.
        publisher_rank = sglang_release_peer.publisher_rank(1, 0, rank)
        assert publisher_rank == rank, (publisher_rank, rank)
        self.pub = sglang_release_peer.EnginePub(f"rank{rank}", config, page_size, publisher_rank)
        self.page_size = page_size
        self.pages = {}  # digest -> page id

    def digests(self, tokens):
        p, out, prev = self.page_size, [], None
        for i in range(len(tokens) // p):
            prev = sglang_peer.page_digest(prev, tokens[i * p : (i + 1) * p])
            out.append(prev)
        return out

    def serve(self, tokens):
        """Matches `tokens` as the radix cache does, then inserts and publishes its whole pages.
        Returns the cached tokens."""
        p = self.page_size
        digests = self.digests(tokens)
        limit = (len(tokens) - 1) // p
        matched = 0
        while matched < min(limit, len(digests)) and digests[matched] in self.pages:
            matched += 1
        held = 0
        while held < len(digests) and digests[held] in self.pages:
            held += 1
        if held < len(digests):
            ids = [sglang_peer.page_id(d) for d in digests]
            event = self.pub.stored(ids[held:], ids[held - 1] if held else None, tokens[held * p : len(digests) * p], p)
            for d, i in zip(digests[held:], ids[held:]):
                self.pages[d] = i
            self.pub.publish([event])
        return matched * p


class Engine:
    def __init__(self, ranks, config, page_size, capacity_tokens):
        self.ranks = [Rank(r, ranks, config, page_size) for r in range(ranks)]
        self.controller = Controller(ranks)
        self.lock = threading.Lock()
        self.capacity_tokens, self.page_size = capacity_tokens, page_size
        self.served = []  # (rank named by the request or None, rank that served, cached tokens)

    def complete(self, headers, body):
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and prompt):
            return 400, {"error": "token-id prompts only"}, None
        body_rank = body.get("routed_dp_rank", body.get("data_parallel_rank"))
        with self.lock:
            try:
                named = HEADER["extract_routed_dp_rank_from_header"](None, types.SimpleNamespace(headers=headers), body_rank)
                rank = self.controller.dispatch(named)
            except (HTTPException, ValueError) as e:
                return 400, {"error": str(e)}, None
            cached = self.ranks[rank].serve(prompt)
            self.served.append((named, rank, cached))
        usage = {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        answer = {"id": f"cmpl-{len(self.served)}", "object": "text_completion", "model": body.get("model", ""),
                  "choices": [{"index": 0, "text": "x", "finish_reason": "length"}], "usage": usage}
        return 200, answer, rank

    def metrics(self):
        lines = []
        for name, value in [
            ("sglang:num_running_reqs", lambda r: 0.0),
            ("sglang:num_queue_reqs", lambda r: 0.0),
            ("sglang:token_usage", lambda r: len(r.pages) * self.page_size / self.capacity_tokens),
            ("sglang:max_total_num_tokens", lambda r: float(self.capacity_tokens)),
            ("sglang:page_size", lambda r: float(self.page_size)),
            ("sglang:num_pages", lambda r: float(self.capacity_tokens // self.page_size)),
        ]:
            lines.append(f"# HELP {name} Multiprocess metric")
            lines.append(f"# TYPE {name} gauge")
            for i, r in enumerate(self.ranks):
                labels = f'model_name="m",engine_type="unified",tp_rank="{i}",pp_rank="0",moe_ep_rank="0",dp_rank="{i}"'
                lines.append(f"{name}{{{labels}}} {value(r)}")
        return "\n".join(lines) + "\n"


def http_server(engine):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status, body, content_type="application/json", rank=None):
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            if rank is not None:
                self.send_header("x-sgl-dp-rank", str(rank))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/metrics":
                self.reply(200, engine.metrics(), "text/plain; version=0.0.4")
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
            if self.path != "/v1/completions":
                return self.reply(404, {"error": "not found"})
            # A repeated header reads as its first value, as Starlette's `Headers.get` does.
            headers = {}
            for k, v in self.headers.items():
                headers.setdefault(k.lower(), v)
            status, answer, rank = engine.complete(headers, body)
            self.reply(status, answer, rank=rank)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Peer(sglang_release_peer.Peer):
    def op_dp_engine_start(self, ranks, pub_port, replay_port, page_size=16, capacity_tokens=65536):
        """An engine of `ranks` DP ranks: rank r publishes on `pub_port + r`, replays on
        `replay_port + r` (SGLang's port offset), all served behind one HTTP port."""
        config = {"endpoint": f"tcp://*:{pub_port}", "replay_endpoint": f"tcp://*:{replay_port}", "topic": ""}
        self.engine = Engine(ranks, config, page_size, capacity_tokens)
        self.server = http_server(self.engine)
        return {"http": f"127.0.0.1:{self.server.server_address[1]}", "version": sglang_peer.SGLANG_VERSION,
                "ranks": [r.pub.endpoints() for r in self.engine.ranks]}

    def op_dp_engine_seqs(self):
        """Each rank's last published seq (-1: none yet)."""
        return {"seqs": [r.pub.sent - 1 for r in self.engine.ranks]}

    def op_dp_engine_ping(self):
        """An empty batch from every rank: a seq the indexer can be seen to reach."""
        return {"seqs": [r.pub.publish([]) for r in self.engine.ranks]}

    def op_dp_engine_served(self):
        """Every request served: the rank it named, the rank that served it, its cached tokens."""
        with self.engine.lock:
            return {"served": [list(s) for s in self.engine.served]}


def main():
    sglang_peer.kvpeer.Peer = Peer
    sglang_peer.kvpeer.main()


if __name__ == "__main__":
    main()
