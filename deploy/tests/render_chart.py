"""Renders deploy/helm/kvindex with Helm's own engine and validates every object.

Why: no Helm binary (and no Go toolchain) is reachable from this project's package registries.
helm-python-sdk (PyPI) ships libhelm_c, a C ABI over Helm v4's Go SDK, loaded with ctypes: the
chart goes through Helm's real loader, template engine (text/template + Sprig), values
coalescing, values.schema.json validation and linter, offline. Its limits: `lookup` returns
nothing and no cluster capabilities are discovered (.Capabilities are Helm's defaults), as with
`helm template`.

For the default values, every file in examples/ and each layout with every optional part off: lint (strict), validate the values against
values.schema.json, render, then run validate.py on the objects (with the admin token required
wherever the values leave it on, its default). The epp-sidecar patch that the
chart ships in a ConfigMap is applied to a stand-in EPP Deployment and validated as well, so its
containers (flags included) are checked like the rest; kubectl applies it (`patch --local`). Values that break the schema must be
refused (a self-check that the schema is enforced).

With --envoy PATH, every Envoy config a render carries also passes `envoy --mode validate`, and
each layout that ships one is checked to carry it.

Usage: render_chart.py [--bin-dir DIR] [--upstream-crds DIR] [--out DIR] [--kubectl PATH] [--envoy PATH]
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import yaml

import helm_python as helm

HERE = pathlib.Path(__file__).resolve().parent
CHART = HERE.parent / "helm" / "kvindex"
sys.path.insert(0, str(HERE))
import validate  # noqa: E402

STAND_IN_EPP = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "stand-in-epp"},
    "spec": {
        "selector": {"matchLabels": {"app": "llm-d-epp"}},
        "template": {
            "metadata": {"labels": {"app": "llm-d-epp"}},
            "spec": {"containers": [{"name": "epp", "image": "ghcr.io/llm-d/llm-d-router:v0.10.0"}]},
        },
    },
}


# Renders that carry Envoy configuration, and how much: the endpoint picker's plain Envoy
# bootstrap, the epp-sidecar's Istio EnvoyFilter (its filters around a stand-in EPP filter) or
# plain Envoy bootstrap. A render that lost one fails instead of passing with nothing validated.
ENVOY_CONFIGS = {"endpoint-picker": 1, "endpoint-picker-extras-off": 1, "epp-sidecar": 1, "epp-sidecar-extras-off": 1,
                 "epp-sidecar-envoy": 1, "epp-sidecar-envoy-gateway": 0}


# The chart's plain-Envoy bootstraps must be the overlays' (router/tests/it/envoy.rs runs those
# through a real Envoy), up to the names the chart gives its Services: render -> (overlay file,
# chart name -> overlay name).
SAME_AS_OVERLAY = {
    "endpoint-picker-extras-off": ("kustomize/overlays/endpoint-picker/envoy.yaml", {"kvindex-router": "kvindex-epp"}),
    "epp-sidecar-envoy": ("kustomize/overlays/epp-sidecar/envoy-standalone.yaml", {}),
}


def bootstrap_of(docs):
    return next(yaml.safe_load(d["data"]["envoy.yaml"]) for _, d in docs
                if d["kind"] == "ConfigMap" and "envoy.yaml" in (d.get("data") or {}))


def renamed(node, names):
    if isinstance(node, dict):
        return {k: renamed(v, names) for k, v in node.items()}
    if isinstance(node, list):
        return [renamed(v, names) for v in node]
    return names.get(node, node) if isinstance(node, str) else node


def differences(a, b, at=""):
    """Where two parsed YAML trees differ (paths), for a readable failure."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{at}[{i}]")]
    return [] if a == b else [f"{at}: {a!r} vs {b!r}"]


def apply_sidecar_patch(kubectl, patch_yaml):
    """The chart's patch applied to a stand-in EPP by kubectl's own strategic merge, offline
    (`kubectl patch --local`): the command NOTES.txt tells operators to run, minus the cluster."""
    with tempfile.TemporaryDirectory() as tmp:
        target, patch = pathlib.Path(tmp, "epp.yaml"), pathlib.Path(tmp, "patch.yaml")
        target.write_text(yaml.safe_dump(STAND_IN_EPP))
        patch.write_text(patch_yaml)
        out = subprocess.run(
            [kubectl, "patch", "--local", "-f", str(target), "--type", "strategic", "--patch-file", str(patch), "-o", "json"],
            capture_output=True, text=True, check=True,
        ).stdout
    return json.loads(out)


