"""Offline validation of rendered kvindex manifests (kubectl kustomize / the Helm chart).

Why: a layout that renders is not yet one the API server accepts. Every object is checked here
without a cluster:
- Kubernetes' own kinds against the OpenAPI schemas kubernetes-validate ships (strict: an
  unknown field is an error, as with `kubectl apply --validate=strict`);
- the custom resources (InferencePool, EnvoyExtensionPolicy, EnvoyFilter) against
  deploy/tests/crd-schemas/ (and, with --upstream-crds DIR, against the upstream CRD files);
- the Envoy configuration they carry (bootstraps in ConfigMaps, the HTTP filters an EnvoyFilter
  inserts or merges) against Envoy's own published protos (envoy-data-plane, the package the
  router's ext_proc tests use as their independent gateway): an unknown field, a wrong type or
  an enum value Envoy does not have is an error; with --envoy PATH, Envoy's own
  `envoy --mode validate` on each as well (envoy_validate.py: what only Envoy knows, such as a
  filter without its typed_config or a cluster that does not exist);
- kvindex containers riding in another workload's pod (the EPP) carrying a readiness probe: a
  pod is ready only when every container is, and the fail-open pre-filter must never take the
  EPP out of its Service;
- a `kvindex serve` or `kvindex-router serve` container whose HTTP probes do not go to its own
  probe listener (`--probe-addr`): on `--http-addr` any client can fill the port the kubelet
  probes;
- what the API server or the controllers would reject or silently ignore: a Deployment whose
  selector does not match its pod template, a Service or PodDisruptionBudget selecting no pod of
  the render (unless annotated kvindex.io/selects-external: "true": it selects the pods of an
  existing EPP that a patch adds labels to, or the engines, which the chart need not render), an embedded Envoy/Prometheus YAML that does not parse;
- when engines (vLLM) and kvindex are rendered together, that they agree: block size (the
  engines' a multiple of the index's), PYTHONHASHSEED and hash algorithm (the indexer's
  cross-check), model, serving port (topic, discovery, InferencePool), the KV-event ports
  (discovery's or the central SUB's Service), the discovery label selector and the
  InferencePool selector matching the engine pods;
- with --bin-dir DIR: every `--flag` given to kvindex, kvindex-router and kvindex-tokenizer is
  one the binary's `serve --help` lists;
- with --require-admin-token: every indexer (`--admin-token-file`) and router
  (`--indexer-admin-token-file`) reads the admin token from a Secret of the render that holds
  the key (the chart's and the overlays' default: without it registration and RecordRoute are
  off).

Usage: validate.py [--k8s-version 1.32.0] [--bin-dir DIR] [--upstream-crds DIR] [--envoy PATH] [--require-admin-token] FILE|- ...
       validate.py --self-test [--envoy PATH]   (the checks reject broken objects)
Exit status 1 with every problem listed, 0 with a one-line summary per input.
"""

import argparse
import copy
import json
import pathlib
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import envoy_validate  # noqa: E402
CRD_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool.json",
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyExtensionPolicy"): "envoyextensionpolicy.json",
    ("networking.istio.io/v1alpha3", "EnvoyFilter"): "envoyfilter.json",
}
BINARIES = ("kvindex", "kvindex-router", "kvindex-tokenizer")
# Flags of Kubernetes pod discovery, added to kvindex serve and kvindex-router on the
# `disco` branch. Until a binary knows `--discovery`, these names are accepted for it; once it
# does, every one is checked like any other flag.
DISCOVERY_FLAGS = {
    "--discovery",
    "--discovery-namespace",
    "--discovery-label-selector",
    "--discovery-pub-port",
    "--discovery-replay-port",
    "--discovery-http-port",
    "--discovery-dp-size",
    "--discovery-model",
}


def load_docs(paths):
    """(source name, object) for every non-empty YAML document of the inputs."""
    out = []
    for p in paths:
        text = sys.stdin.read() if p == "-" else pathlib.Path(p).read_text()
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append((p, doc))
    return out


