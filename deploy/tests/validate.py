"""Offline validation of rendered kvindex manifests (kubectl kustomize / the Helm chart).

Why: a layout that renders is not yet one the API server accepts. Every object is checked here
without a cluster:
- Kubernetes' own kinds against the OpenAPI schemas kubernetes-validate ships (strict: an
  unknown field is an error, as with `kubectl apply --validate=strict`);
- the custom resources (InferencePool, EnvoyExtensionPolicy, EnvoyFilter) against
  deploy/tests/crd-schemas/ (and, with --upstream-crds DIR, against the upstream CRD files);
- what the API server or the controllers would reject or silently ignore: a Deployment whose
  selector does not match its pod template, a Service or PodDisruptionBudget selecting no pod of
  the render (unless annotated kvindex.io/selects-external: "true": it selects the pods of an
  existing EPP that a patch adds labels to), an embedded Envoy/Prometheus YAML that does not parse;
- with --bin-dir DIR: every `--flag` given to kvindex, kvindex-router and kvindex-tokenizer is
  one the binary's `serve --help` lists.

Usage: validate.py [--k8s-version 1.32.0] [--bin-dir DIR] [--upstream-crds DIR] FILE|- ...
       validate.py --self-test        (the checks reject broken objects)
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
CRD_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool.json",
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyExtensionPolicy"): "envoyextensionpolicy.json",
    ("networking.istio.io/v1alpha3", "EnvoyFilter"): "envoyfilter.json",
}
BINARIES = ("kvindex", "kvindex-router", "kvindex-tokenizer")
# Flags of Kubernetes pod discovery (issue 14), added to kvindex serve and kvindex-router on the
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


def validate(docs, k8s_version, bin_dir=None, upstream_crds=None):
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
            sel = (spec.get("selector") or {}).get("matchLabels")
            labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if not sel or not selects(sel, labels):
                problems.append(f"{where}: selector {sel} does not match its pod template's labels {labels}")
            if bin_dir:
                check_flags(doc, bin_dir, problems)
        if kind in ("Service", "PodDisruptionBudget"):
            sel = spec.get("selector") or {}
            sel = sel.get("matchLabels", sel) if kind == "PodDisruptionBudget" else sel
            hit = [d for d, t in templates if selects(sel, (t.get("metadata") or {}).get("labels") or {})]
            external = ((doc.get("metadata") or {}).get("annotations") or {}).get("kvindex.io/selects-external") == "true"
            if sel and not hit and not external:
                problems.append(f"{where}: selector {sel} matches no pod template of this render")
        if kind == "ConfigMap":
            for k, v in (doc.get("data") or {}).items():
                if k.endswith((".yaml", ".yml")):
                    try:
                        yaml.safe_load(v)
                    except yaml.YAMLError as err:
                        problems.append(f"{where}: data[{k}] is not YAML: {err}")
    return problems


def self_test(k8s_version, bin_dir=None):
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
    if bin_dir:
        d = copy.deepcopy(deployment)
        d["spec"]["template"]["spec"]["containers"][0].update(
            command=["kvindex"], args=["serve", "--grpc-addr=0.0.0.0:1", "--no-such-flag=1"]
        )
        broken.append(("unknown kvindex flag", d))
    failures = [what for what, obj in broken if not validate([(what, deployment), (what, obj)], k8s_version, bin_dir)]
    if failures:
        raise SystemExit(f"self-test: these broken objects were accepted: {failures}")
    print(f"self-test: {len(broken)} broken objects rejected, valid ones accepted")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs", nargs="*")
    ap.add_argument("--k8s-version", default="1.32.0")
    ap.add_argument("--bin-dir")
    ap.add_argument("--upstream-crds")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test(a.k8s_version, a.bin_dir)
        return
    docs = load_docs(a.inputs)
    if not docs:
        raise SystemExit("validate.py: no objects in the input")
    problems = validate(docs, a.k8s_version, a.bin_dir, a.upstream_crds)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(f"validate.py: {len(problems)} problem(s) in {len(docs)} objects")
    kinds = sorted({d['kind'] for _, d in docs})
    print(f"valid: {len(docs)} objects ({', '.join(kinds)})")


if __name__ == "__main__":
    main()
