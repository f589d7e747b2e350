"""Writes the `/server_info` shapes of this directory with each SGLang release's own code.

SGLang's HTTP server needs CUDA, but what discovery reads of `/server_info` is plain Python:
the server arguments (`dataclasses.asdict`, from 0.5.19 `resolved_dict()`), `version`, and from
0.5.15 the `kv_events` descriptor that `describe_kv_events_publisher` builds from
`--kv-events-config`. This script runs that function unchanged, taken from the release's source
(`srt/server_args.py` in 0.5.15, `srt/runtime_context.py` from 0.5.19; with its helpers
`kv_event_block_size_of` and `num_dp_ranks_of` where the release has them) and the release's own
`KVEventsConfig` and endpoint parsers from `srt/disaggregation/kv_events.py` (its parents empty
packages, `runtime_context.get_parallel` and psutil stubbed, `utils/network.py` the release's
own), over a handful of server arguments, and
adds the top-level fields the release's `server_info()` sends.

    pip download --no-deps sglang==0.5.15 -d /tmp/w && unzip -q /tmp/w/sglang-0.5.15-*.whl -d /tmp/w/0.5.15
    python make_shapes.py 0.5.15=/tmp/w/0.5.15 0.5.19=/tmp/w/0.5.19 0.5.23=<site-packages>

(0.5.10's shape, which has no descriptor, is only server arguments and is written as is.)
"""

import ast
import importlib.util
import json
import os
import sys
import types
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))


def load_kv_events(root, version):
    """The release's kv_events module, its parents as empty packages and two stubbed imports."""
    for name in list(sys.modules):
        if name == "sglang" or name.startswith("sglang."):
            del sys.modules[name]
    for name in ["sglang", "sglang.srt", "sglang.srt.disaggregation", "sglang.srt.utils", "sglang.srt.arg_groups"]:
        module = types.ModuleType(name)
        module.__path__ = []
        sys.modules[name] = module
    runtime_context = types.ModuleType("sglang.srt.runtime_context")
    runtime_context.get_parallel = lambda: types.SimpleNamespace(pp_rank=0, attn_tp_rank=0, attn_cp_rank=0)
    sys.modules["sglang.srt.runtime_context"] = runtime_context
    # The release's own address parser (`parse_advertisable_tcp` uses it): plain Python over
    # pyzmq; psutil (for interface lookups it does not reach here) stubbed.
    sys.modules.setdefault("psutil", types.ModuleType("psutil"))
    network_path = os.path.join(root, "sglang/srt/utils/network.py")
    if os.path.exists(network_path):
        spec = importlib.util.spec_from_file_location("sglang.srt.utils.network", network_path)
        network = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = network
        spec.loader.exec_module(network)
    path = os.path.join(root, "sglang/srt/disaggregation/kv_events.py")
    spec = importlib.util.spec_from_file_location("sglang.srt.disaggregation.kv_events", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def function_source(path, name, in_class=None):
    """The source of function `name` (a method of `in_class` when given) in `path`."""
    text = open(path).read()
    tree = ast.parse(text)
    nodes = tree.body
    if in_class:
        nodes = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == in_class).body
    node = next(n for n in nodes if isinstance(n, ast.FunctionDef) and n.name == name)
    source = ast.get_source_segment(text, node)
    lines = source.splitlines()
    indent = len(lines[0]) - len(lines[0].lstrip())
    return "\n".join(line[indent:] if line.strip() else line for line in lines)