def name_of(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def pod_templates(docs):
    for _, d in docs:
        if d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            yield d, ((d.get("spec") or {}).get("template") or {})


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def crd_schema_from_upstream(upstream_dir, api_version, kind):
    group, version = api_version.split("/")
    for f in sorted(pathlib.Path(upstream_dir).glob("*.yaml")):
        for crd in yaml.safe_load_all(f.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            if spec["group"] != group or spec["names"]["kind"] != kind:
                continue
            for v in spec["versions"]:
                if v["name"] == version:
                    return v["schema"]["openAPIV3Schema"]
    return None


def help_flags(bin_dir, binary, cache={}):
    if binary not in cache:
        exe = pathlib.Path(bin_dir) / binary
        if not exe.exists():
            raise SystemExit(f"validate.py: {exe} not found (build it: cargo build --bins)")
        text = subprocess.run([str(exe), "serve", "--help"], capture_output=True, text=True, check=True).stdout
        flags = set()
        for line in text.splitlines():
            for word in line.replace(",", " ").split():
                if word.startswith("--") and len(word) > 2:
                    flags.add(word.split("=")[0].split("<")[0])
        cache[binary] = flags
    return cache[binary]


def check_flags(doc, bin_dir, problems):
    spec = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        command = c.get("command") or []
        if not command or pathlib.PurePath(command[0]).name not in BINARIES:
            continue
        binary = pathlib.PurePath(command[0]).name
        args = c.get("args") or []
        if not args or args[0] != "serve":
            problems.append(f"{name_of(doc)} container {c['name']}: {binary} must run `serve`, got {args[:1]}")
            continue
        known = help_flags(bin_dir, binary)
        pending = DISCOVERY_FLAGS if "--discovery" not in known else set()
        for a in args[1:]:
            if not a.startswith("--"):
                continue
            flag = a.split("=", 1)[0]
            if flag not in known and flag not in pending:
                problems.append(f"{name_of(doc)} container {c['name']}: {binary} serve has no flag {flag}")


ENVOY_MODULES = (
    "envoy.config.bootstrap.v3",
    "envoy.extensions.filters.network.http_connection_manager.v3",
    "envoy.extensions.filters.http.ext_proc.v3",
    "envoy.extensions.filters.http.router.v3",
    "envoy.extensions.upstreams.http.v3",
    "envoy.extensions.load_balancing_policies.override_host.v3",
    "envoy.extensions.load_balancing_policies.least_request.v3",
    "envoy.extensions.access_loggers.filters.cel.v3",
)


def envoy_messages():
    """Envoy's Bootstrap and HttpFilter messages, with the typed_config types we use registered."""
    import importlib

    mods = [importlib.import_module("envoy_data_plane." + m) for m in ENVOY_MODULES]
    return mods[0].Bootstrap, mods[1].HttpFilter


def unpack_all(message):
    """Decodes every nested google.protobuf.Any (typed_config), which checks its contents too."""
    if hasattr(message, "type_url") and hasattr(message, "unpack"):
        unpack_all(message.unpack())
        return
    for name in getattr(message, "__dataclass_fields__", {}):
        value = getattr(message, name, None)
        for v in value if isinstance(value, list) else (value.values() if isinstance(value, dict) else [value]):
            if hasattr(v, "__dataclass_fields__"):
                unpack_all(v)


def check_envoy(where, doc, problems):
    if "envoy.yaml" not in (doc.get("data") or {}) and doc.get("kind") != "EnvoyFilter":
        return  # Envoy's protos take a second or two of CPU to import: only when needed
    bootstrap, http_filter = envoy_messages()
    if doc.get("kind") == "ConfigMap":
        for key, text in (doc.get("data") or {}).items():
            if key == "envoy.yaml":
                try:
                    unpack_all(bootstrap.from_dict(yaml.safe_load(text)))
                except Exception as err:  # betterproto raises KeyError/ValueError/TypeError
                    problems.append(f"{where}: data[{key}] is not a valid Envoy bootstrap: {type(err).__name__}: {err}")
    if doc.get("kind") == "EnvoyFilter":
        for i, patch in enumerate((doc.get("spec") or {}).get("configPatches") or []):
            if patch.get("applyTo") == "HTTP_FILTER" and "value" in (patch.get("patch") or {}):
                try:
                    unpack_all(http_filter.from_dict(patch["patch"]["value"]))
                except Exception as err:
                    problems.append(f"{where}: configPatches[{i}] is not a valid Envoy HttpFilter: {type(err).__name__}: {err}")


def containers(doc):
    spec = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    labels = (((doc.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
    annotations = (((doc.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {}
    for c in spec.get("containers") or []:
        yield c, labels, annotations


def expand(value, env):
    """Kubernetes' $(VAR) expansion of args, from the container's literal env values."""
    for k, v in env.items():
        value = value.replace(f"$({k})", v)
    return value


def flag_values(args, env):
    """--flag=value and --flag value pairs (the last wins), expanded."""
    out = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                k, v = a, args[i + 1]
            else:
                k, v = a, ""
            out[k] = expand(v, env)
    return out


# Flags that name a file or directory the binary reads or writes: each must lie under one of
# its container's volume mounts (the image's root filesystem is read-only), writable where
# the binary writes.
PATH_FLAGS = {
    "--admin-token-file": "read",
    "--indexer-admin-token-file": "read",
    "--snapshot-dir": "write",
}


def check_probe_port(where, doc, problems):
    """`kvindex serve`'s and `kvindex-router serve`'s HTTP probes go to its `--probe-addr` port (by
    number or port name)."""
    for c, _, _ in containers(doc):
        binary = pathlib.PurePath((c.get("command") or [""])[0]).name
        if binary not in ("kvindex", "kvindex-router") or (c.get("args") or [""])[0] != "serve":
            continue
        probes = [k for k in ("readinessProbe", "livenessProbe", "startupProbe") if "httpGet" in (c.get(k) or {})]
        if not probes:
            continue
        env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
        addr = flag_values(c.get("args") or [], env).get("--probe-addr")
        if not addr:
            problems.append(f"{where}: {c['name']} is probed over HTTP without --probe-addr: "
                            "clients of --http-addr can fill the port the kubelet probes")
            continue
        named = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
        for k in probes:
            port = c[k]["httpGet"].get("port")
            port = named.get(port, port) if isinstance(port, str) else port
            if str(port) != addr.rsplit(":", 1)[-1]:
                problems.append(f"{where}: {c['name']}'s {k} probes port {port}, not --probe-addr {addr}")


def check_mounts(where, doc, problems):
    """Every volumeMount names a volume of its pod; every path flag lies under a mount."""
    spec = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    for c, _, _ in containers(doc):
        mounts = c.get("volumeMounts") or []
        for m in mounts:
            if m.get("name") not in volumes:
                problems.append(f"{where}: container {c['name']} mounts {m.get('name')!r}, which is not a volume of its pod")
        env = {e["name"]: str(e["value"]) for e in c.get("env") or [] if "value" in e}
        for flag, value in flag_values(c.get("args") or [], env).items():
            use = PATH_FLAGS.get(flag)
            if use is None:
                continue
            under = [m for m in mounts if value == m.get("mountPath") or value.startswith(m.get("mountPath", "").rstrip("/") + "/")]
            if not under:
                problems.append(f"{where}: container {c['name']}: {flag}={value} is under no volume mount (read-only root filesystem)")
            elif use == "write" and all(m.get("readOnly") for m in under):
                problems.append(f"{where}: container {c['name']}: {flag}={value} is on a read-only mount")


def admin_token_source(doc, c, flag):
    """(secret name, key) a container reads its token flag from, or None."""
    spec = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    value = flag_values(c.get("args") or [], {}).get(flag)
    if not value:
        return None
    for m in c.get("volumeMounts") or []:
        base = m.get("mountPath", "").rstrip("/") + "/"
        secret = (volumes.get(m.get("name")) or {}).get("secret")
        if value.startswith(base) and secret:
            return secret.get("secretName"), value[len(base):]
    return None


def coherence(docs):
    """Engines and kvindex in one render must agree (see the module doc)."""
    problems = []
    engines, indexers, routers = [], [], []
    for _, doc in docs:
        if doc.get("kind") != "Deployment":
            continue
        for c, labels, annotations in containers(doc):
            env = {e["name"]: str(e["value"]) for e in c.get("env") or [] if "value" in e}
            cmd = pathlib.PurePath((c.get("command") or [""])[0]).name
            args = c.get("args") or []
            entry = (name_of(doc), c, labels, annotations, env, flag_values(args, env), args)
            if cmd == "vllm":
                engines.append(entry)
            elif cmd == "kvindex":
                indexers.append(entry)
            elif cmd == "kvindex-router":
                routers.append(entry)
    if not engines or not (indexers or routers):
        return problems
    services = {d["metadata"]["name"]: d for _, d in docs if d.get("kind") == "Service"}
    for ename, c, labels, annotations, env, ef, args in engines:
        model = args[1] if len(args) > 1 and args[0] == "serve" else None
        port = ef.get("--port", "8000")
        block = int(ef.get("--block-size", "16"))
        try:
            kv = json.loads(ef.get("--kv-events-config", "{}").replace("$(POD_IP)", "10.0.0.1"))
        except json.JSONDecodeError as err:
            problems.append(f"{ename}: --kv-events-config is not JSON: {err}")
            continue
        for key, want in (("enable_kv_cache_events", True), ("publisher", "zmq")):
            if kv.get(key) != want:
                problems.append(f"{ename}: kv-events-config {key} must be {want!r}, got {kv.get(key)!r}")
        topic = kv.get("topic", "")
        parts = topic.split("@")
        if len(parts) != 3 or parts[0] != "kv" or parts[1] != f"10.0.0.1:{port}" or parts[2] != model:
            problems.append(f"{ename}: topic {topic!r} must be kv@$(POD_IP):{port}@{model}")
        for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details"):
            if flag not in ef:
                problems.append(f"{ename}: missing {flag}")
        endpoint, replay = kv.get("endpoint", ""), kv.get("replay_endpoint", "")
        for iname, ic, _, _, ienv, f, _ in indexers + routers:
            who = f"{ename} vs {iname}/{ic['name']}"
            if "--block-size" in f and block % int(f["--block-size"]):
                problems.append(f"{who}: engine block size {block} is not a multiple of {f['--block-size']}")
            if "--discovery-model" in f and annotations.get("kvindex.io/model", model) != f["--discovery-model"]:
                problems.append(f"{who}: model {model} vs --discovery-model {f['--discovery-model']}")
            if "--model" in f and f["--model"] != model:
                problems.append(f"{who}: model {model} vs --model {f['--model']}")
            if "--discovery-http-port" in f and f["--discovery-http-port"] != port:
                problems.append(f"{who}: serving port {port} vs --discovery-http-port {f['--discovery-http-port']}")
            if "--discovery-label-selector" in f:
                sel = dict(kv_.split("=", 1) for kv_ in f["--discovery-label-selector"].split(","))
                if not selects(sel, labels):
                    problems.append(f"{who}: --discovery-label-selector {sel} does not select the engine pods {labels}")
            if "--hash-seed" in f and env.get("PYTHONHASHSEED") != f["--hash-seed"]:
                problems.append(f"{who}: engine PYTHONHASHSEED {env.get('PYTHONHASHSEED')!r} vs --hash-seed {f['--hash-seed']!r}")
            if "--hash-algo" in f and ef.get("--prefix-caching-hash-algo") != f["--hash-algo"]:
                problems.append(f"{who}: engine hash {ef.get('--prefix-caching-hash-algo')} vs --hash-algo {f['--hash-algo']}")
            if "--discovery-pub-port" in f and endpoint != f"tcp://*:{f['--discovery-pub-port']}":
                problems.append(f"{who}: engine endpoint {endpoint!r}: discovery dials port {f['--discovery-pub-port']}, the engine must bind it")
            if "--discovery-replay-port" in f and replay != f"tcp://*:{f['--discovery-replay-port']}":
                problems.append(f"{who}: engine replay endpoint {replay!r} vs --discovery-replay-port {f['--discovery-replay-port']}")
            if "--zmq-bind" in f:
                bind_port = f["--zmq-bind"].rsplit(":", 1)[-1]
                host, _, svc_port = endpoint.removeprefix("tcp://").rpartition(":")
                svc = services.get(host.split(".")[0])
                if svc is None or not any(str(p.get("port")) == svc_port and str(p.get("targetPort", p.get("port"))) == bind_port
                                          for p in svc["spec"].get("ports", [])):
                    problems.append(f"{who}: engine endpoint {endpoint!r} does not reach the central SUB (--zmq-bind port {bind_port}) through a Service of this render")
    for _, doc in docs:
        if doc.get("kind") == "InferencePool":
            sel = doc["spec"]["selector"]["matchLabels"]
            pool_ports = {str(p["number"]) for p in doc["spec"]["targetPorts"]}
            for ename, c, labels, annotations, env, ef, args in engines:
                if not selects(sel, labels):
                    problems.append(f"{name_of(doc)}: selector {sel} does not select {ename}'s pods")
                elif ef.get("--port", "8000") not in pool_ports:
                    problems.append(f"{name_of(doc)}: targetPorts {pool_ports} miss {ename}'s --port")
    return problems


def validate(docs, k8s_version, bin_dir=None, upstream_crds=None, envoy=None, counts=None, require_admin_token=False):
    """Every problem found; `counts["envoy"]` (when given) counts what Envoy itself validated."""
    problems = []
    templates = list(pod_templates(docs))
    for src, doc in docs:
        where = f"{src}: {name_of(doc)}"
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key in CRD_SCHEMAS:
            schema = json.loads((HERE / "crd-schemas" / CRD_SCHEMAS[key]).read_text())
            for err in jsonschema.Draft7Validator(schema).iter_errors(doc):
                problems.append(f"{where}: {'/'.join(map(str, err.absolute_path))}: {err.message}")
            if upstream_crds:
                upstream = crd_schema_from_upstream(upstream_crds, *key)
                if upstream is None:
                    problems.append(f"{where}: no upstream CRD for {key} in {upstream_crds}")
                else:
                    for err in jsonschema.Draft7Validator(upstream).iter_errors(doc):
                        problems.append(f"{where} (upstream CRD): {'/'.join(map(str, err.absolute_path))}: {err.message}")
        else:
            try:
                kubernetes_validate.validate(doc, k8s_version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{where}: no schema for {key} (neither Kubernetes' own nor in crd-schemas/)")
            except kubernetes_validate.ValidationError as err:
                path = "/".join(map(str, err.path))
                problems.append(f"{where}: {path}: {err.message}")
        kind = doc.get("kind")
        spec = doc.get("spec") or {}
        if kind == "Deployment":
            check_mounts(where, doc, problems)
            check_probe_port(where, doc, problems)
            sel = (spec.get("selector") or {}).get("matchLabels")
            labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if not sel or not selects(sel, labels):
                problems.append(f"{where}: selector {sel} does not match its pod template's labels {labels}")
            if bin_dir:
                check_flags(doc, bin_dir, problems)
            # kvindex as sidecars of another workload (the EPP): they must not gate its readiness.
            ours = [c for c, _, _ in containers(doc) if pathlib.PurePath((c.get("command") or [""])[0]).name in BINARIES]
            if ours and len(ours) < len(list(containers(doc))):
                for c in ours:
                    if "readinessProbe" in c:
                        problems.append(f"{where}: sidecar {c['name']} has a readinessProbe: it would take the host pod out of its Service")
        if kind in ("Service", "PodDisruptionBudget"):
            sel = spec.get("selector") or {}
            sel = sel.get("matchLabels", sel) if kind == "PodDisruptionBudget" else sel
            hit = [d for d, t in templates if selects(sel, (t.get("metadata") or {}).get("labels") or {})]
            external = ((doc.get("metadata") or {}).get("annotations") or {}).get("kvindex.io/selects-external") == "true"
            if sel and not hit and not external:
                problems.append(f"{where}: selector {sel} matches no pod template of this render")
        if kind in ("ConfigMap", "EnvoyFilter"):
            check_envoy(where, doc, problems)
            for label, bootstrap in envoy_validate.bootstraps(where, doc) if envoy else ():
                said = envoy_validate.check(envoy, bootstrap)
                if said:
                    problems.append(f"{label}: envoy --mode validate: {said}")
                if counts is not None:
                    counts["envoy"] = counts.get("envoy", 0) + 1
        if kind == "ConfigMap":
            for k, v in (doc.get("data") or {}).items():
                if k.endswith((".yaml", ".yml")):
                    try:
                        yaml.safe_load(v)
                    except yaml.YAMLError as err:
                        problems.append(f"{where}: data[{k}] is not YAML: {err}")
    problems += coherence(docs)
    problems += replica_coherence(docs)
    problems += token_coherence(docs)
    if require_admin_token:
        problems += admin_token_wiring(docs)
    return problems


def replica_coherence(docs):
    """`kvindex serve` run as several replicas of one Deployment: central mode (--zmq-bind)
    cannot feed them (each engine's publisher dials one endpoint, so each replica would miss the
    engines the others got); per-pod replicas start from a sibling's index (--bootstrap-from) at
    a Service of this render that selects them, on their gRPC port."""
    problems = []
    services = {d["metadata"]["name"]: d for _, d in docs if d.get("kind") == "Service"}
    for _, doc in docs:
        replicas = (doc.get("spec") or {}).get("replicas", 1)
        if doc.get("kind") != "Deployment" or not isinstance(replicas, int) or replicas <= 1:
            continue
        for c, labels, _ in containers(doc):
            args = c.get("args") or []
            if pathlib.PurePath((c.get("command") or [""])[0]).name != "kvindex" or args[:1] != ["serve"]:
                continue
            env = {e["name"]: str(e["value"]) for e in c.get("env") or [] if "value" in e}
            f = flag_values(args, env)
            where = f"{name_of(doc)} container {c['name']}"
            if "--zmq-bind" in f:
                problems.append(f"{where}: central mode (--zmq-bind) in {replicas} replicas: each engine dials one "
                                "endpoint, so every replica would miss the engines the others got")
                continue
            target = f.get("--bootstrap-from")
            if not target:
                problems.append(f"{where}: {replicas} replicas without --bootstrap-from: a new replica starts cold")
                continue
            host, _, port = target.rpartition(":")
            grpc_port = f.get("--grpc-addr", "127.0.0.1:50051").rpartition(":")[2]
            named = {p.get("name"): str(p.get("containerPort")) for p in c.get("ports") or []}
            svc = services.get(host.split(".")[0])
            if svc is None:
                problems.append(f"{where}: --bootstrap-from {target}: no Service {host} in this render")
                continue
            if not selects((svc.get("spec") or {}).get("selector") or {}, labels):
                problems.append(f"{where}: --bootstrap-from {target}: Service {host} does not select its replicas")
                continue
            reaches = any(str(sp.get("port")) == port and named.get(sp.get("targetPort"), str(sp.get("targetPort"))) == grpc_port
                          for sp in (svc.get("spec") or {}).get("ports") or [])
            if not reaches:
                problems.append(f"{where}: --bootstrap-from {target}: Service {host} port {port} does not reach --grpc-addr port {grpc_port}")
    return problems


# The flag through which each kvindex binary reads the admin token.
ADMIN_TOKEN_FLAGS = {"kvindex": "--admin-token-file", "kvindex-router": "--indexer-admin-token-file"}


def admin_token_wiring(docs):
    """Every indexer and router reads the admin token from a Secret of this render holding the key."""
    problems = []
    secrets = {}
    for _, doc in docs:
        if doc.get("kind") == "Secret":
            keys = set(doc.get("data") or {}) | set(doc.get("stringData") or {})
            secrets[(doc.get("metadata") or {}).get("name")] = keys
    for _, doc in docs:
        if doc.get("kind") != "Deployment":
            continue
        for c, _, _ in containers(doc):
            flag = ADMIN_TOKEN_FLAGS.get(pathlib.PurePath((c.get("command") or [""])[0]).name)
            if flag is None:
                continue
            source = admin_token_source(doc, c, flag)
            where = f"{name_of(doc)} container {c['name']}"
            if source is None:
                problems.append(f"{where}: no {flag} read from a Secret volume: registration and RecordRoute would be off")
            elif source[1] not in secrets.get(source[0], set()):
                problems.append(f"{where}: {flag} reads key {source[1]!r} of Secret {source[0]!r}, which this render does not hold")
    return problems


def token_coherence(docs):
    """Routers hold the indexer's admin token (RecordRoute): the same Secret and key, or none."""
    problems, indexers, routers = [], [], []
    for _, doc in docs:
        if doc.get("kind") != "Deployment":
            continue
        for c, _, _ in containers(doc):
            cmd = pathlib.PurePath((c.get("command") or [""])[0]).name
            if cmd == "kvindex":
                indexers.append((name_of(doc), admin_token_source(doc, c, "--admin-token-file")))
            elif cmd == "kvindex-router":
                routers.append((name_of(doc), admin_token_source(doc, c, "--indexer-admin-token-file")))
    for iname, itoken in indexers:
        for rname, rtoken in routers:
            if itoken != rtoken:
                problems.append(f"{rname} reads the indexer admin token from {rtoken}, {iname} from {itoken}: RecordRoute would be refused")
    return problems


def self_test(k8s_version, bin_dir=None, envoy=None):
    """Each broken object must be rejected: the validator is not a rubber stamp."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "FailOpen"},
        },
    }
    assert not validate([("ok", deployment), ("ok", pool)], k8s_version), "valid objects rejected"
    broken = []
    d = copy.deepcopy(deployment)
    d["spec"]["replicas"] = "two"
    broken.append(("wrong type", d))
    d = copy.deepcopy(deployment)
    d["spec"]["template"]["spec"]["containers"][0]["argz"] = ["serve"]
    broken.append(("unknown field", d))
    d = copy.deepcopy(deployment)
    d["spec"]["selector"]["matchLabels"] = {"app": "y"}
    broken.append(("selector mismatch", d))
    p = copy.deepcopy(pool)
    p["spec"]["endpointPickerRef"]["failureMode"] = "FailSometimes"
    broken.append(("failureMode", p))
    p = copy.deepcopy(pool)
    del p["spec"]["endpointPickerRef"]["port"]
    broken.append(("picker Service without port", p))
    p = copy.deepcopy(pool)
    p["spec"]["targetPorts"] = []
    broken.append(("no target ports", p))
    broken.append(("unknown kind", {"apiVersion": "example.com/v1", "kind": "Nope", "metadata": {"name": "n"}}))
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
           "spec": {"selector": {"app": "nobody"}, "ports": [{"port": 1}]}}
    broken.append(("service selecting nothing", svc))
    bootstrap = {"static_resources": {"clusters": [{"name": "pool", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                 "original_dst_lb_config": {"use_http_header": True, "http_header_name": "x-gateway-destination-endpoint"}}]}}
    assert not validate([("ok", deployment), ("ok", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e"},
                        "data": {"envoy.yaml": yaml.safe_dump(bootstrap)}})], k8s_version), "valid Envoy bootstrap rejected"
    engine = copy.deepcopy(deployment)
    engine["spec"]["template"]["metadata"]["labels"]["llm-d.ai/inference-serving"] = "true"
    engine["spec"]["template"]["spec"]["containers"][0].update(
        command=["vllm"],
        args=["serve", "m", "--port=8000", "--block-size=16", "--enable-prefix-caching", "--enable-prompt-tokens-details",
              "--kv-events-config", '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557",'
              '"replay_endpoint":"tcp://*:5558","topic":"kv@$(POD_IP):8000@m"}'],
        env=[{"name": "PYTHONHASHSEED", "value": "0"}])
    indexer = copy.deepcopy(deployment)
    indexer["metadata"]["name"] = "i"
    indexer["spec"]["template"]["spec"]["containers"][0].update(
        command=["kvindex"], args=["serve", "--block-size=16", "--hash-seed=0", "--discovery-model=m",
                                   "--discovery-label-selector=llm-d.ai/inference-serving=true", "--discovery-pub-port=5557"])
    assert not coherence([("ok", engine), ("ok", indexer)]), "coherent engine and indexer rejected"
    missed = []
    for what, arg in (("seed", "--hash-seed=1"), ("block size", "--block-size=32"), ("model", "--discovery-model=n"),
                      ("selector", "--discovery-label-selector=app=other"), ("pub port", "--discovery-pub-port=6000")):
        i = copy.deepcopy(indexer)
        i["spec"]["template"]["spec"]["containers"][0]["args"].append(arg)
        if not coherence([("x", engine), ("x", i)]):
            missed.append(f"incoherent {what}")
    for what, mutate in (
        ("envoy: misspelt field", lambda c: c["original_dst_lb_config"].update(use_http_headr=True)),
        ("envoy: unknown enum value", lambda c: c.update(type="ORIGINAL_DEST")),
        ("envoy: unregistered typed_config", lambda c: c.update(typed_extension_protocol_options={
            "x": {"@type": "type.googleapis.com/envoy.example.Nope"}})),
    ):
        b = copy.deepcopy(bootstrap)
        mutate(b["static_resources"]["clusters"][0])
        broken.append((what, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e"},
                              "data": {"envoy.yaml": yaml.safe_dump(b)}}))
    d = copy.deepcopy(deployment)
    d["spec"]["template"]["spec"]["containers"].append(
        {"name": "kvindex", "image": "i", "command": ["kvindex"], "args": ["serve"],
         "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9190}}})
    broken.append(("sidecar gating its host's readiness", d))
    d = copy.deepcopy(deployment)
    d["spec"]["template"]["spec"]["containers"][0].update(
        command=["kvindex"], args=["serve", "--snapshot-dir=/var/lib/kvindex/snapshots"])
    broken.append(("snapshot dir on the read-only root", d))
    for what, binary, args in (
        ("kvindex probed without a probe listener", "kvindex", ["serve", "--http-addr=0.0.0.0:9090"]),
        ("kvindex probed on its http port", "kvindex", ["serve", "--http-addr=0.0.0.0:9090", "--probe-addr=0.0.0.0:9092"]),
        ("router probed without a probe listener", "kvindex-router", ["serve", "--http-addr=0.0.0.0:9090"]),
        ("router probed on its http port", "kvindex-router",
         ["serve", "--http-addr=0.0.0.0:9090", "--probe-addr=0.0.0.0:9092"]),
    ):
        d = copy.deepcopy(deployment)
        d["spec"]["template"]["spec"]["containers"][0].update(
            command=[binary], args=args, ports=[{"name": "http", "containerPort": 9090}],
            livenessProbe={"httpGet": {"path": "/healthz", "port": "http"}})
        broken.append((what, d))
    d = copy.deepcopy(deployment)
    d["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [{"name": "gone", "mountPath": "/x"}]
    broken.append(("mount of a missing volume", d))
    d = copy.deepcopy(deployment)
    d["spec"]["template"]["spec"]["volumes"] = [{"name": "t", "secret": {"secretName": "a"}}]
    d["spec"]["template"]["spec"]["containers"] = [
        {"name": "i", "image": "i", "command": ["kvindex"], "args": ["serve", "--admin-token-file=/t/token"],
         "volumeMounts": [{"name": "t", "mountPath": "/t"}]},
        {"name": "r", "image": "i", "command": ["kvindex-router"], "args": ["serve"]}]
    broken.append(("router without the indexer's admin token", d))
    if bin_dir:
        d = copy.deepcopy(deployment)
        d["spec"]["template"]["spec"]["containers"][0].update(
            command=["kvindex"], args=["serve", "--grpc-addr=0.0.0.0:1", "--no-such-flag=1"]
        )
        broken.append(("unknown kvindex flag", d))
    if envoy:
        # What only Envoy catches (both decode into the protos), beside a chain it accepts.
        def config_map(b):
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e"}, "data": {"envoy.yaml": yaml.safe_dump(b)}}
        router = {"name": "envoy.filters.http.router",
                  "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
        ext_proc = {"name": "envoy.filters.http.ext_proc", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}}}}
        accepted = envoy_validate.around_filters([ext_proc, router])
        assert not validate([("ok", deployment), ("ok", config_map(accepted))], k8s_version, envoy=envoy), \
            "a valid chain rejected by Envoy"
        b = envoy_validate.around_filters([{"name": "envoy.filters.http.router"}])
        broken.append(("envoy: the router filter without its typed_config", config_map(b)))
        b = copy.deepcopy(accepted)
        b["static_resources"]["clusters"] = [c for c in b["static_resources"]["clusters"] if c["name"] != "inference-pool"]
        broken.append(("envoy: a route to a cluster the bootstrap lacks", config_map(b)))
        b = copy.deepcopy(accepted)
        b["static_resources"]["clusters"][0]["load_balancing_policy"] = {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                "override_host_sources": [{"header": "x-gateway-destination-endpoint"}]}}}]}
        broken.append(("envoy: override_host without its required fallback_policy", config_map(b)))
    failures = [what for what, obj in broken
                if not validate([(what, deployment), (what, obj)], k8s_version, bin_dir, envoy=envoy)]
    unwired = admin_token_self_test(deployment, k8s_version)
    lone = replica_self_test(deployment, k8s_version)
    if failures or missed or unwired or lone:
        raise SystemExit(f"self-test: these broken objects were accepted: {failures + missed + unwired + lone}")
    print(f"self-test: {len(broken)} broken objects, 5 incoherent engine/indexer pairs, 4 renders without the "
          "admin token and 4 indexer replica sets that cannot share the fleet rejected, valid ones accepted")


def replica_self_test(deployment, k8s_version):
    """Indexer replicas bootstrapping from a Service that selects them are accepted; central mode
    in two replicas, replicas without --bootstrap-from, or bootstrapping through a Service that
    does not reach them are not. Returns what it wrongly accepted."""
    d = copy.deepcopy(deployment)
    d["spec"]["replicas"] = 2
    d["spec"]["template"]["spec"]["containers"][0].update(
        command=["kvindex"], args=["serve", "--grpc-addr=0.0.0.0:50051", "--bootstrap-from=x-peers:50051"],
        ports=[{"name": "grpc", "containerPort": 50051}])
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x-peers"},
           "spec": {"clusterIP": "None", "selector": {"app": "x"}, "ports": [{"name": "grpc", "port": 50051, "targetPort": "grpc"}]}}
    assert not validate([("ok", d), ("ok", svc)], k8s_version), "replicas bootstrapping from their peers rejected"
    broken = []
    b = copy.deepcopy(d)
    b["spec"]["template"]["spec"]["containers"][0]["args"] = ["serve", "--zmq-bind=tcp://*:5557"]
    broken.append(("central mode in two replicas", [b, svc]))
    b = copy.deepcopy(d)
    b["spec"]["template"]["spec"]["containers"][0]["args"] = ["serve", "--grpc-addr=0.0.0.0:50051"]
    broken.append(("two replicas without --bootstrap-from", [b, svc]))
    other = copy.deepcopy(svc)
    other["spec"]["selector"] = {"app": "y"}
    broken.append(("bootstrap through a Service that selects other pods", [d, other]))
    other = copy.deepcopy(svc)
    other["spec"]["ports"][0]["targetPort"] = 9090
    broken.append(("bootstrap through a Service port that misses the gRPC port", [d, other]))
    return [what for what, objs in broken if not validate([(what, o) for o in objs], k8s_version)]


def admin_token_self_test(deployment, k8s_version):
    """--require-admin-token accepts the wiring the layouts ship and rejects each way to lose it;
    returns what it wrongly accepted."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}, "type": "Opaque",
              "stringData": {"token": "REPLACE-ME-with-a-random-token"}}
    wired = copy.deepcopy(deployment)
    wired["spec"]["template"]["spec"]["volumes"] = [{"name": "t", "secret": {"secretName": "a"}}]
    wired["spec"]["template"]["spec"]["containers"] = [
        {"name": "i", "image": "i", "command": ["kvindex"], "args": ["serve", "--admin-token-file=/t/token"],
         "volumeMounts": [{"name": "t", "mountPath": "/t"}]},
        {"name": "r", "image": "i", "command": ["kvindex-router"], "args": ["serve", "--indexer-admin-token-file=/t/token"],
         "volumeMounts": [{"name": "t", "mountPath": "/t"}]}]
    assert not validate([("ok", wired), ("ok", secret)], k8s_version, require_admin_token=True), "wired token rejected"
    broken = []
    d = copy.deepcopy(wired)
    for c in d["spec"]["template"]["spec"]["containers"]:
        c["args"] = ["serve"]
        del c["volumeMounts"]
    del d["spec"]["template"]["spec"]["volumes"]
    broken.append(("indexer and router without an admin token", [d, secret]))
    d = copy.deepcopy(wired)
    d["spec"]["template"]["spec"]["containers"] = d["spec"]["template"]["spec"]["containers"][:1]
    d["spec"]["template"]["spec"]["containers"][0]["args"] = ["serve"]
    broken.append(("indexer alone without an admin token", [d, secret]))
    broken.append(("the token's Secret missing from the render", [wired]))
    s = copy.deepcopy(secret)
    s["stringData"] = {"other": "x" * 16}
    broken.append(("the token's key missing from its Secret", [wired, s]))
    return [what for what, objs in broken
            if not validate([(what, o) for o in objs], k8s_version, require_admin_token=True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs", nargs="*")
    ap.add_argument("--k8s-version", default="1.32.0")
    ap.add_argument("--bin-dir")
    ap.add_argument("--upstream-crds")
    ap.add_argument("--envoy", help="Envoy's binary: `envoy --mode validate` on every Envoy config too")
    ap.add_argument("--require-admin-token", action="store_true",
                    help="every indexer and router must read the admin token from a Secret of the render")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test(a.k8s_version, a.bin_dir, a.envoy)
        return
    docs = load_docs(a.inputs)
    if not docs:
        raise SystemExit("validate.py: no objects in the input")
    counts = {}
    problems = validate(docs, a.k8s_version, a.bin_dir, a.upstream_crds, a.envoy, counts, a.require_admin_token)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(f"validate.py: {len(problems)} problem(s) in {len(docs)} objects")
    kinds = sorted({d['kind'] for _, d in docs})
    envoy = f", {counts.get('envoy', 0)} Envoy configs valid to Envoy" if a.envoy else ""
    token = ", admin token wired" if a.require_admin_token else ""
    print(f"valid: {len(docs)} objects ({', '.join(kinds)}){envoy}{token}")


if __name__ == "__main__":
    main()