def render(chart, values, name, kubectl):
    chart.validate_schema(values)
    manifests = chart.render(values=values, name="kvindex", namespace="llm")
    docs = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((f"{name}:{path.split('/', 1)[1]}", doc))
    for src, doc in list(docs):
        if doc["kind"] == "ConfigMap" and "patch.yaml" in (doc.get("data") or {}):
            patched = apply_sidecar_patch(kubectl, doc["data"]["patch.yaml"])
            docs.append((f"{src}[patch applied to a stand-in EPP]", patched))
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir")
    ap.add_argument("--upstream-crds")
    ap.add_argument("--out", help="write each rendering here as <name>.yaml")
    ap.add_argument("--kubectl", default="kubectl", help="applies the epp-sidecar patch (strategic merge)")
    ap.add_argument("--envoy", help="Envoy's binary: `envoy --mode validate` on every Envoy config rendered")
    a = ap.parse_args()

    report = helm.lint(str(CHART), strict=True)
    errors = [m for m in report["messages"] if m["severity"] >= 2] + [{"error": e} for e in report["errors"]]
    if errors:
        raise SystemExit(f"helm lint: {errors}")

    chart = helm.Chart.load(str(CHART))
    extras_off = {"metrics": {"podAnnotations": False, "scrapeConfig": False}, "networkPolicy": {"enabled": False},
                  "tokenizer": {"enabled": False}, "indexer": {"podDisruptionBudget": {"enabled": False}},
                  "router": {"podDisruptionBudget": {"enabled": False}}, "engines": {"pythonHashSeed": ""}}
    cases = [("default", {})]
    cases += [(f"{layout}-extras-off", dict(extras_off, layout=layout, eppSidecar={"renderEpp": True}))
              for layout in ("standalone", "endpoint-picker", "epp-sidecar")]
    cases += [(p.stem, yaml.safe_load(p.read_text()) or {}) for p in sorted((CHART / "examples").glob("*.yaml"))]
    problems = []
    for name, values in cases:
        try:
            docs = render(chart, values, name, a.kubectl)
        except helm.HelmError as err:
            problems.append(f"{name}: {err}")
            continue
        if a.out:
            pathlib.Path(a.out).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(a.out) / f"{name}.yaml").write_text(yaml.safe_dump_all([d for _, d in docs], sort_keys=False))
        counts = {}
        token_on = (values.get("adminToken") or {}).get("enabled", True)
        found = validate.validate(docs, "1.32.0", a.bin_dir, a.upstream_crds, a.envoy, counts, require_admin_token=token_on)
        problems += found
        if a.envoy and name in ENVOY_CONFIGS and counts.get("envoy", 0) != ENVOY_CONFIGS[name]:
            problems.append(f"{name}: {counts.get('envoy', 0)} Envoy configs validated by Envoy, {ENVOY_CONFIGS[name]} expected")
        if name in SAME_AS_OVERLAY:
            path, names = SAME_AS_OVERLAY[name]
            overlay = next(d for d in yaml.safe_load_all((HERE.parent / path).read_text()) if d and d["kind"] == "ConfigMap")
            diff = differences(renamed(bootstrap_of(docs), names), yaml.safe_load(overlay["data"]["envoy.yaml"]))
            if diff:
                problems.append(f"{name}: the chart's Envoy bootstrap differs from {path}: {diff[:5]}")
        kinds = sorted({d["kind"] for _, d in docs})
        envoy = f", {counts.get('envoy', 0)} Envoy configs valid to Envoy" if a.envoy else ""
        print(f"{name}: {len(docs)} objects ({', '.join(kinds)}){envoy}{' INVALID' if found else ''}")

    for bad in ({"layout": "sidecar"}, {"blockSize": 0}, {"indexer": {"replicas": "two"}}, {"no_such_key": 1},
                {"endpointPicker": {"inferencePool": {"failureMode": "FailSometimes"}}}):
        try:
            chart.validate_schema(bad)
        except helm.HelmValuesError:
            continue
        problems.append(f"values.schema.json accepted invalid values {bad}")

    # Values the schema cannot judge but the templates must refuse, each with its reason.
    for bad, reason in (({"engines": {"dpSize": 2}}, "must be at least engines.dpSize (2) apart"),
                        ({"layout": "epp-sidecar", "engines": {"dpSize": 2, "replayPort": 6557}},
                         "epp-sidecar with engines.dpSize > 1 is not supported"),
                        ({"layout": "epp-sidecar", "eppSidecar": {"renderEpp": True, "epp": {"replicas": 2}}},
                         "cannot feed more than one replica"),
                        ({"adminToken": {"enabled": False}}, "bootstrapFromSiblings with indexer.replicas > 1 needs adminToken.enabled")):
        try:
            render(chart, bad, "refused", a.kubectl)
            problems.append(f"the chart rendered inconsistent values {bad}")
        except helm.HelmError as err:
            if reason not in str(err):
                problems.append(f"the chart refused {bad} without saying why ({reason!r}): {err}")

    if problems:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(f"render_chart.py: {len(problems)} problem(s)")
    print(f"chart: lint clean, {len(cases)} value sets rendered and valid, 5 invalid value sets refused, 4 inconsistent value sets refused")


if __name__ == "__main__":
    main()