def descriptor(root, version, args):
    """`describe_kv_events_publisher(args)` as the release computes it."""
    load_kv_events(root, version)
    srt = os.path.join(root, "sglang/srt")
    namespace = {"Any": Any, "Optional": Optional}
    if version == "0.5.15":
        exec(function_source(os.path.join(srt, "server_args.py"), "describe_kv_events_publisher", "ServerArgs"), namespace)
        return namespace["describe_kv_events_publisher"](args)
    overrides = types.ModuleType("sglang.srt.arg_groups.overrides")
    overrides.Any = Any
    exec(function_source(os.path.join(srt, "arg_groups/overrides.py"), "kv_event_block_size_of"), overrides.__dict__)
    overrides.resolving_view = lambda cfg: cfg
    sys.modules[overrides.__name__] = overrides
    runtime = open(os.path.join(srt, "runtime_context.py")).read()
    if "def num_dp_ranks_of" in runtime:
        exec(function_source(os.path.join(srt, "runtime_context.py"), "num_dp_ranks_of"), namespace)
    exec(function_source(os.path.join(srt, "runtime_context.py"), "describe_kv_events_publisher"), namespace)
    return namespace["describe_kv_events_publisher"](args)


COMMON = {
    "model_path": "Qwen/Qwen3-0.6B",
    "tokenizer_path": "Qwen/Qwen3-0.6B",
    "host": "0.0.0.0",
    "port": 30000,
    "tp_size": 1,
    "pp_size": 1,
    "mem_fraction_static": 0.88,
    "chunked_prefill_size": 8192,
    "enable_metrics": True,
    "disable_radix_cache": False,
    "served_model_name": "Qwen/Qwen3-0.6B",
    "random_seed": 42,
}
STATE = {"internal_states": [{"last_gen_throughput": 0.0, "memory_usage": {"weight": 1.2, "kvcache": 60.1}}]}

# name, release, server arguments (beyond COMMON), extra top-level fields
CASES = [
    (
        "0.5.15.json",
        "0.5.15",
        {
            "page_size": 32,
            "dp_size": 1,
            "enable_dp_attention": False,
            "kv_events_config": json.dumps(
                {"publisher": "zmq", "endpoint": "tcp://*:7000", "replay_endpoint": "tcp://*:7001", "buffer_steps": 10000}
            ),
        },
        {},
    ),
    (
        "0.5.19.json",
        "0.5.19",
        {
            "page_size": 8,
            "dp_size": 2,
            "dcp_size": 1,
            "enable_dp_attention": True,
            "load_publish_endpoint": None,
            "kv_events_config": json.dumps(
                {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5570", "topic": "kv"}
            ),
        },
        {"startup_time": 1733200000.5},
    ),
    (
        "0.5.19-no-publisher.json",
        "0.5.19",
        {"page_size": 1, "dp_size": 1, "dcp_size": 1, "enable_dp_attention": False, "kv_events_config": None},
        {"startup_time": 1733200000.5},
    ),
    (
        "0.5.23-dp-attention.json",
        "0.5.23",
        {
            "page_size": 32,
            "dp_size": 1,
            "attn_dp_size": 4,
            "dcp_size": 2,
            "enable_dp_attention": True,
            "load_publish_endpoint": None,
            "kv_events_config": json.dumps(
                {
                    "publisher": "zmq",
                    "endpoint": "tcp://*:5557",
                    "replay_endpoint": "tcp://*:5600",
                    "topic": "",
                    "format": "dynamo",
                }
            ),
        },
        {
            "launch_command": "python -m sglang.launch_server --model-path Qwen/Qwen3-0.6B --page-size 32 "
            "--dp-size 4 --enable-dp-attention --dcp-size 2 --kv-events-config ...",
            "startup_time": 1733200000.5,
            "frontend": "python",
        },
    ),
]


def main():
    roots = dict(arg.split("=", 1) for arg in sys.argv[1:])
    for name, version, args, extra in CASES:
        if version not in roots:
            print(f"skipping {name}: no {version}=<root> given")
            continue
        server_args = {**COMMON, **args}
        kv_events = descriptor(roots[version], version, types.SimpleNamespace(**server_args))
        body = {**server_args, "max_total_num_tokens": 401920, **extra, **STATE, "version": version, "kv_events": kv_events}
        with open(os.path.join(HERE, name), "w") as f:
            f.write(json.dumps(body, indent=1) + "\n")
        print(f"wrote {name}: kv_events = {json.dumps(kv_events)}")


if __name__ == "__main__":
    main()
